"""Measure CPU inference service time per (model, cores, batch) with ONNX Runtime, and fit it.

Models (full-size published architectures, defined here in PyTorch, random weights, fp32):

* ``resnet50``      He et al. CVPR 2016, bottleneck blocks [3, 4, 6, 3], 3x224x224
* ``mobilenet_v2``  Sandler et al. CVPR 2018, width 1.0, 3x224x224
* ``vgg16``         Simonyan & Zisserman ICLR 2015, configuration D (no BN), 3x224x224
* ``bert_base``     Devlin et al. NAACL 2019, 12 layers, hidden 768, 12 heads, FFN 3072,
                    sequence 128 (token ids, no padding mask), pooler + 2-way classifier
* ``deepspeech2``   Amodei et al. ICML 2016 style: 2 conv layers (41x11 s2x2, 21x11 s2x1,
                    32 channels, BN + hardtanh), 5 bidirectional GRU layers (hidden 800),
                    linear to 29 characters; input a 2 s spectrogram: 161 bins x 200 frames
                    (20 ms window, 10 ms hop at 16 kHz)

Each model is exported to ONNX (``torch.onnx.export(..., dynamo=False)``, dynamic batch axis)
in a temporary directory and run with ``intra_op_num_threads = cores`` (``inter_op = 1``,
sequential execution, all graph optimizations). For every (model, batch) the sessions for
all core counts are timed in interleaved samples (so slow machine drift cancels) after a
warm-up; a sample is >= 0.2 s of back-to-back runs, 3-9 samples per point, and the service
time is their median. The machine may be shared: a sample during which other processes used
more than 0.25 cores (/proc/stat busy time minus this process's CPU time) is discarded and
retried, for up to ``--max-point-s`` per point; each model first waits (``--wait-quiet``)
for the machine to go quiet. A point with fewer than two undisturbed samples is marked
``contended`` and left out of the fit; the profile is not written if a model's fit would need
such points (``--allow-contended`` overrides). The JSON records rejected samples and the
worst other load per point.

Fitted model (per model), used by ``reamer.models.inference.service_time_s``::

    service_time(cores, batch) = (a + b * batch) / E(cores)
    E(c) = 1 / ((1 - f) + f / c)      (Amdahl-effective cores; E = c below one core)

``a`` (per-batch overhead), ``b`` (per-sample cost) and the parallel fraction ``f`` minimise
the squared log error over the undisturbed points; with cores in {1, 2}, ``f`` is set by the
1-core vs 2-core ratios. Extrapolating ``f`` to 4-8 cores is the model's main assumption.

Usage: python bench/inference_profile.py --json OUT [--quick] [--profile PATH] [--models a,b --update]
  (the full run also rewrites src/reamer/data/inference_profiles.json unless --no-profile;
   --quick writes a profile only where --profile is given; --update re-measures some models
   and merges them into the existing JSON and profile)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "src" / "reamer" / "data" / "inference_profiles.json"
MODELS = ("resnet50", "mobilenet_v2", "vgg16", "bert_base", "deepspeech2")


# --------------------------------------------------------------------------- architectures


def build_model(torch, name: str):
    """(module in eval mode, example input for batch 1, input description, dtype name)."""
    nn = torch.nn
    torch.manual_seed(0)

    def conv_bn(cin, cout, k, s=1, groups=1, act=nn.ReLU):
        layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act(inplace=True))
        return nn.Sequential(*layers)

    if name == "resnet50":

        class Bottleneck(nn.Module):
            def __init__(self, cin, width, stride):
                super().__init__()
                self.body = nn.Sequential(conv_bn(cin, width, 1), conv_bn(width, width, 3, stride),
                                          conv_bn(width, 4 * width, 1, act=None))  # fmt: skip
                self.down = (conv_bn(cin, 4 * width, 1, stride, act=None)
                             if stride != 1 or cin != 4 * width else nn.Identity())  # fmt: skip
                self.relu = nn.ReLU(inplace=True)

            def forward(self, x):
                return self.relu(self.body(x) + self.down(x))

        layers: list = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = 4 * width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
        return nn.Sequential(*layers).eval(), torch.randn(1, 3, 224, 224), "3x224x224 image"

    if name == "mobilenet_v2":

        class InvertedResidual(nn.Module):
            def __init__(self, cin, cout, stride, t):
                super().__init__()
                hid = cin * t
                layers = [conv_bn(cin, hid, 1, act=nn.ReLU6)] if t != 1 else []
                layers += [conv_bn(hid, hid, 3, stride, groups=hid, act=nn.ReLU6), conv_bn(hid, cout, 1, act=None)]
                self.body = nn.Sequential(*layers)
                self.res = stride == 1 and cin == cout

            def forward(self, x):
                return x + self.body(x) if self.res else self.body(x)

        layers = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                           (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):  # fmt: skip
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [conv_bn(320, 1280, 1, act=nn.ReLU6), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                   nn.Dropout(0.2), nn.Linear(1280, 1000)]  # fmt: skip
        return nn.Sequential(*layers).eval(), torch.randn(1, 3, 224, 224), "3x224x224 image"

    if name == "vgg16":
        layers, cin = [], 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
                cin = v
        layers += [nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
                   nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, 1000)]  # fmt: skip
        return nn.Sequential(*layers).eval(), torch.randn(1, 3, 224, 224), "3x224x224 image"

    if name == "bert_base":
        hidden, heads, ffn, n_layers, seq, vocab = 768, 12, 3072, 12, 128, 30522

        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(hidden, 3 * hidden)
                self.out = nn.Linear(hidden, hidden)
                self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
                self.ff = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
                self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

            def forward(self, x):
                b, t, _ = x.shape
                q, k, v = self.qkv(x).view(b, t, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
                att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hidden // heads), dim=-1)
                ctx = (att @ v).transpose(1, 2).reshape(b, t, hidden)
                x = self.ln1(x + self.out(ctx))
                return self.ln2(x + self.ff(x))

        class Bert(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(vocab, hidden)
                self.pos = nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
                self.typ = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)  # segment 0 only
                self.ln = nn.LayerNorm(hidden, eps=1e-12)
                self.layers = nn.ModuleList(Layer() for _ in range(n_layers))
                self.pool = nn.Linear(hidden, hidden)
                self.cls = nn.Linear(hidden, 2)

            def forward(self, ids):
                x = self.ln(self.tok(ids) + self.pos + self.typ)
                for layer in self.layers:
                    x = layer(x)
                return self.cls(torch.tanh(self.pool(x[:, 0])))

        return Bert().eval(), torch.randint(0, vocab, (1, seq)), f"{seq} token ids"

    if name == "deepspeech2":
        bins, frames, hidden, n_rnn, chars = 161, 200, 800, 5, 29

        class DS2(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Sequential(
                    nn.Conv2d(1, 32, (41, 11), (2, 2), (20, 5), bias=False), nn.BatchNorm2d(32), nn.Hardtanh(0, 20),
                    nn.Conv2d(32, 32, (21, 11), (2, 1), (10, 5), bias=False), nn.BatchNorm2d(32), nn.Hardtanh(0, 20),
                )  # fmt: skip
                f = (bins + 1) // 2
                f = (f + 1) // 2
                self.rnn = nn.GRU(32 * f, hidden, n_rnn, batch_first=True, bidirectional=True)
                self.fc = nn.Linear(2 * hidden, chars)

            def forward(self, spec):  # spec: (batch, 1, bins, frames)
                x = self.conv(spec)
                b, c, f, t = x.shape
                x = x.permute(0, 3, 1, 2).reshape(b, t, c * f)
                x, _ = self.rnn(x)
                return self.fc(x).log_softmax(-1)

        return DS2().eval(), torch.randn(1, 1, bins, frames), f"2 s spectrogram, {bins} bins x {frames} frames"

    raise ValueError(f"unknown model {name!r}")


def export(torch, model, x, path: Path) -> None:
    with torch.no_grad():
        torch.onnx.export(model, (x,), str(path), input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                          opset_version=17, dynamo=False)  # fmt: skip


def session(ort, path: Path, cores: int):
    so = ort.SessionOptions()
    so.intra_op_num_threads = cores
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


HZ = os.sysconf("SC_CLK_TCK")
FOREIGN_MAX = 0.25  # cores of other processes' CPU use tolerated while a sample runs


def busy_s() -> float:
    """Non-idle CPU seconds of all CPUs since boot (/proc/stat), others' work included."""
    f = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = f
    return (user + nice + system + irq + softirq + steal) / HZ


