"""What one control round did, in plain terms, for whoever subscribes to rounds (the console,
the reports, the live dashboard, the benchmarks): a :class:`RoundRecord` per round, built once
here from the snapshots and decisions of :mod:`reamer.control`, and the one
:class:`RoundStream` the simulator, the local backend and the Kubernetes components publish
them to."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from reamer.control import Round
from reamer.domain import AddContainer, ClusterSnapshot, Preempt, RemoveContainer, Resize, Role, StartJob
from reamer.domain.inference import EvictReplica, HarvestSnapshot, MigrateReplica, PlaceReplica, ResizeReplica
from reamer.domain.readings import readings_of
from reamer.policies.diagnosis import BOTTLENECKS, DEFAULT_THRESHOLDS, Thresholds, diagnose_table

# the CPU bands of a node, bottom to top; they add up to its cores
CPU_BANDS = ("system", "training_need", "training_unused", "inference", "idle")


@dataclass
class RoundRecord:
    t: float
    speeds: dict[str, float]  # job → samples/s measured over the window (jobs with telemetry)
    bottlenecks: dict[str, str]  # job → diagnosis of the window
    shapes: dict[str, tuple[int, int, float]]  # job → (PS, workers, cores)
    decisions: list[str]
    inference: dict[str, dict] = field(default_factory=dict)  # service → replicas, p99, SLO, errors, rate
    node_cpu: dict[str, float] = field(default_factory=dict)  # node → training CPU used (cores)
    # node → cores and its CPU_BANDS; empty in a round that measured nothing (the simulator's
    # rounds at arrivals and completions between measurement windows)
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)  # per decision: what the round measured that led to it
    halves: list[str] = field(default_factory=list)  # which rounds it records: "training", "harvest" or both

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON (NaN and infinities as null)."""
        return _finite(asdict(self))


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


RoundHook = Callable[[RoundRecord], None]


def thresholds_of(policy: object) -> Thresholds:
    """The saturation thresholds the training policy diagnoses with (NEARCHUS's defaults when
    it has none): the record's diagnosis is the policy's own."""
    th = getattr(policy, "thresholds", None)
    return th if isinstance(th, Thresholds) else DEFAULT_THRESHOLDS


def describe(d: object) -> str:
    """A decision as one line: its type and fields."""
    return type(d).__name__ + " " + ", ".join(f"{k}={getattr(d, k)}" for k in getattr(d, "__slots__", ()))


def record(training: Round | None, harvest: Round | None, th: Thresholds) -> RoundRecord:
    """The record of one round: the training round's, the harvest round's or both (the joint
    loop, and the simulator and local backend, run both; each Kubernetes component one)."""
    if training is None and harvest is None:
        raise ValueError("record: expected a training round, a harvest round or both")
    rec = RoundRecord(t=(training or harvest).now, speeds={}, bottlenecks={}, shapes={}, decisions=[])  # type: ignore[union-attr]
    rec.halves = [k for k, r in (("training", training), ("harvest", harvest)) if r is not None]
    owner: dict[str, str] = {}  # container → job
    if training is not None:
        snap = training.snapshot
        assert isinstance(snap, ClusterSnapshot)
        tel = snap.telemetry
        rec.speeds = {jid: t.speed for jid, t in tel.items()}
        if tel:
            table = readings_of(snap)
            codes = diagnose_table(table, th.cpu, th.net, th.side_margin).bottleneck.tolist()
            rec.bottlenecks = {jid: BOTTLENECKS[b] for jid, b in zip(table.jobs, codes)}
        rec.shapes = {v.id: (len(v.of_role(Role.PS)), len(v.of_role(Role.WORKER)), round(v.allocated.cpu, 3))
                      for v in snap.running}
        for v in snap.running:
            t = tel.get(v.id)
            for c in v.containers:
                owner[c.id] = v.id
                if t is not None and c.id in t.containers:
                    rec.node_cpu[c.node] = rec.node_cpu.get(c.node, 0.0) + t.containers[c.id].cpu_used
        for n in snap.nodes if (tel or harvest is not None) else ():  # nodes only in a round that measured
            free = snap.free.get(n.name)
            alloc = n.cores - free.cpu if free is not None else 0.0
            rec.nodes[n.name] = {"cores": n.cores, "training_alloc": alloc,
                                 "training_used": rec.node_cpu.get(n.name, 0.0)}
        for d in training.decisions:
            rec.decisions.append(describe(d))
            rec.reasons.append(_training_reason(d, rec, owner, snap))
    if harvest is not None:
        hs = harvest.snapshot
        assert isinstance(hs, HarvestSnapshot)
        on_node: dict[str, float] = {}
        for sv in hs.services:
            rec.inference[sv.id] = {"p99_ms": None if sv.observed_p99_s is None else sv.observed_p99_s * 1e3,
                                    "slo_ms": sv.slo_p99_s * 1e3,
                                    "error_rate": sv.observed_error_rate,
                                    "rate": sv.predicted_rate_per_s,
                                    "replicas": [(r.node, r.cores) for r in sv.replicas]}
            for r in sv.replicas:
                on_node[r.node] = on_node.get(r.node, 0.0) + r.cores
        for n in hs.nodes:
            row = rec.nodes.setdefault(n.name, {"cores": n.cores})
            u = hs.usage.get(n.name)
            if u is not None:
                row["system"] = u.system_reserve
                row["training_need"] = u.training_need
                row.setdefault("training_alloc", u.training_limit if u.training_limit is not None else u.training_request)
            row["inference"] = on_node.get(n.name, 0.0)
        for d in harvest.decisions:
            rec.decisions.append(describe(d))
            rec.reasons.append(_harvest_reason(d, hs))
    for row in rec.nodes.values():
        _bands(row)
    return rec


