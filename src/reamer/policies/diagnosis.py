"""Bottleneck diagnosis from one interval of job telemetry (pure; shared by policies).

A job is *network*-bound when a PS link runs near capacity and is the narrower side of the
step's transfer (more PS shards help), *worker-network*-bound when a worker link is at least
as busy (more PS would not help: with one worker, PS and worker links carry the same bytes), *gpu*-bound when its
workers' GPUs are busy most of the time, *input*-bound when its GPU workers' GPUs are not but
their CPUs are (the input pipeline cannot feed the GPU), *compute*-bound when its CPU workers
use most of their CPU limit, *ps*-bound when its PS containers do, and *none* when nothing is
saturated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from reamer.domain import JobTelemetry, JobView, Role


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


def diagnose(job: JobView, tel: JobTelemetry, cpu_sat: float, net_sat: float, side_margin: float = 0.1) -> Diagnosis:
    """``side_margin``: the PS side counts as the narrower one only when its link utilization
    exceeds the busiest worker link's by this relative margin (per-link transfer time ÷ step
    time is that link's utilization, so the busier side is the longer transfer; the margin
    keeps measurement noise from calling a tie)."""
    w_util, ps_util, thr, gpu, net, wnet, used, ps_thr = [], [], [], [], 0.0, 0.0, 0.0, 0.0
    get, worker = tel.containers.get, Role.WORKER
    for c in job.containers:
        t = get(c.id)
        if t is None:
            continue
        util = t.cpu_used / t.cpu_limit if t.cpu_limit > 0 else 0.0
        link = t.net_gbps / t.net_capacity_gbps if t.net_capacity_gbps > 0 else None
        if c.role is worker:
            w_util.append(util)
            thr.append(t.throttled_ratio)
            if c.res.gpu > 0:
                gpu.append(t.gpu_util)
            if link is not None:
                wnet = max(wnet, link)
        else:
            ps_util.append(util)
            ps_thr = max(ps_thr, t.throttled_ratio)
            if link is not None:
                net = max(net, link)
        used += t.cpu_used
    wu = sum(w_util) / len(w_util) if w_util else 0.0
    pu = max(ps_util, default=0.0)
    gu = sum(gpu) / len(gpu) if gpu else 0.0
    if net >= net_sat and net > wnet * (1.0 + side_margin):
        b = "network"
    elif max(net, wnet) >= net_sat:
        b = "worker_network"
    elif gu >= cpu_sat:
        b = "gpu"
    elif wu >= cpu_sat and wu >= pu:
        b = "input" if gpu else "compute"  # GPU workers short of CPU: their input pipeline starves the GPU
    elif pu >= cpu_sat:
        b = "ps"
    else:
        b = "none"
    return Diagnosis(b, wu, sum(thr) / len(thr) if thr else 0.0, gu, pu, net, wnet, used, ps_thr)