def timed_sample(sess, feed, reps: int) -> tuple[float, float]:
    """(seconds per run over ``reps`` back-to-back runs, other processes' CPU load in cores)."""
    b0, c0, t0 = busy_s(), time.process_time(), time.perf_counter()
    for _ in range(reps):
        sess.run(None, feed)
    wall = time.perf_counter() - t0
    foreign = max(0.0, (busy_s() - b0) - (time.process_time() - c0)) / wall
    return wall / reps, foreign


def wait_quiet(max_s: float, log) -> float:
    """Wait (up to max_s) until other processes use < FOREIGN_MAX cores over 2 s; return that load."""
    t_end = time.perf_counter() + max_s
    while True:
        b0, c0, t0 = busy_s(), time.process_time(), time.perf_counter()
        time.sleep(2.0)
        load = max(0.0, (busy_s() - b0) - (time.process_time() - c0)) / (time.perf_counter() - t0)
        if load < FOREIGN_MAX or time.perf_counter() > t_end:
            return load
        log(f"waiting for a quiet machine (other processes use {load:.2f} cores)")


# --------------------------------------------------------------------------- fit


def amdahl(cores: float, f: float) -> float:
    return cores if cores <= 1.0 else 1.0 / ((1.0 - f) + f / cores)


def fit(points: list[tuple[int, int, float]]) -> dict:
    """a_ms, b_ms, parallel_fraction minimising the squared log error of (a + b*batch)/E(cores)."""
    from scipy.optimize import least_squares

    c = np.array([p[0] for p in points], float)
    bt = np.array([p[1] for p in points], float)
    t = np.array([p[2] for p in points], float)

    def model(x):
        a, b, f = x
        e = np.where(c <= 1.0, c, 1.0 / ((1.0 - f) + f / np.maximum(c, 1.0)))
        return (a + b * bt) / e

    one = c == 1
    b0 = max(np.polyfit(bt[one], t[one], 1)[0], 1e-3) if one.sum() >= 2 else t.min()
    res = least_squares(lambda x: np.log(model(x)) - np.log(t), x0=[max(t.min() * 0.1, 1e-3), b0, 0.8],
                        bounds=([0.0, 1e-6, 0.0], [np.inf, np.inf, 1.0]))  # fmt: skip
    a, b, f = (float(v) for v in res.x)
    err = model(res.x) / t - 1.0
    return {"a_ms": a, "b_ms": b, "parallel_fraction": f,
            "fit_rms_err_pct": float(100 * np.sqrt(np.mean(err**2))),
            "fit_max_err_pct": float(100 * np.max(np.abs(err)))}  # fmt: skip


