"""The training CPU need of GPU jobs over time: a mean-one factor per job and window on its
input pipeline's cost per sample (docs/design.md#trainings-cpu-need).

Each job follows a log-normal AR(1) process: with ``e`` the log of its factor,
``e' = corr·e + sd·√(1 − corr²)·ξ`` (``ξ`` standard normal), factor ``exp(e − sd²/2)``, so the
factor's mean is 1 and its stationary coefficient of variation ``√(exp(sd²) − 1)``. Where
``sd`` and ``corr`` come from:

* a number (``need_variation``, with ``need_corr``): every job the same;
* ``pai2020``: each job its own pair, drawn (seeded) from the pairs fitted to the 40 worker
  series of Alibaba PAI's mini-batch times (``reamer/data/need_variation.json``, written by
  ``tools/fit_need_variation.py``): most jobs vary by a few percent, a few by tens of percent.
  The pairs reproduce each series' coefficient of variation. One window of the simulation
  takes one sample of the trace's (one per 10 iterations).

The *level* of the need is one scale on every model's input cost (``need_scale``): a GPU
worker's pipeline needs the zoo's CPU per sample × its GPU rate × the scale. ``pai2020``
calibrates the scale on a run's own GPU jobs so that the share of them needing more CPU than
they request is PAI's (:data:`PAI2020_SHARE_ABOVE_REQUEST`, 15.51 %): the spread of the level
comes from the jobs' own requests and models.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from reamer.domain import TrainingJob
from reamer.models.training import ModelProfile


NORMALS_AHEAD = 64  # normals a job's stream draws at once (one per window)


@dataclass(frozen=True, slots=True)
class Ar1:
    """One job's log-normal AR(1): log standard deviation and window-to-window correlation."""

    sd_log: float
    corr: float


@cache
def pai2020_variation() -> tuple[Ar1, ...]:
    """The (sd, corr) pairs fitted to PAI's mini-batch times, one per worker series."""
    doc = json.loads(resources.files("reamer.data").joinpath("need_variation.json").read_text())
    return tuple(Ar1(float(s["sd_log"]), float(s["corr"])) for s in doc["series"])


class NeedProcess:
    """Every running job's need factor, redrawn once per window (:meth:`step`).

    Each job draws from its own stream, seeded by the run's ``seed`` and the job's id: a job
    has the same process and the same factors, window by window from its start, whichever
    other jobs run beside it — so policies compared on one seed face the same need per job
    (common random numbers), not draws reshuffled by the order jobs happen to start in."""

    def __init__(self, seed: int, params: Ar1 | Sequence[Ar1]) -> None:
        self.seed = int(seed)
        self.params = params
        # job -> (log factor, process, stream, its next normals, how many of them are used)
        self.state: dict[str, tuple[float, Ar1, np.random.Generator, np.ndarray, int]] = {}

    def _stream(self, jid: str) -> np.random.Generator:
        key = int.from_bytes(hashlib.blake2b(jid.encode(), digest_size=8).digest(), "little")
        return np.random.default_rng([self.seed, key])

    def step(self, jobs: Iterable[str]) -> dict[str, float]:
        """The factors of ``jobs`` for the coming window; jobs not listed are forgotten. A new
        job starts at a draw of its process's stationary law. A stream's normals are drawn
        ``NORMALS_AHEAD`` at a time: the same numbers, in the same order, as one per draw."""
        out = {}
        state = {}
        for jid in jobs:
            prev = self.state.get(jid)
            if prev is None:
                rng = self._stream(jid)
                p = self.params if isinstance(self.params, Ar1) else self.params[int(rng.integers(len(self.params)))]
                xs, i = rng.standard_normal(NORMALS_AHEAD), 1
                e = float(xs[0]) * p.sd_log
            else:
                e, p, rng, xs, i = prev
                if i == len(xs):
                    xs, i = rng.standard_normal(NORMALS_AHEAD), 0
                e = p.corr * e + float(xs[i]) * p.sd_log * math.sqrt(1.0 - p.corr * p.corr)
                i += 1
            state[jid] = (e, p, rng, xs, i)
            out[jid] = math.exp(e - 0.5 * p.sd_log * p.sd_log)
        self.state = state
        return out


# Share of PAI tasks whose mean CPU usage exceeded their request: Alibaba cluster-trace-gpu-v2020,
# analysis/analysis.ipynb, "Figure 6: Task resource request and usage" (Weng et al., "MLaaS in
# the Wild", NSDI 2022), printed by analysis/utils.py plan_minus_usg_over_cap_task:
# "cpu: plan > usage: 84.46%, plan < usage: 15.51%" (PAI lets an instance use spare CPU of its host).
PAI2020_SHARE_ABOVE_REQUEST = 0.1551


def share_above(scale: float, requests: np.ndarray, needs: np.ndarray) -> float:
    """Share of jobs whose CPU need at full GPU speed × ``scale`` exceeds their request
    (``requests``, ``needs``: per job, in the same unit)."""
    return float((scale * needs > requests).mean())


def input_need(model: ModelProfile, gpus: float) -> float:
    """Cores a GPU worker's input pipeline keeps busy to feed ``gpus`` GPUs at the model's
    rate (the zoo's CPU per sample × GPU samples/s), at scale 1; 0 for a CPU worker."""
    return model.input_core_s_per_sample * model.gpu_samples_per_s * gpus


def calibrate_scale(requests: Sequence[float], needs: Sequence[float],
                    share: float = PAI2020_SHARE_ABOVE_REQUEST) -> float:
    """The input-cost scale at which ``share`` of the jobs need more CPU than they request
    (:func:`share_above`, to 0.1 % of the scale). Jobs of one request cross it together, so the
    share jumps: of the scales either side of the jump, the one whose share is nearer."""
    req = np.asarray(requests, dtype=float)
    need = np.asarray(needs, dtype=float)
    if req.size == 0 or req.shape != need.shape or not (need > 0).any() or not 0.0 < share < 1.0:
        raise ValueError("calibrate_scale: expected a request and a need per job, a positive need and 0 < share < 1")
    lo, hi = 0.0, 1.0
    while share_above(hi, req, need) < share:
        hi *= 2.0
        if hi > 1e9:
            raise ValueError(f"calibrate_scale: no scale reaches a share of {share} (most jobs need no CPU?)")
    while hi - lo > 1e-3 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if share_above(mid, req, need) < share else (lo, mid)
    return lo if share - share_above(lo, req, need) < share_above(hi, req, need) - share else hi


def need_scale(setting: float | str, jobs: Sequence[TrainingJob], models: Mapping[str, ModelProfile]) -> float:
    """The scale on every model's input cost a run uses: ``setting`` itself, or for ``pai2020``
    the one :func:`calibrate_scale` finds on the run's GPU jobs (their workers' requests and
    their models' :func:`input_need`); 1 when none of them needs CPU for its input."""
    if setting != "pai2020":
        return float(setting)
    req, need = [], []
    for j in jobs:
        m = models.get(j.model)
        if m is not None and j.worker_res.gpu > 0 and m.gpu_samples_per_s > 0:
            req.append(j.worker_res.cpu)
            need.append(input_need(m, j.worker_res.gpu))
    if not req or not any(n > 0 for n in need):
        return 1.0
    return calibrate_scale(req, need)
