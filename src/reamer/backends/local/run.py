"""The local control loop: one :func:`reamer.control.control_round` every ``interval_s`` of
wall-clock time against a :class:`LocalCluster`, until every job is done or ``max_s``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from reamer.backends.local.cluster import LocalCluster
from reamer.control import HarvestPolicy, JointHarvestBackend, Policy, control_round, joint_round
from reamer.domain import ClusterSnapshot, JobState, Role
from reamer.policies.diagnosis import diagnose


@dataclass
class RoundLog:
    t: float
    speeds: dict[str, float]  # job → samples/s over the window
    bottlenecks: dict[str, str]  # job → diagnosis of the window
    shapes: dict[str, tuple[int, int, float]]  # job → (PS, workers, cores)
    decisions: list[str]
    inference: dict[str, dict] = field(default_factory=dict)  # service → replicas, p99, rate
    node_cpu: dict[str, float] = field(default_factory=dict)  # host → training CPU used (cores)


@dataclass
class LocalResult:
    rounds: list[RoundLog] = field(default_factory=list)
    jct_s: dict[str, float] = field(default_factory=dict)
    restarts_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    unfinished: int = 0


def run_local(
    cluster: LocalCluster,
    policy: Policy,
    *,
    interval_s: float,
    max_s: float,
    cpu_saturation: float = 0.85,
    net_saturation: float = 0.8,
    on_round: Callable[[RoundLog], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    harvest: tuple[JointHarvestBackend, HarvestPolicy] | None = None,
    done: Callable[[], bool] | None = None,
) -> LocalResult:
    """Drive ``cluster`` with ``policy`` and, with ``harvest``, inference with its policy in
    the same tick (:func:`reamer.control.joint_round`: inference yields before training grows).
    Stops when every job is done (or ``done()`` says so) or after ``max_s``. The diagnosis
    logged per round is the same pure function NEARCHUS uses (thresholds given here)."""
    res = LocalResult()
    start = cluster.now()
    next_t = start
    while True:
        now = cluster.now()
        if harvest is None:
            rnd, h = control_round(cluster, policy, now), None
        else:
            rnd, h = joint_round(cluster, policy, harvest[0], harvest[1], now)
        snap, decisions = rnd.snapshot, rnd.decisions
        assert isinstance(snap, ClusterSnapshot)
        log = RoundLog(
            t=now,
            speeds={jid: t.speed for jid, t in snap.telemetry.items()},
            bottlenecks={v.id: diagnose(v, snap.telemetry[v.id], cpu_saturation, net_saturation).bottleneck
                         for v in snap.running if v.id in snap.telemetry},
            shapes={v.id: (len(v.of_role(Role.PS)), len(v.of_role(Role.WORKER)), round(v.allocated.cpu, 3))
                    for v in snap.running},
            decisions=[_describe(d) for d in decisions],
        )
        for v in snap.running:
            tel = snap.telemetry.get(v.id)
            for c in v.containers if tel is not None else ():
                if c.id in tel.containers:
                    log.node_cpu[c.node] = log.node_cpu.get(c.node, 0.0) + tel.containers[c.id].cpu_used
        if h is not None:
            log.decisions += [_describe(d) for d in h.decisions]
            assert h.snapshot is not None
            for sv in h.snapshot.services:  # type: ignore[union-attr]
                log.inference[sv.id] = {"p99_ms": None if sv.observed_p99_s is None else sv.observed_p99_s * 1e3,
                                        "rate": sv.predicted_rate_per_s,
                                        "replicas": [(r.node, r.cores) for r in sv.replicas]}
        res.rounds.append(log)
        if on_round is not None:
            on_round(log)
        if (done() if done is not None else cluster.finished) or now - start >= max_s:
            break
        next_t = max(next_t + interval_s, cluster.now())  # a slow round (a restart) skips ticks
        sleep(max(0.0, next_t - cluster.now()))
    for jid, j in cluster.jobs.items():
        if j.state is JobState.DONE and j.done_s is not None:
            res.jct_s[jid] = j.done_s - j.spec.arrival_s
        res.restarts_s.extend(j.restarts_s)
    res.unfinished = sum(1 for j in cluster.jobs.values() if j.state is not JobState.DONE)
    res.wall_s = cluster.now() - start
    return res


def _describe(d: object) -> str:
    return type(d).__name__ + " " + ", ".join(f"{k}={getattr(d, k)}" for k in getattr(d, "__slots__", ()))
