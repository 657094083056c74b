"""Measure the four machine constants of ``reamer.models.training.Calibration`` on this CPU.

* ``core_gflops``           training GFLOP/s of one core (3 x analytic forward FLOPs per step)
* ``parallel_fraction``     Amdahl f from the step time at 1 vs 2 threads: f = 2(1 - 1/s)
* ``oversub_penalty``       k in E = amdahl(min(c, t)) / (1 + k (t/c - 1)), fitted on a child
                            process run inside a real cgroup-v1 CPU quota
* ``ps_update_ns_per_byte`` core-ns per byte for ``p.add_(g, alpha=-lr)`` on one thread

Usage: python bench/calibrate_cpu.py --json OUT [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from operator import truediv
from pathlib import Path

from scipy.optimize import least_squares

BATCH = 32
CGROOT = Path("/sys/fs/cgroup/cpu")
# (cores, threads): threads=2 is the framework default on this node, 1 = max(1, ceil(quota)).
# The reference (None, 1) is unthrottled at 1 thread, i.e. E = 1 by definition.
QUOTA_POINTS = [(0.5, 1), (0.5, 2), (1.0, 1), (1.0, 2)]


def build(torch):
    """Small CNN on 3x32x32, a fixed synthetic batch, SGD, and a one-step closure."""
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10),
    )  # fmt: skip
    x, y = torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return model, x, train_step


def fwd_flops_per_sample(torch) -> float:
    """Analytic forward FLOPs (2 x MACs of conv/linear layers) from the layer output shapes."""
    macs: list[float] = []

    def hook(mod, _inp, out):  # MACs per output element = weight[0] size (cin/g*kh*kw or in)
        macs.append(out[0].numel() * mod.weight[0].numel())

    model, x, _ = build(torch)  # a throwaway copy, so the hooks never touch the timed model
    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(x[:1])
    return 2.0 * sum(macs)


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def window_rate(fn, seconds: float) -> float:
    """Calls/s over a wall-clock window (spans many 100 ms CFS periods)."""
    n, t0 = 0, time.perf_counter()
    while (el := time.perf_counter() - t0) < seconds:
        fn()
        n += 1
    return n / el


def child(cg: str, seconds: float, rounds: int) -> None:
    """Subprocess: join the cgroup, then per round measure steps/s at each (quota, threads).

    Every round starts with the unthrottled reference so machine drift cancels in the ratios;
    one JSON line per measurement drives the parent's progress bar."""
    import torch

    _, _, train_step = build(torch)
    Path(cg, "cgroup.procs").write_text(str(os.getpid()))  # moves every thread of the process
    for r in range(rounds + 1):
        for c, t in [(None, 1)] + (QUOTA_POINTS if r < rounds else []):  # closing ref at the end
            Path(cg, "cpu.cfs_quota_us").write_text("-1" if c is None else str(int(c * 100_000)))
            torch.set_num_threads(t)
            window_rate(train_step, 0.3)  # settle under the new quota / thread count
            rate = window_rate(train_step, seconds)
            print(json.dumps({"round": r, "cores": c, "threads": t, "rate": rate}), flush=True)


def model_eff(cores: float, threads: int, k: float) -> float:
    """E for n = min(cores, threads) <= 1, same formula as training.effective_cores."""
    return min(cores, float(threads)) / (1.0 + k * max(0.0, threads / cores - 1.0))


def fit_k(pts: list[tuple[float, int, float]]) -> float:
    """Least squares in log E over the points where the penalty term applies (threads > cores)."""
    pts = [(c, t, e) for c, t, e in pts if t / c > 1.0]
    res = least_squares(lambda k: [math.log(e / model_eff(c, t, k[0])) for c, t, e in pts], [0.1])
    return float(res.x[0])


