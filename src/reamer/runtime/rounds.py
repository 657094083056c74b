"""What one control round did, in plain terms, for whoever subscribes to rounds (the console,
the reports, the benchmarks): a :class:`RoundRecord` per round, built once here from the
snapshots and decisions of :mod:`reamer.control`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from reamer.control import Round
from reamer.domain import ClusterSnapshot, Role
from reamer.domain.inference import HarvestSnapshot
from reamer.policies.diagnosis import DEFAULT_THRESHOLDS, Thresholds, diagnose


@dataclass
class RoundRecord:
    t: float
    speeds: dict[str, float]  # job → samples/s measured over the window (jobs with telemetry)
    bottlenecks: dict[str, str]  # job → diagnosis of the window
    shapes: dict[str, tuple[int, int, float]]  # job → (PS, workers, cores)
    decisions: list[str]
    inference: dict[str, dict] = field(default_factory=dict)  # service → replicas, p99, rate
    node_cpu: dict[str, float] = field(default_factory=dict)  # node → training CPU used (cores)


RoundHook = Callable[[RoundRecord], None]


def thresholds_of(policy: object) -> Thresholds:
    """The saturation thresholds the training policy diagnoses with (NEARCHUS's defaults when
    it has none): the record's diagnosis is the policy's own."""
    th = getattr(policy, "thresholds", None)
    return th if isinstance(th, Thresholds) else DEFAULT_THRESHOLDS


def describe(d: object) -> str:
    """A decision as one line: its type and fields."""
    return type(d).__name__ + " " + ", ".join(f"{k}={getattr(d, k)}" for k in getattr(d, "__slots__", ()))


def record(training: Round, harvest: Round | None, th: Thresholds) -> RoundRecord:
    snap = training.snapshot
    assert isinstance(snap, ClusterSnapshot)
    tel = snap.telemetry
    rec = RoundRecord(
        t=training.now,
        speeds={jid: t.speed for jid, t in tel.items()},
        bottlenecks={v.id: diagnose(v, tel[v.id], th.cpu, th.net, th.side_margin).bottleneck
                     for v in snap.running if v.id in tel},
        shapes={v.id: (len(v.of_role(Role.PS)), len(v.of_role(Role.WORKER)), round(v.allocated.cpu, 3))
                for v in snap.running},
        decisions=[describe(d) for d in training.decisions],
    )
    for v in snap.running:
        t = tel.get(v.id)
        for c in v.containers if t is not None else ():
            if c.id in t.containers:
                rec.node_cpu[c.node] = rec.node_cpu.get(c.node, 0.0) + t.containers[c.id].cpu_used
    if harvest is not None:
        rec.decisions += [describe(d) for d in harvest.decisions]
        hs = harvest.snapshot
        assert isinstance(hs, HarvestSnapshot)
        for sv in hs.services:
            rec.inference[sv.id] = {"p99_ms": None if sv.observed_p99_s is None else sv.observed_p99_s * 1e3,
                                    "rate": sv.predicted_rate_per_s,
                                    "replicas": [(r.node, r.cores) for r in sv.replicas]}
    return rec
