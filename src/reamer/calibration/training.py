"""Training constants: core speed, Amdahl fraction, PS update cost, per-sample cost of the real models.

* ``core_gflops``: training GFLOP/s of one core on the reference CNN (3 × counted forward FLOPs
  per sample × batch / step time at one thread);
* ``parallel_fraction``: Amdahl f from the median per-round speedup s of 1 vs 2 threads,
  ``f = 2 (1 - 1/s)`` (short interleaved blocks, so machine drift cancels);
* ``ps_update_ns_per_byte``: one thread's ``p.add_(g, alpha=-lr)`` over a 64 MB fp32 gradient;
* per real-workload model (:data:`reamer.workloads.real.nets.MODELS`, what the PS training job
  runs): parameters and forward FLOPs counted (``torch.utils.flop_counter``), samples/s of a
  worker's step (forward + backward at the job's batch) at 1..nproc threads, the 1-core
  cost ``core_s_per_sample`` and the model's own Amdahl fraction fitted to those points.

All run in this process with ``torch.set_num_threads``; nothing here needs a cgroup.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from operator import truediv
from typing import Any

from reamer.calibration.machine import LoadMeter

REF_BATCH = 32
FOREIGN_MAX = 0.25  # cores of other processes' CPU use tolerated during a timed block
MODEL_BATCH = 32  # the PS training worker's default batch (workloads/real/ps_training.py)
REF_DESC = "3x(conv3x3 32/64/128 + relu + maxpool) + fc256 + fc10, 3x32x32, SGD"


def reference_cnn(batch: int = REF_BATCH) -> tuple[Any, Any, Any]:
    """The reference CNN for core speed (same as every calibration so far), a fixed batch."""
    import torch

    nn = torch.nn
    g = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10),
        )  # fmt: skip
    x, y = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    return model, x, y


def fwd_flops(model: Any, x1: Any) -> float:
    """Forward FLOPs of one sample (``x1`` has batch 1), counted by ``torch.utils.flop_counter``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x1)
    return float(counter.get_total_flops())


def params_m(model: Any) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def timed(fn: Callable[[], None], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def step_fn(model: Any, x: Any, y: Any, opt: Any = None) -> Callable[[], None]:
    """One training step per call: forward, cross-entropy backward, and ``opt``'s step if given."""
    import torch

    loss_fn = torch.nn.functional.cross_entropy

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        if opt is not None:
            opt.step()

    return step


def measure_reference(rounds: int, steps: int, tick: Callable[[], None]) -> dict:
    """core_gflops and parallel_fraction from the reference CNN at 1 and 2 threads."""
    import torch

    model, x, y = reference_cnn()
    flop = 3.0 * fwd_flops(model, x[:1]) * REF_BATCH
    step = step_fn(model, x, y, torch.optim.SGD(model.parameters(), lr=0.01))
    t: dict[int, list[float]] = {1: [], 2: []}
    for r in range(rounds + 1):  # interleaved short blocks; round 0 is warm-up
        for th in (1, 2):
            torch.set_num_threads(th)
            block = statistics.median(timed(step, steps))
            if r:
                t[th].append(block)
        if r:
            tick()
    t1, t2 = statistics.median(t[1]), statistics.median(t[2])
    s = statistics.median(map(truediv, t[1], t[2]))
    return {"core_gflops": flop / t1 / 1e9, "parallel_fraction": min(1.0, max(0.0, 2.0 * (1.0 - 1.0 / s))),
            "max_cores": max(t), "step_ms_1t": t1 * 1e3, "step_ms_2t": t2 * 1e3, "speedup_2t": s,
            "step_1t_spread": (max(t[1]) - min(t[1])) / t1, "step_gflop": flop / 1e9}  # fmt: skip


def measure_ps(repeats: int) -> float:
    """Single-thread ``p.add_(g, alpha=-lr)`` over a 64 MB fp32 gradient: ns per gradient byte."""
    import torch

    torch.set_num_threads(1)
    p, g = torch.randn(16 * 2**20), torch.randn(16 * 2**20)
    timed(lambda: p.add_(g, alpha=-0.01), 3)  # warm-up (page faults, caches)
    return statistics.median(timed(lambda: p.add_(g, alpha=-0.01), repeats)) * 1e9 / g.nbytes


def amdahl(cores: float, f: float) -> float:
    return cores if cores <= 1.0 else 1.0 / ((1.0 - f) + f / cores)


def fit_fraction(points: list[tuple[int, float]]) -> float | None:
    """Amdahl f of [cores, rate] points relative to the 1-core rate (least squares in log)."""
    base = [r for c, r in points if c == 1]
    multi = [(c, r) for c, r in points if c > 1]
    if not base or not multi:
        return None
    from scipy.optimize import least_squares

    r1 = base[0]
    res = least_squares(lambda f: [math.log(r / r1 / amdahl(c, f[0])) for c, r in multi], [0.5], bounds=([0.0], [1.0]))
    return float(res.x[0])


def core_counts(nproc: int) -> list[int]:
    return [c for c in (1, 2, 4, 8, 16) if c <= nproc]


def measure_models(names: list[str], nproc: int, seconds: float, rounds: int, tick: Callable[[], None],
                   max_block_s: float = 5.0) -> dict:  # fmt: skip
    """``models`` entries (without ``source``) of the real-workload models; a timed block during
    which other processes used more than ``FOREIGN_MAX`` cores is retried (up to ``max_block_s``)."""
    import torch

    from reamer.workloads.real.nets import build_model, synthetic_batch

    cores = core_counts(nproc)
    out = {}
    for name in names:
        model = build_model(name)
        x, y = synthetic_batch(MODEL_BATCH, seed=0)
        fwd = fwd_flops(model, x[:1])
        step = step_fn(model, x, y)
        torch.set_num_threads(1)
        timed(step, 3)  # warm-up
        rates: dict[int, list[float]] = {c: [] for c in cores}
        meter = LoadMeter(time.process_time)
        for _ in range(rounds):  # interleave core counts against drift
            for c in cores:
                torch.set_num_threads(c)
                t_end = time.perf_counter() + max_block_s
                while True:  # retry a block disturbed by other processes, for up to max_block_s
                    step()
                    meter.reset()
                    n, t0 = 0, time.perf_counter()
                    while (el := time.perf_counter() - t0) < seconds / rounds:
                        step()
                        n += 1
                    if meter.cores() < FOREIGN_MAX or time.perf_counter() > t_end:
                        break
                    time.sleep(0.2)
                rates[c].append(n * MODEL_BATCH / el)
            tick()
        points = [(c, statistics.median(rates[c])) for c in cores]
        f = fit_fraction(points)
        out[name] = {"params_m": round(params_m(model), 6), "fwd_gflops": round(fwd / 1e9, 6),
                     "core_s_per_sample": round(1.0 / points[0][1], 8),
                     "parallel_fraction": None if f is None else round(f, 4), "batch": MODEL_BATCH,
                     "measured": [[c, round(r, 2)] for c, r in points]}  # fmt: skip
    torch.set_num_threads(1)
    return out
