"""Interference coefficients: training next to inference on the other core, versus each alone.

A PyTorch training loop (a PS worker's step of ``TRAIN_MODEL``) and ONNX Runtime inference
(back-to-back batches of ``INFER_MODEL``, sized like the inference server) run in two child
processes (:mod:`~reamer.calibration.worker`), each in its own cgroup pinned to its own CPU
(cpuset 0 and 1, one thread each), so there is no CPU over-commit: what remains is shared
caches, memory bandwidth and (on SMT siblings) the core itself. Each round measures training
alone, inference alone, then both at once; the slowdowns are medians of per-round ratios, and a
coefficient is kept only when its slowdown exceeds 1 by two standard errors of those ratios
(:func:`significant`; else 0 — on a VM whose speed drifts, a few-percent effect can be noise).

Coefficients in the form the simulator applies them (:mod:`reamer.backends.sim.inference`)::

    training speed ÷ (1 + training_interference × inference cores / node cores)
    replica latency × (1 + inference_interference × training use / node cores)

so ``training_interference = (s_train - 1) × nproc / 1`` (one inference core busy) and
``inference_interference = (s_infer - 1) × nproc / u`` (``u``: training's measured CPU use, cores).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from reamer.backends.local.cgroups import CgroupExecutor
from reamer.calibration.worker import Worker

TRAIN_MODEL, TRAIN_BATCH = "small_cnn", 32
INFER_MODEL, INFER_BATCH = "small_cnn", 8
TRAIN_CG, INFER_CG = "interference-train", "interference-infer"


def steps(rounds: int) -> int:
    return rounds


def measure(ex: CgroupExecutor, nproc: int, seconds: float, rounds: int, tick: Callable[[], None]) -> dict:
    """The ``interference`` section (without ``source``); always removes its cgroups."""
    made = []
    try:
        for name, cpu in ((TRAIN_CG, 0), (INFER_CG, 1)):
            ex.create(name)
            made.append(name)
            ex.set_cpuset(name, [cpu])
            ex.set_cpu(name, None)
        with Worker("train", TRAIN_MODEL, TRAIN_BATCH, ex, TRAIN_CG, wait=False) as tr, \
                Worker("infer", INFER_MODEL, INFER_BATCH, ex, INFER_CG, wait=False) as inf:  # fmt: skip
            tr.attach()
            inf.attach()
            ratios_t, ratios_i, use = [], [], []
            for _ in range(rounds):
                t_alone = tr.run(seconds)["rate"]
                i_alone = inf.run(seconds)["rate"]
                tr.send(seconds)
                inf.send(seconds)
                t_colo, i_colo = tr.result(), inf.result()
                ratios_t.append(t_alone / t_colo["rate"])
                ratios_i.append(i_alone / i_colo["rate"])
                use.append(t_colo["cpu_s"] / t_colo["wall_s"])
                tick()
    finally:
        for name in made:
            ex.remove(name, kill=True)
    s_t, s_i, u = statistics.median(ratios_t), statistics.median(ratios_i), statistics.median(use)
    sig_t, sig_i = significant(ratios_t), significant(ratios_i)
    return {
        "training_interference": round(max(0.0, s_t - 1.0) * nproc, 4) if sig_t else 0.0,
        "inference_interference": round(max(0.0, s_i - 1.0) * nproc / max(u, 1e-3), 4) if sig_i else 0.0,
        "diagnostics": {
            "training_significant": sig_t, "inference_significant": sig_i,
            "training_slowdown_ratio": round(s_t, 4), "inference_inflation_ratio": round(s_i, 4),
            "training_use_cores": round(u, 3), "training_ratio_spread": round(max(ratios_t) - min(ratios_t), 4),
            "inference_ratio_spread": round(max(ratios_i) - min(ratios_i), 4), "rounds": rounds,
            "window_s": seconds, "setup": f"train {TRAIN_MODEL} batch {TRAIN_BATCH} on cpu 0, "
                                         f"infer {INFER_MODEL} batch {INFER_BATCH} on cpu 1, 1 thread each",
        },
    }  # fmt: skip


def significant(ratios: list[float]) -> bool:
    """Is the slowdown real? Its median must exceed 1 by two standard errors of the per-round
    ratios; otherwise the coefficient is 0 (this machine's drift hides an effect that small)."""
    if len(ratios) < 3:
        return False
    se = statistics.stdev(ratios) / len(ratios) ** 0.5
    return statistics.median(ratios) - 1.0 > 2.0 * se
