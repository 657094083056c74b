"""Bottleneck diagnosis from one interval of job telemetry (pure; shared by policies).

A job is *network*-bound when a PS link runs near capacity and is the narrower side of the
step's transfer (more PS shards help), *worker-network*-bound when a worker link is at least
as busy (more PS would not help: with one worker, PS and worker links carry the same bytes), *gpu*-bound when its
workers' GPUs are busy most of the time, *input*-bound when its GPU workers' GPUs are not but
their CPUs are (the input pipeline cannot feed the GPU), *compute*-bound when its CPU workers
use most of their CPU limit, *ps*-bound when its PS containers do, and *none* when nothing is
saturated.

:func:`diagnose_table` diagnoses every job of a round's :class:`ReadingTable` at once;
:func:`diagnose` is the same for one job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from reamer.domain import JobTelemetry, JobView
from reamer.domain.readings import WORKER, ReadingTable


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a resource counts as saturated: CPU used ≥ ``cpu`` of its limit, a link ≥ ``net``
    of its capacity; the PS side is the narrower one when its link is busier than the worker
    links by ``side_margin`` (relative). A policy that diagnoses exposes its own
    (``policy.thresholds``); these are NEARCHUS's defaults."""

    cpu: float = 0.85
    net: float = 0.8
    side_margin: float = 0.1


DEFAULT_THRESHOLDS = Thresholds()


class Diagnosis(NamedTuple):
    """One job's diagnosis of one interval (a named tuple: made per job and interval)."""

    bottleneck: str  # "network" | "worker_network" | "gpu" | "input" | "compute" | "ps" | "none"
    worker_cpu_util: float  # mean used/limit of workers
    worker_throttled: float  # mean share of CFS periods throttled, workers
    gpu_util: float  # mean GPU busy share of GPU workers
    ps_cpu_util: float  # max used/limit of PS
    net_util: float  # max link utilization of the job's PS containers
    worker_net_util: float  # max link utilization of the job's workers
    cpu_used: float  # cores the job actually used
    ps_throttled: float = 0.0  # max share of CFS periods throttled, PS


# Diagnoses.bottleneck: an index into these
BOTTLENECKS = ("none", "network", "worker_network", "gpu", "input", "compute", "ps")


@dataclass(frozen=True, slots=True, eq=False)
class Diagnoses:
    """Every job of a :class:`ReadingTable` diagnosed (arrays in its ``jobs`` order; the fields
    of :class:`Diagnosis`, the bottleneck as an index into :data:`BOTTLENECKS`)."""

    bottleneck: np.ndarray
    worker_cpu_util: np.ndarray
    worker_throttled: np.ndarray
    gpu_util: np.ndarray
    ps_cpu_util: np.ndarray
    net_util: np.ndarray
    worker_net_util: np.ndarray
    cpu_used: np.ndarray
    ps_throttled: np.ndarray

    def at(self, i: int) -> Diagnosis:
        values = (float(getattr(self, f)[i]) for f in Diagnosis._fields[1:])
        return Diagnosis(BOTTLENECKS[int(self.bottleneck[i])], *values)


def diagnose_table(t: ReadingTable, cpu_sat: float, net_sat: float, side_margin: float = 0.1) -> Diagnoses:
    """Diagnose every job of ``t`` from its measured rows: the per-job reductions :func:`diagnose`
    describes, as array reductions (sums in row order: the same numbers as one job at a time)."""
    n, job, measured = len(t.jobs), t.job, t.measured
    w = measured & (t.role == WORKER)
    p = measured ^ w  # measured, not a worker: the PS side
    g = w & (t.gpus > 0)
    lim, cap = t.cpu_limit, t.net_capacity_gbps
    util = np.divide(t.cpu_used, lim, out=np.zeros(len(lim)), where=lim > 0)
    link = np.divide(t.net_gbps, cap, out=np.zeros(len(cap)), where=cap > 0)
    jw, jp, jg = job[w], job[p], job[g]
    workers = np.maximum(np.bincount(jw, minlength=n), 1)  # (a job with none sums 0: its mean is 0)
    gpu_workers = np.bincount(jg, minlength=n)
    wu = np.bincount(jw, util[w], n) / workers
    thr = np.bincount(jw, t.throttled_ratio[w], n) / workers
    gu = np.bincount(jg, t.gpu_util[g], n) / np.maximum(gpu_workers, 1)
    wnet, net, pu, ps_thr = np.zeros((4, n))  # maxima of values ≥ 0 (0 without any)
    for out, rows, x in ((wnet, jw, link[w]), (net, jp, link[p]), (pu, jp, util[p]),
                         (ps_thr, jp, t.throttled_ratio[p])):
        np.maximum.at(out, rows, x)
    used = np.bincount(job[measured], t.cpu_used[measured], n)
    cpu_bound = (wu >= cpu_sat) & (wu >= pu)
    code = BOTTLENECKS.index
    # the rules from the last to the first: an earlier one that holds wins
    b = np.where(pu >= cpu_sat, code("ps"), code("none"))
    b[cpu_bound] = code("compute")
    b[cpu_bound & (gpu_workers > 0)] = code("input")
    b[gu >= cpu_sat] = code("gpu")
    b[np.maximum(net, wnet) >= net_sat] = code("worker_network")
    b[(net >= net_sat) & (net > wnet * (1.0 + side_margin))] = code("network")
    return Diagnoses(b, wu, thr, gu, pu, net, wnet, used, ps_thr)


def diagnose(job: JobView, tel: JobTelemetry, cpu_sat: float, net_sat: float, side_margin: float = 0.1) -> Diagnosis:
    """One job's :class:`Diagnosis` of one interval (:func:`diagnose_table` of it alone).
    ``side_margin``: the PS side counts as the narrower one only when its link utilization
    exceeds the busiest worker link's by this relative margin (per-link transfer time ÷ step
    time is that link's utilization, so the busier side is the longer transfer; the margin
    keeps measurement noise from calling a tie)."""
    return diagnose_table(ReadingTable.of((job,), {job.id: tel}), cpu_sat, net_sat, side_margin).at(0)