def measure_oversub(seconds: float, rounds: int, progress, task) -> dict:
    """Steps/s in cgroup-v1 quotas relative to 1 unthrottled thread; always removes the cgroup."""
    cg = CGROOT / f"reamer-calib-{os.getpid()}"
    try:
        cg.mkdir()
        (cg / "cpu.cfs_period_us").write_text("100000")
    except OSError as e:
        if cg.exists():
            cg.rmdir()
        print(f"[oversub] cgroup v1 cpu controller not writable ({e}); skipping oversub_penalty")
        progress.advance(task, rounds * (1 + len(QUOTA_POINTS)) + 1)
        return {"oversub_penalty": None}
    rows, proc = [], None
    cmd = [sys.executable, __file__, "--child", str(cg), "--seconds", str(seconds)]
    try:
        proc = subprocess.Popen([*cmd, "--rounds", str(rounds)], stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            rows.append(json.loads(line))
            progress.advance(task)
        if proc.wait():
            raise RuntimeError(f"oversub child failed with exit code {proc.returncode}")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        cg.rmdir()
    ref = [row["rate"] for row in rows if row["cores"] is None]  # rounds + 1 refs
    out = {"oversub_ref_steps_per_s": statistics.median(ref),
           "oversub_ref_spread": (max(ref) - min(ref)) / statistics.median(ref)}  # fmt: skip
    pts: dict[str, list] = {"": [], "_sum": []}  # median of round ratios; long-run ratio of sums
    for c, t in QUOTA_POINTS:
        mine = [row for row in rows if (row["cores"], row["threads"]) == (c, t)]
        refs = [math.sqrt(ref[row["round"]] * ref[row["round"] + 1]) for row in mine]  # bracketing
        rates = [row["rate"] for row in mine]
        e_med, e_sum = statistics.median(map(truediv, rates, refs)), sum(rates) / sum(refs)
        for tag, e in (("", e_med), ("_sum", e_sum)):
            out[f"eff{tag}_c{round(c * 100):03d}_t{t}"] = e
            pts[tag].append((c, t, e))
    for tag, p in pts.items():
        out[f"oversub_penalty{tag}"] = fit_k(p)
    return out


def measure_ps(torch, repeats: int) -> float:
    """Single-thread ``p.add_(g, alpha=-lr)`` over a 64 MB fp32 gradient: ns per gradient byte."""
    torch.set_num_threads(1)
    p, g = torch.randn(16 * 2**20), torch.randn(16 * 2**20)
    timed(lambda: p.add_(g, alpha=-0.01), 3)  # warm-up (page faults, caches)
    return statistics.median(timed(lambda: p.add_(g, alpha=-0.01), repeats)) * 1e9 / g.nbytes


def cpu_seconds() -> tuple[float, float]:
    """(CPU-s busy on the whole machine per /proc/stat, CPU-s of this process + reaped children)."""
    f = [int(v) for v in Path("/proc/stat").read_text().split(maxsplit=11)[1:11]]
    t = os.times()  # user, system, children_user, children_system, elapsed
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / os.sysconf("SC_CLK_TCK"), sum(t[:4])


def cpu_model() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", type=Path, help="write results JSON here")
    ap.add_argument("--quick", action="store_true", help="shorter run (< 1 min)")
    for hidden, typ in (("--child", str), ("--seconds", float), ("--rounds", int)):
        ap.add_argument(hidden, type=typ, help=argparse.SUPPRESS)  # child-process mode
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.seconds, a.rounds)

    import torch
    from rich.console import Console
    from rich.progress import Progress

    steps, rounds, ps_reps = (5, 8, 10) if a.quick else (5, 24, 30)
    win_s, q_rounds = (0.8, 2) if a.quick else (1.5, 8)
    (busy0, own0), wall0 = cpu_seconds(), time.perf_counter()
    _, _, train_step = build(torch)
    step_flop = 3.0 * (fwd := fwd_flops_per_sample(torch)) * BATCH
    t: dict[int, list[float]] = {1: [], 2: []}
    with Progress(console=Console(stderr=True)) as prog:
        total = 2 * rounds + 2 + q_rounds * (1 + len(QUOTA_POINTS))  # +2: PS, closing quota ref
        task = prog.add_task("calibrating", total=total)
        for r in range(rounds + 1):  # interleave short 1-/2-thread blocks; round 0 is warm-up
            for th in (1, 2):
                torch.set_num_threads(th)
                block = statistics.median(timed(train_step, steps))
                if r:
                    t[th].append(block)
                    prog.advance(task)
        ps = measure_ps(torch, ps_reps)
        prog.advance(task)
        over = measure_oversub(win_s, q_rounds, prog, task)
    (busy1, own1), wall1 = cpu_seconds(), time.perf_counter()
    t1, t2 = statistics.median(t[1]), statistics.median(t[2])
    s = statistics.median(map(truediv, t[1], t[2]))  # median of per-round speedups
    metrics = {
        "core_gflops": step_flop / t1 / 1e9, "parallel_fraction": 2.0 * (1.0 - 1.0 / s),
        "oversub_penalty": over.pop("oversub_penalty", None), "ps_update_ns_per_byte": ps,
        "step_ms_1t": t1 * 1e3, "step_ms_2t": t2 * 1e3, "speedup_2t": s,
        "step_1t_spread": (max(t[1]) - min(t[1])) / t1,
        "step_2t_spread": (max(t[2]) - min(t[2])) / t2,
        "background_load_cores": ((busy1 - busy0) - (own1 - own0)) / (wall1 - wall0), **over,
    }  # fmt: skip
    params = {
        "model": "3x(conv3x3 32/64/128 + relu + maxpool) + fc256 + fc10",
        "input": "3x32x32", "batch": BATCH, "fwd_mflops_per_sample": fwd / 1e6,
        "step_gflop": step_flop / 1e9, "steps_per_block": steps, "rounds": rounds,
        "ps_buffer_mb": 64, "ps_repeats": ps_reps, "quota_window_s": win_s,
        "quota_rounds": q_rounds, "quick": a.quick, "torch": torch.__version__,
        "cpu": cpu_model(), "nproc": os.cpu_count(),
    }  # fmt: skip
    head = f"{params['cpu']}, {os.cpu_count()} cores, torch {torch.__version__}"
    Console().print(f"[bold]calibrate_cpu[/] {head}")
    for name, val in metrics.items():
        print(f"  {name:28s} {val if val is None else f'{val:.4g}'}")
    if metrics["background_load_cores"] > 0.1:
        print("WARNING: other processes used CPU during the run; the numbers are contaminated")
    if a.json:
        run = {"scenario": "cpu", "seed": 0, "policy": "none", "params": params, "metrics": metrics}
        out = {"bench": "calibrate_cpu", "runs": [run], "ratios": {}}
        a.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