# --------------------------------------------------------------------------- main


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def plan(name: str, quick: bool) -> tuple[list[int], float]:
    """Batch sizes and the seconds of timed work per (batch, cores) point (3-9 samples)."""
    slow = name in ("vgg16", "bert_base")
    if quick:
        return ([1, 4] if slow else [1, 2, 8]), 0.8
    return ([1, 2, 4] if slow else [1, 2, 4, 8]), 2.5


def measure(torch, ort, name: str, cores_list: list[int], quick: bool, tmp: Path, log,
            max_point_s: float) -> tuple[dict, list]:
    model, x1, desc = build_model(torch, name)
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    path = tmp / f"{name}.onnx"
    t0 = time.perf_counter()
    export(torch, model, x1, path)
    del model
    sessions = {c: session(ort, path, c) for c in cores_list}
    log(f"{name}: {params_m:.1f} M params, exported + loaded in {time.perf_counter() - t0:.1f} s")
    batches, budget = plan(name, quick)
    rng = np.random.default_rng(0)
    rows = []
    for batch in batches:
        shape = (batch, *x1.shape[1:])
        if x1.dtype == torch.int64:
            feed = {"input": rng.integers(0, 30522, shape, dtype=np.int64)}
        else:
            feed = {"input": rng.standard_normal(shape, dtype=np.float32)}
        first = {c: min(timed_sample(s, feed, 1)[0] for _ in range(2)) for c, s in sessions.items()}  # warm-up
        reps = {c: max(1, math.ceil(0.2 / t)) for c, t in first.items()}  # samples of >= 0.2 s
        want = {c: int(min(9, max(3, budget / (reps[c] * t)))) for c, t in first.items()}
        times: dict[int, list[float]] = {c: [] for c in cores_list}
        foreign: dict[int, list[float]] = {c: [] for c in cores_list}
        rejected = {c: 0 for c in cores_list}
        t_end = time.perf_counter() + max_point_s
        while any(len(times[c]) < want[c] for c in cores_list):  # interleave core counts against drift
            for c, s in sessions.items():
                if len(times[c]) >= want[c]:
                    continue
                t, load = timed_sample(s, feed, reps[c])
                if load < FOREIGN_MAX or time.perf_counter() > t_end:
                    times[c].append(t)
                    foreign[c].append(load)
                else:
                    rejected[c] += 1
                    time.sleep(0.5)
        for c in cores_list:
            clean = [t for t, load in zip(times[c], foreign[c]) if load < FOREIGN_MAX]
            use = clean if len(clean) >= 2 else times[c]  # contended: too few undisturbed samples
            med = statistics.median(use)
            spread = (max(use) - min(use)) / med
            fl = max(load for t, load in zip(times[c], foreign[c]) if t in use)
            rows.append({"model": name, "cores": c, "batch": batch, "service_ms": med * 1e3,
                         "spread_ratio": spread, "samples": len(use), "runs_per_sample": reps[c],
                         "rejected_samples": rejected[c] + len(times[c]) - len(use),
                         "foreign_cores_max": fl, "contended": int(use is not clean)})  # fmt: skip
            log(f"  cores={c} batch={batch:2d}  {med * 1e3:9.2f} ms  ({len(use)}x{reps[c]} runs,"
                f" spread {spread:.0%}, rejected {rows[-1]['rejected_samples']}, other load <= {fl:.2f} cores"
                f"{', CONTENDED: not fitted' if use is not clean else ''})")
    return {"params_m": params_m, "input": desc}, rows


