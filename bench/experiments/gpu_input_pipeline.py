"""Measure, on a real GPU node, the CPU a GPU training job's input pipeline needs per GPU,
and how that need varies over time.

    python bench/experiments/gpu_input_pipeline.py --json OUT [--quick]

Needs a CUDA GPU, torchvision and Pillow (it skips with a one-line reason otherwise).

1. *Pipeline alone*: the standard ImageNet training transform (JPEG decode,
   RandomResizedCrop 224, horizontal flip, to tensor, normalize) on synthetic JPEGs of
   ImageNet's typical size (500×375, quality 90), through a DataLoader with k workers;
   images/s and the workers' CPU seconds per image (from /proc, all worker processes).
2. *GPU alone*: ResNet-50 training steps (SGD, batch 256) on tensors already on the GPU,
   fp32 and bf16 autocast: the GPU's own images/s.
3. *End to end*: the same training fed by the pipeline with k workers; images/s per second
   and the workers' CPU use per second (cores), so the need's variation over time shows.

From 1 and 2: cores needed per GPU = GPU images/s × CPU s per image.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path


def cpu_seconds(pids: list[int]) -> float:
    tck = os.sysconf("SC_CLK_TCK")
    tot = 0.0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            tot += (int(f[11]) + int(f[12])) / tck  # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return tot


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(f[1]) == pid:
                out.append(int(d.name))
    return out


def make_jpegs(n: int, seed: int = 0) -> list[bytes]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        # smooth colour field + texture: JPEG sizes like photos (~60-120 KB at q90)
        base = rng.random((12, 16, 3))
        img = np.kron(base, np.ones((32, 32, 1)))[:375, :500]
        img = (img * 200 + rng.normal(0, 25, img.shape)).clip(0, 255).astype("uint8")
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


class JpegDataset:
    def __init__(self, blobs: list[bytes], length: int):
        import torchvision.transforms as T

        self.blobs, self.length = blobs, length
        self.tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                             T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        from PIL import Image

        img = Image.open(io.BytesIO(self.blobs[i % len(self.blobs)])).convert("RGB")
        return self.tf(img), i % 1000


def loader(ds, k: int, batch: int):
    import torch

    return torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=k, pin_memory=True,
                                       persistent_workers=False, prefetch_factor=4, shuffle=False)


def pipeline_alone(blobs, k: int, batch: int, seconds: float) -> dict:
    ds = JpegDataset(blobs, 10**7)
    it = iter(loader(ds, k, batch))
    next(it)  # workers up
    pids = children(os.getpid())
    c0, t0, n = cpu_seconds(pids), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        x, _ = next(it)
        n += x.shape[0]
    dt = time.perf_counter() - t0
    cpu = cpu_seconds(pids) - c0
    del it
    return {"workers": k, "images_per_s": n / dt, "cpu_s_per_image": cpu / n, "worker_cores_used": cpu / dt}


def gpu_alone(batch: int, seconds: float, bf16: bool) -> dict:
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        step()
        n += batch
    torch.cuda.synchronize()
    return {"precision": "bf16" if bf16 else "fp32", "images_per_s": n / (time.perf_counter() - t0)}


def end_to_end(blobs, k: int, batch: int, seconds: float, bf16: bool) -> dict:
    import torch
    import torchvision

    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    it = iter(loader(JpegDataset(blobs, 10**7), k, batch))
    next(it)
    pids = children(os.getpid())
    series = []
    t0 = last = time.perf_counter()
    c_last, n_win, n = cpu_seconds(pids), 0, 0
    while time.perf_counter() - t0 < seconds:
        x, y = next(it)
        x = x.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        y = torch.as_tensor(y).cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        n_win += batch
        n += batch
        now = time.perf_counter()
        if now - last >= 1.0:
            torch.cuda.synchronize()
            now = time.perf_counter()
            c = cpu_seconds(pids)
            series.append({"t": round(now - t0, 2), "images_per_s": n_win / (now - last),
                           "worker_cores": (c - c_last) / (now - last)})
            last, c_last, n_win = now, c, 0
    del it
    cores = [s["worker_cores"] for s in series[2:]] or [0.0]
    rates = [s["images_per_s"] for s in series[2:]] or [0.0]
    return {"workers": k, "precision": "bf16" if bf16 else "fp32", "images_per_s": statistics.fmean(rates),
            "worker_cores_mean": statistics.fmean(cores),
            "worker_cores_cv": statistics.pstdev(cores) / max(1e-9, statistics.fmean(cores)),
            "worker_cores_p95": sorted(cores)[int(0.95 * (len(cores) - 1))], "series": series}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    try:
        import torch
        import torchvision  # noqa: F401
        from PIL import Image  # noqa: F401
    except ImportError as e:
        print(f"skipped: needs torch, torchvision and Pillow ({e.name} missing)")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU here")
        return 0
    s = 6.0 if a.quick else 15.0
    batch = 256
    ncpu = len(os.sched_getaffinity(0))
    blobs = make_jpegs(256)
    res: dict = {"gpu": torch.cuda.get_device_name(0), "cpu_cores": ncpu, "torch": torch.__version__,
                 "jpeg_kb_mean": statistics.fmean(len(b) for b in blobs) / 1024, "batch": batch}
    res["pipeline_alone"] = [pipeline_alone(blobs, k, batch, s) for k in (1, 2, 4, 8) if k <= ncpu]
    print(json.dumps(res["pipeline_alone"]), flush=True)
    res["gpu_alone"] = [gpu_alone(batch, s, bf) for bf in (False, True)]
    print(json.dumps(res["gpu_alone"]), flush=True)
    ks = [k for k in (4, 8, max(1, ncpu - 2)) if k <= ncpu]
    res["end_to_end"] = [end_to_end(blobs, k, batch, 2 * s, True) for k in sorted(set(ks))]
    cpu_per_img = statistics.median(p["cpu_s_per_image"] for p in res["pipeline_alone"])
    res["cpu_s_per_image"] = cpu_per_img
    res["cores_per_gpu"] = {g["precision"]: g["images_per_s"] * cpu_per_img for g in res["gpu_alone"]}
    a.json.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "end_to_end"}, indent=1))
    for e in res["end_to_end"]:
        print(json.dumps({k: v for k, v in e.items() if k != "series"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
