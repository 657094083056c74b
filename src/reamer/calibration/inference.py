"""ONNX Runtime service time per (model, cores, batch), fitted to ``(a + b·batch) / E(cores)``.

Models: the real-workload models the local inference server serves
(:data:`reamer.workloads.real.nets.MODELS`, exported exactly as the server exports them,
:func:`~reamer.workloads.real.inference_server.export_onnx`) and, on request, the published
architectures of :mod:`reamer.calibration.archs`. Each session is configured like the
server's (:func:`~reamer.backends.local.launcher.ort_session_options`: ``cores`` intra-op
threads, sequential, no spinning). For every (model, batch) the sessions of all core counts
are timed in interleaved samples (slow machine drift cancels) after a warm-up; a sample is
back-to-back runs of >= ``sample_s``, 3-9 samples per point, the service time their median.
A sample during which other processes used more than 0.25 cores is discarded and retried for
up to ``max_point_s``; a point with fewer than two undisturbed samples is ``contended`` and
left out of the fit (unless too few points remain).

Fit (per model, used by :func:`reamer.models.inference.service_time_s`)::

    service_time(cores, batch) = (a + b * batch) / E(cores),   E(c) = 1 / ((1 - f) + f / c)

``a``, ``b`` and ``f`` minimise the squared log error over the undisturbed points.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from reamer.calibration.machine import LoadMeter

FOREIGN_MAX = 0.25  # cores of other processes' CPU use tolerated while a sample runs


def plan(name: str, quick: bool) -> tuple[list[int], float]:
    """Batch sizes and the seconds of timed work per (batch, cores) point."""
    from reamer.workloads.real.nets import MODELS as REAL

    if name in REAL:  # the server's default max batch is 16
        return ([1, 4, 16] if quick else [1, 2, 4, 8, 16]), (0.4 if quick else 1.5)
    slow = name in ("vgg16", "bert_base")
    if quick:
        return ([1, 4] if slow else [1, 2, 8]), 0.8
    return ([1, 2, 4] if slow else [1, 2, 4, 8]), 2.5


def steps(names: list[str], quick: bool) -> int:
    """Progress ticks :func:`measure` makes: one per (model, batch)."""
    return sum(len(plan(n, quick)[0]) for n in names)


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
    b0 = max(np.polyfit(bt[one], t[one], 1)[0], 1e-3) if len(set(bt[one])) >= 2 else t.min()
    res = least_squares(lambda x: np.log(model(x)) - np.log(t), x0=[max(t.min() * 0.1, 1e-4), b0, 0.8],
                        bounds=([0.0, 1e-6, 0.0], [np.inf, np.inf, 1.0]))  # fmt: skip
    a, b, f = (float(v) for v in res.x)
    err = model(res.x) / t - 1.0
    return {"a_ms": a, "b_ms": b, "parallel_fraction": f,
            "fit_rms_err_pct": float(100 * np.sqrt(np.mean(err**2)))}  # fmt: skip


def _onnx(name: str, tmp: Path) -> tuple[Path, tuple[int, ...], str, float, bool]:
    """(onnx file, input shape without batch, input description, params M, integer input)."""
    import torch

    from reamer.workloads.real.nets import INPUT_SHAPE, MODELS, build_model

    path = tmp / f"{name}.onnx"
    if name in MODELS:
        from reamer.workloads.real.inference_server import export_onnx

        export_onnx(name, path)
        n = sum(p.numel() for p in build_model(name).parameters()) / 1e6
        return path, INPUT_SHAPE, "x".join(map(str, INPUT_SHAPE)) + " image", n, False
    from reamer.calibration import archs

    model, x1, desc = archs.build_model(torch, name)
    archs.export(torch, model, x1, path)
    n = sum(p.numel() for p in model.parameters()) / 1e6
    return path, tuple(x1.shape[1:]), desc, n, x1.dtype == torch.int64


def measure(name: str, cores_list: list[int], quick: bool, tmp: Path, tick: Callable[[], None],
            max_point_s: float | None = None) -> dict:  # fmt: skip
    """The ``inference`` entry of one model (without ``source``)."""
    import onnxruntime as ort

    from reamer.backends.local.launcher import ort_session_options

    max_point_s = max_point_s if max_point_s is not None else (10.0 if quick else 30.0)
    path, shape1, desc, n_params, ints = _onnx(name, tmp)
    sessions = {c: ort.InferenceSession(str(path), ort_session_options(c), providers=["CPUExecutionProvider"])
                for c in cores_list}  # fmt: skip
    batches, budget = plan(name, quick)
    sample_s = 0.1 if quick else 0.2
    rng = np.random.default_rng(0)
    rows: list[tuple[int, int, float, bool]] = []
    meter = LoadMeter(time.process_time)
    for batch in batches:
        shape = (batch, *shape1)
        feed = {"input": rng.integers(0, 30522, shape, dtype=np.int64) if ints else rng.standard_normal(shape, dtype=np.float32)}

        def sample(sess, reps: int) -> tuple[float, float]:
            meter.reset()
            t0 = time.perf_counter()
            for _ in range(reps):
                sess.run(None, feed)
            return (time.perf_counter() - t0) / reps, meter.cores()

        first = {c: min(sample(s, 1)[0] for _ in range(2)) for c, s in sessions.items()}  # warm-up
        reps = {c: max(1, math.ceil(sample_s / t)) for c, t in first.items()}
        want = {c: int(min(9, max(3, budget / (reps[c] * t)))) for c, t in first.items()}
        times: dict[int, list[tuple[float, float]]] = {c: [] for c in cores_list}
        t_end = time.perf_counter() + max_point_s
        while any(len(times[c]) < want[c] for c in cores_list):  # interleave core counts against drift
            for c, s in sessions.items():
                if len(times[c]) >= want[c]:
                    continue
                t, load = sample(s, reps[c])
                if load < FOREIGN_MAX or time.perf_counter() > t_end:
                    times[c].append((t, load))
                else:
                    time.sleep(0.2)
        for c in cores_list:
            clean = [t for t, load in times[c] if load < FOREIGN_MAX]
            use = clean if len(clean) >= 2 else [t for t, _ in times[c]]
            rows.append((c, batch, statistics.median(use) * 1e3, len(clean) < 2))
        tick()
    good = [(c, b, ms) for c, b, ms, bad in rows if not bad]
    bad = [(c, b, ms) for c, b, ms, bad_ in rows if bad_]
    clean_fit = len(good) >= 3 and {c for c, _, _ in good} == set(cores_list)
    coef = fit(good if clean_fit else good + bad)
    return {"a_ms": round(coef["a_ms"], 4), "b_ms": round(coef["b_ms"], 4),
            "parallel_fraction": round(coef["parallel_fraction"], 4),
            "measured": [[c, b, round(ms, 4)] for c, b, ms in good],
            "contended": [[c, b, round(ms, 4)] for c, b, ms in bad],
            "fit_rms_err_pct": round(coef["fit_rms_err_pct"], 2), "params_m": round(n_params, 6),
            "input": desc}  # fmt: skip