def _bands(row: dict[str, float]) -> None:
    """Fill a node's CPU_BANDS from what was measured: training's need is the harvester's
    (NEARCHUS's allocation in the joint loop, else a high percentile of use) or, without one,
    the measured use; unused = training's allocation above its need; idle = the rest."""
    cores = row["cores"]
    system = row.setdefault("system", 0.0)
    need = row.setdefault("training_need", row.get("training_used", 0.0))
    alloc = row.get("training_alloc", need)
    row["training_unused"] = max(0.0, alloc - need)
    inference = row.setdefault("inference", 0.0)
    row["idle"] = max(0.0, cores - system - need - row["training_unused"] - inference)


def _training_reason(d: object, rec: RoundRecord, owner: dict[str, str], snap: ClusterSnapshot) -> str:
    if isinstance(d, StartJob):
        queued = next((v for v in snap.queue if v.id == d.job), None)
        return f"{d.job} was queued and fits" + (f" ({len(snap.queue)} queued)" if queued is not None else "")
    job = d.job if isinstance(d, AddContainer | Preempt) else owner.get(getattr(d, "container", ""), "")
    if not job:
        return ""
    parts = [f"{job} diagnosed {rec.bottlenecks[job]}" if job in rec.bottlenecks else f"{job}: no telemetry yet"]
    if job in rec.speeds:
        parts.append(f"{rec.speeds[job]:.1f} samples/s")
    if isinstance(d, Resize | RemoveContainer) and job in rec.shapes:
        ps, w, cores = rec.shapes[job]
        parts.append(f"{ps} PS {w} workers {cores:g} cores")
    return ", ".join(parts)


def _harvest_reason(d: object, hs: HarvestSnapshot) -> str:
    svc = {r.id: sv for sv in hs.services for r in sv.replicas}
    if isinstance(d, PlaceReplica):
        sv = next((s for s in hs.services if s.id == d.service), None)
        node = d.node
    elif isinstance(d, ResizeReplica | MigrateReplica | EvictReplica):
        sv = svc.get(d.replica)
        node = next((r.node for r in sv.replicas if r.id == d.replica), "") if sv is not None else ""
    else:
        return ""
    parts = []
    if sv is not None:
        p99 = "no p99 yet" if sv.observed_p99_s is None else f"p99 {sv.observed_p99_s * 1e3:.0f} ms"
        parts.append(f"{sv.id}: {p99} (SLO {sv.slo_p99_s * 1e3:.0f} ms), {sv.predicted_rate_per_s:.0f} req/s expected")
    u = hs.usage.get(node)
    if u is not None:
        parts.append(f"{node}: training needs {u.training_need:.2f} of {u.cores:g} cores")
    return "; ".join(parts)


class RoundStream:
    """The rounds of one run, in order, for readers in other threads (the dashboard): the
    backend's round loop :meth:`publish`-es, readers take :meth:`since` an index. It keeps the
    last ``keep`` rounds (a long simulation's early rounds drop off; indexes stay absolute).

    ``meta`` describes the run (scenario, backend, policies); ``finished`` says no more rounds
    will come. For a simulated run (finished before anyone looks) :meth:`replay` releases the
    rounds as the wall clock passes, ``speed`` simulated seconds per second."""

    def __init__(self, meta: dict[str, Any] | None = None, keep: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.meta = dict(meta or {})
        self.clock = clock
        self._rounds: deque[dict[str, Any]] = deque(maxlen=keep)
        self._first = 0  # absolute index of _rounds[0]
        self._lock = threading.Lock()
        self._finished = False
        self._replay: tuple[float, float, float] | None = None  # (wall start, first round's t, speed)

    def publish(self, rec: RoundRecord) -> None:
        with self._lock:
            if len(self._rounds) == self._rounds.maxlen:
                self._first += 1
            self._rounds.append(rec.to_json())

    def hook(self, then: Callable[[RoundRecord], None] | None = None) -> RoundHook:
        """An ``on_round`` that publishes each record, then hands it to ``then``."""
        def on_round(rec: RoundRecord) -> None:
            self.publish(rec)
            if then is not None:
                then(rec)
        return on_round

    def finish(self) -> None:
        with self._lock:
            self._finished = True

    def replay(self, speed: float) -> None:
        """From now on, release the rounds ``speed`` simulated seconds per wall second."""
        if not speed > 0:
            raise ValueError(f"speed: expected > 0, got {speed!r}")
        with self._lock:
            t0 = self._rounds[0]["t"] if self._rounds else 0.0
            self._replay = (self.clock(), t0, speed)

    def since(self, i: int) -> tuple[list[dict[str, Any]], int, bool]:
        """The rounds from absolute index ``i`` on (those still kept and, replaying, due), the
        next index to ask for, and whether the run is over and every round released."""
        with self._lock:
            rounds = list(self._rounds)
            first, done = self._first, self._finished
            if self._replay is not None:
                wall0, t0, speed = self._replay
                due = t0 + speed * (self.clock() - wall0)
                n = sum(1 for r in rounds if r["t"] <= due)
                done = done and n == len(rounds)
                rounds = rounds[:n]
        start = max(0, i - first)
        return rounds[start:], first + len(rounds), done

