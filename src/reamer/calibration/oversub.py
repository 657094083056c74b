"""Thread-oversubscription penalty ``k`` under a CPU quota (needs writable cgroups).

The reference CNN's training step runs in a child process (:mod:`~reamer.calibration.worker`)
inside a cgroup whose CFS quota the parent sets; each round measures steps/s unthrottled at
one thread (the reference, E = 1) and at each (quota cores, threads) point, so slow machine
drift cancels in the ratios (every point is divided by the geometric mean of the references
that bracket it). ``k`` is fitted in log space to the points where threads exceed the quota::

    E(cores, threads) = min(cores, threads) / (1 + k (threads / cores - 1))   (cores <= 1)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from operator import truediv

from reamer.backends.local.cgroups import CgroupExecutor
from reamer.calibration.training import REF_BATCH
from reamer.calibration.worker import Worker

# (cores, threads): 2 threads is the framework default on a 2-core node, 1 = the launcher's sizing
QUOTA_POINTS = [(0.5, 1), (0.5, 2), (1.0, 1), (1.0, 2)]
CGROUP = "oversub"


def model_eff(cores: float, threads: int, k: float) -> float:
    """E for n = min(cores, threads) <= 1, the same formula as ``models.training.effective_cores``."""
    return min(cores, float(threads)) / (1.0 + k * max(0.0, threads / cores - 1.0))


def fit_k(pts: list[tuple[float, int, float]]) -> float:
    from scipy.optimize import least_squares

    pts = [(c, t, e) for c, t, e in pts if t / c > 1.0]
    res = least_squares(lambda k: [math.log(e / model_eff(c, t, k[0])) for c, t, e in pts], [0.1], bounds=([0.0], [10.0]))
    return float(res.x[0])


def steps(rounds: int) -> int:
    """Progress ticks :func:`measure` makes."""
    return rounds + 1


def measure(ex: CgroupExecutor, seconds: float, rounds: int, tick: Callable[[], None]) -> dict:
    """``oversub_penalty`` and the efficiencies behind it; always removes its cgroup."""
    ex.create(CGROUP)
    try:
        with Worker("train", "ref_cnn", REF_BATCH, ex, CGROUP) as w:
            rows = []
            for r in range(rounds + 1):
                for c, t in [(None, 1)] + (QUOTA_POINTS if r < rounds else []):  # closing reference
                    ex.set_cpu(CGROUP, c)
                    rows.append((r, c, t, w.run(seconds, t)["rate"]))
                tick()
    finally:
        ex.remove(CGROUP, kill=True)
    ref = [rate for _, c, _, rate in rows if c is None]
    out: dict = {"ref_steps_per_s": statistics.median(ref), "ref_spread": (max(ref) - min(ref)) / statistics.median(ref)}
    pts = []
    for c, t in QUOTA_POINTS:
        mine = [(r, rate) for r, cc, tt, rate in rows if (cc, tt) == (c, t)]
        refs = [math.sqrt(ref[r] * ref[r + 1]) for r, _ in mine]
        e = statistics.median(map(truediv, [rate for _, rate in mine], refs))
        out[f"eff_c{round(c * 100):03d}_t{t}"] = e
        pts.append((c, t, e))
    out["oversub_penalty"] = fit_k(pts)
    return out
