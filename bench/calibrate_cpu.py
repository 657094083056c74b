"""Measure the four machine constants of ``reamer.models.training.Calibration`` on this CPU.

* ``core_gflops``           training GFLOP/s of one core (3 x analytic forward FLOPs per step)
* ``parallel_fraction``     Amdahl f from the step time at 1 vs 2 threads: f = 2(1 - 1/s)
* ``oversub_penalty``       k in E = amdahl(min(c, t)) / (1 + k (t/c - 1)), fitted on child
                            processes run inside a real cgroup-v1 CPU quota
* ``ps_update_ns_per_byte`` core-ns per byte for ``p.add_(g, alpha=-lr)`` on one thread

Usage: python bench/calibrate_cpu.py --json OUT [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

BATCH = 32
CGROOT = Path("/sys/fs/cgroup/cpu")
QUOTA_POINTS = [(0.5, 1), (0.5, 2), (1.0, 1), (1.0, 2)]  # (cores, threads); threads 2 = node default


def build(torch):
    """Small CNN on 3x32x32, a fixed synthetic batch, an SGD optimizer, and one-step closure."""
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10),
    )  # fmt: skip
    x = torch.randn(BATCH, 3, 32, 32)
    y = torch.randint(0, 10, (BATCH,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return model, x, train_step


def fwd_flops_per_sample(torch, model, x) -> float:
    """Analytic forward FLOPs (2 x MACs of conv/linear layers) from the layer output shapes."""
    macs: list[float] = []

    def hook(mod, _inp, out):
        if isinstance(mod, torch.nn.Conv2d):
            k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
            macs.append(out[0].numel() * k)
        else:
            macs.append(mod.in_features * mod.out_features)

    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    handles = [m.register_forward_hook(hook) for m in layers]
    with torch.no_grad():
        model(x[:1])
    for h in handles:
        h.remove()
    return 2.0 * sum(macs)


def step_times(train_step, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        train_step()
        out.append(time.perf_counter() - t0)
    return out


def child(cg: str, threads: int, seconds: float, windows: int) -> None:
    """Subprocess body: set threads, join the cgroup, then measure steps/s over wall-clock windows."""
    import torch

    torch.set_num_threads(threads)
    _, _, train_step = build(torch)
    Path(cg, "cgroup.procs").write_text(str(os.getpid()))  # moves every thread of this process
    step_times(train_step, 3)  # warm-up under the quota
    rates = []
    for _ in range(windows):
        n, t0 = 0, time.perf_counter()
        while (el := time.perf_counter() - t0) < seconds:
            train_step()
            n += 1
        rates.append(n / el)
    print(json.dumps({"steps_per_s": statistics.median(rates), "windows": rates}))


def run_child(cg: Path, quota: float | None, threads: int, seconds: float, windows: int) -> float:
    (cg / "cpu.cfs_quota_us").write_text("-1" if quota is None else str(int(quota * 100_000)))
    cmd = [sys.executable, __file__, "--child", str(cg), "--threads", str(threads),
           "--seconds", str(seconds), "--windows", str(windows)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])["steps_per_s"]


def model_eff(cores: float, threads: int, k: float) -> float:
    """E for n = min(cores, threads) <= 1, same formula as training.effective_cores."""
    n = min(cores, float(threads))
    return n / (1.0 + k * max(0.0, threads / cores - 1.0))


def measure_oversub(seconds: float, windows: int, progress, task) -> dict:
    """Throughput in a cgroup-v1 quota, normalised by the same child unthrottled at 1 thread.

    The cgroup is always removed; if cgroups are not writable the fit is skipped (None).
    """
    from scipy.optimize import least_squares

    cg = CGROOT / f"reamer-calib-{os.getpid()}"
    try:
        cg.mkdir()
        (cg / "cpu.cfs_period_us").write_text("100000")
    except OSError as e:
        print(f"[oversub] cgroup v1 cpu controller not writable ({e}); skipping oversub_penalty")
        progress.advance(task, 2 + len(QUOTA_POINTS))
        return {"oversub_penalty": None}
    try:
        ref0 = run_child(cg, None, 1, seconds, windows)
        progress.advance(task)
        raw = []
        for c, t in QUOTA_POINTS:
            raw.append((c, t, run_child(cg, c, t, seconds, windows)))
            progress.advance(task)
        ref1 = run_child(cg, None, 1, seconds, windows)  # again, to average out machine drift
        progress.advance(task)
    finally:
        cg.rmdir()
    ref = math.sqrt(ref0 * ref1)
    pts = [(c, t, r / ref) for c, t, r in raw]
    fit = [(c, t, e) for c, t, e in pts if t / c > 1.0]  # points where the penalty applies

    def resid(k):
        return [math.log(e) - math.log(model_eff(c, t, k[0])) for c, t, e in fit]

    k = float(least_squares(resid, x0=[0.1]).x[0])
    out = {"oversub_penalty": k, "oversub_ref_steps_per_s": ref, "oversub_ref_drift": ref1 / ref0 - 1}
    for c, t, e in pts:
        out[f"eff_c{int(c * 100):03d}_t{t}"] = e
        out[f"eff_model_c{int(c * 100):03d}_t{t}"] = model_eff(c, t, k)
    return out


def measure_ps(torch, repeats: int) -> float:
    torch.set_num_threads(1)
    n = 64 * 2**20 // 4  # 64 MB of fp32 gradient
    p, g = torch.randn(n), torch.randn(n)
    for _ in range(3):
        p.add_(g, alpha=-0.01)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        p.add_(g, alpha=-0.01)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e9 / g.nbytes


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", type=Path, help="write results JSON here")
    ap.add_argument("--quick", action="store_true", help="shorter run (< 1 min)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=2.0, help=argparse.SUPPRESS)
    ap.add_argument("--windows", type=int, default=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.threads, a.seconds, a.windows)

    import torch
    from rich.console import Console
    from rich.progress import Progress

    steps, rounds, ps_reps = (10, 3, 10) if a.quick else (20, 6, 30)
    win_s, wins = (1.5, 2) if a.quick else (3.0, 3)
    model, x, train_step = build(torch)
    fwd = fwd_flops_per_sample(torch, model, x)
    step_flop = 3.0 * fwd * BATCH
    t = {1: [], 2: []}
    with Progress(console=Console(stderr=True)) as prog:
        task = prog.add_task("calibrating", total=2 * rounds + 3 + len(QUOTA_POINTS))
        for th in (1, 2):  # warm-up both thread counts
            torch.set_num_threads(th)
            step_times(train_step, 5)
        for _ in range(rounds):  # interleave 1- and 2-thread blocks against drift
            for th in (1, 2):
                torch.set_num_threads(th)
                t[th].append(statistics.median(step_times(train_step, steps)))
                prog.advance(task)
        ps = measure_ps(torch, ps_reps)
        prog.advance(task)
        over = measure_oversub(win_s, wins, prog, task)
    t1, t2 = statistics.median(t[1]), statistics.median(t[2])
    s = t1 / t2
    metrics = {
        "core_gflops": step_flop / t1 / 1e9,
        "parallel_fraction": 2.0 * (1.0 - 1.0 / s),
        **over,
        "ps_update_ns_per_byte": ps,
        "step_ms_1t": t1 * 1e3,
        "step_ms_2t": t2 * 1e3,
        "speedup_2t": s,
        "step_ms_1t_spread": (max(t[1]) - min(t[1])) / t1,
        "step_ms_2t_spread": (max(t[2]) - min(t[2])) / t2,
    }
    params = {
        "model": "cnn3x(conv3x3 32/64/128 + pool) + fc256 + fc10",
        "input": "3x32x32", "batch": BATCH, "fwd_mflops_per_sample": fwd / 1e6,
        "step_gflop": step_flop / 1e9, "steps_per_block": steps, "rounds": rounds,
        "ps_buffer_mb": 64, "ps_repeats": ps_reps, "quota_window_s": win_s,
        "quota_windows": wins, "quick": a.quick, "torch": torch.__version__,
        "cpu": cpu_model(), "nproc": os.cpu_count(),
    }  # fmt: skip
    Console().print(
        f"[bold]calibrate_cpu[/] on {params['cpu']}, {params['nproc']} cores, torch {torch.__version__}"
    )
    for key, val in metrics.items():
        print(f"  {key:28s} {val if val is None else f'{val:.4g}'}")
    if a.json:
        out = {"bench": "calibrate_cpu", "runs": [{"scenario": "cpu", "seed": 0, "policy": "none",
               "params": params, "metrics": metrics}], "ratios": {}}  # fmt: skip
        a.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