def _order(name: str) -> int:
    return MODELS.index(name) if name in MODELS else len(MODELS)


def _dump(prof: dict) -> str:
    """JSON with one line per model field (point lists stay on one line)."""
    lines = ["{"]
    head = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in prof.items() if k != "models"]
    lines.append(",\n".join(head) + ",")
    lines.append(' "models": {')
    items = []
    for name, m in prof["models"].items():
        fields = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in m.items())
        items.append(f"  {json.dumps(name)}: {{\n{fields}\n  }}")
    lines.append(",\n".join(items))
    lines.append(" }")
    lines.append("}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", type=Path, help="write results JSON here")
    ap.add_argument("--quick", action="store_true", help="fewer batch sizes and rounds (~2 min)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    ap.add_argument("--profile", type=Path, default=None,
                    help=f"write the fitted profile here (default for a full run: {SHIPPED})")
    ap.add_argument("--no-profile", action="store_true", help="do not write a profile")
    ap.add_argument("--allow-contended", action="store_true",
                    help="write the profile even if a model's fit needed contended points")
    ap.add_argument("--update", action="store_true",
                    help="merge: replace only the measured models in existing --json / profile files")
    ap.add_argument("--wait-quiet", type=float, default=120.0,
                    help="seconds to wait per model for other processes to go quiet (default 120)")
    ap.add_argument("--max-point-s", type=float, default=None,
                    help="seconds per (model, batch) to retry samples disturbed by other processes "
                         "(default 40, quick 15); after it, disturbed samples count")
    a = ap.parse_args()
    if a.max_point_s is None:
        a.max_point_s = 15.0 if a.quick else 40.0

    import onnxruntime as ort
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ncpu = os.cpu_count() or 1
    cores_list = [c for c in (1, 2) if c <= ncpu]
    names = [m.strip() for m in a.models.split(",") if m.strip()]
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", flush=True)

    runs, profile_models, tainted = [], {}, []
    with tempfile.TemporaryDirectory(prefix="reamer-onnx-") as tmp:
        for name in names:
            wait_quiet(a.wait_quiet, log)
            meta, rows = measure(torch, ort, name, cores_list, a.quick, Path(tmp), log, a.max_point_s)
            good = [(r["cores"], r["batch"], r["service_ms"]) for r in rows if not r["contended"]]
            bad = [(r["cores"], r["batch"], r["service_ms"]) for r in rows if r["contended"]]
            clean_fit = len(good) >= 3 and {c for c, _, _ in good} == set(cores_list)
            coef = fit(good if clean_fit else good + bad)
            if not clean_fit:
                tainted.append(name)
                log(f"  WARNING: too few undisturbed points for {name}; its fit uses contended points")
            log(f"  fit: a={coef['a_ms']:.2f} ms  b={coef['b_ms']:.2f} ms/sample  f={coef['parallel_fraction']:.3f}"
                f"  (rms err {coef['fit_rms_err_pct']:.1f}%)")
            for r in rows:
                runs.append({"scenario": "ort", "seed": 0, "policy": "none",
                             "params": {"model": name, "cores": r["cores"], "batch": r["batch"]},
                             "metrics": {k: r[k] for k in ("service_ms", "spread_ratio", "samples", "runs_per_sample",
                                                           "rejected_samples", "foreign_cores_max", "contended")}})
            profile_models[name] = {
                "a_ms": round(coef["a_ms"], 4), "b_ms": round(coef["b_ms"], 4),
                "parallel_fraction": round(coef["parallel_fraction"], 4),
                "measured": [[c, b, round(ms, 3)] for c, b, ms in good],
                "contended": [[c, b, round(ms, 3)] for c, b, ms in bad],
                "fit_rms_err_pct": round(coef["fit_rms_err_pct"], 2), "params_m": round(meta["params_m"], 2),
                "input": meta["input"],
            }  # fmt: skip
    elapsed = time.perf_counter() - started
    log(f"done in {elapsed:.0f} s on {ncpu} CPUs")
    today = dt.date.today().isoformat()
    source = f"bench/inference_profile.py on {cpu_model()}, {today}, onnxruntime {ort.__version__}"
    if a.json:
        for name, m in profile_models.items():  # the fitted coefficients, one run per model
            runs.append({"scenario": "fit", "seed": 0, "policy": "none", "params": {"model": name},
                         "metrics": {k: m[k] for k in ("a_ms", "b_ms", "parallel_fraction", "fit_rms_err_pct")}})
        if a.update and a.json.is_file():  # keep the other models' runs
            old = json.loads(a.json.read_text())["runs"]
            runs = [r for r in old if r["params"]["model"] not in profile_models] + runs
            runs.sort(key=lambda r: (r["scenario"] == "fit", _order(r["params"]["model"])))
        out = {"bench": "inference_profile", "runs": runs, "ratios": {}}
        a.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {a.json}")
    target = a.profile if a.profile is not None else (None if a.quick else SHIPPED)
    if target is not None and not a.no_profile and tainted and not a.allow_contended:
        print(f"not writing {target}: fits of {', '.join(tainted)} rest on contended points "
              "(rerun on a quieter machine, or pass --allow-contended)")
        raise SystemExit(1)
    if target is not None and not a.no_profile:
        prof = {"source": source,
                "model": "service_ms(cores, batch) = (a_ms + b_ms*batch) / E(cores), "
                         "E(c) = 1/((1-f) + f/c), f = parallel_fraction; measured = [cores, batch, ms]; "
                         "contended = points where other processes kept disturbing the samples, not fitted",
                "nproc": ncpu,
                "models": profile_models}  # fmt: skip
        if a.update and target.is_file():  # keep the other models' fits
            old = json.loads(target.read_text())["models"]
            prof["models"] = {**{k: v for k, v in old.items() if k not in profile_models}, **profile_models}
            prof["models"] = {k: prof["models"][k] for k in sorted(prof["models"], key=_order)}
        target.write_text(_dump(prof) + "\n")
        print(f"wrote {target}")


if __name__ == "__main__":
    main()
