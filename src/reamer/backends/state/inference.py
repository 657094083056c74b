"""The inference half of the shared cluster state: services, their replicas and replica ids,
the rates and p99s measured per window, and the validation of every harvesting decision.

:meth:`ReplicaState.apply` checks a decision (known service, node and replica, CPU > 0),
books it and returns the :data:`ReplicaEffect` the backend carries out:
:class:`StartReplica`, :class:`SetReplicaQuota`, :class:`MoveReplica` (make-before-break:
start ``new``, then stop ``old``; the new replica has a new id, as a new pod would) and
:class:`StopReplica`.

What the harvesting policy sees of a training node is built here too, once for every
backend (:meth:`ReplicaState.node_usage`): the training containers' limits, requests and
memory from the :class:`~reamer.backends.state.training.ClusterState`, the use the backend
measured, and — in the joint round — the CPU training is about to take
(:meth:`ReplicaState.expect`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from reamer.backends.state.training import ClusterState, Growth
from reamer.domain import Decision, Node
from reamer.domain.decisions import InvalidDecision
from reamer.domain.inference import (
    EvictReplica,
    HarvestDecision,
    HarvestSnapshot,
    MigrateReplica,
    NodeUsage,
    PlaceReplica,
    Replica,
    ResizeReplica,
    ServiceState,
)


@dataclass
class ServiceRecord:
    """One inference service: its spec, replicas, and what was measured of it per window."""

    id: str
    model: str
    slo_p99_s: float
    mem_mib_per_replica: float
    replicas: dict[str, Replica] = field(default_factory=dict)
    next_id: int = 0
    observed_rates: list[float] = field(default_factory=list)  # requests/s per past window
    last_p99_s: float | None = None  # the last window's p99 (None: nothing measured)
    last_error_rate: float | None = None  # share of the last window's requests that failed (None: not measured)
    last_at_s: float | None = None  # when the last window was measured (None: not said)
    min_replicas: int | None = None  # the service's own bounds (None: the policy's defaults)
    max_replicas: int | None = None
    nodes: frozenset[str] | None = None  # the only nodes its replicas may run on (None: any)

    def forecast(self, first: float) -> float:
        """The rate expected next window: the last two windows' trend, never below the last
        (``first`` before anything was measured)."""
        if not self.observed_rates:
            return first
        r1 = self.observed_rates[-1]
        r2 = self.observed_rates[-2] if len(self.observed_rates) > 1 else r1
        return max(r1, r1 + (r1 - r2))


@dataclass(frozen=True, slots=True)
class StartReplica:
    service: str
    replica: Replica


@dataclass(frozen=True, slots=True)
class SetReplicaQuota:
    service: str
    replica: Replica  # as it is now
    before_cores: float


@dataclass(frozen=True, slots=True)
class MoveReplica:
    """Make-before-break: ``new`` serves before ``old`` stops."""

    service: str
    old: Replica
    new: Replica


@dataclass(frozen=True, slots=True)
class StopReplica:
    service: str
    replica: Replica


ReplicaEffect = StartReplica | SetReplicaQuota | MoveReplica | StopReplica


def _check_node(s: ServiceRecord, node: str) -> None:
    if s.nodes is not None and node not in s.nodes:
        some = ", ".join(sorted(s.nodes)[:5]) + (", ..." if len(s.nodes) > 5 else "")
        raise InvalidDecision(f"service {s.id}: a replica may not run on {node} (its nodes: {some or 'none'})")


class ReplicaState:
    """Services and replicas on ``nodes`` (training nodes and the dedicated pool), beside
    the training state ``training``."""

    def __init__(self, training: ClusterState, services: Iterable[ServiceRecord], nodes: Sequence[Node],
                 pool: str = "inference") -> None:
        self.training = training
        self.services = {s.id: s for s in services}
        self.nodes = tuple(nodes)
        self.node_names = {n.name for n in self.nodes}
        self.pool = pool
        self.owner = {r.id: s.id for s in self.services.values() for r in s.replicas.values()}  # replica -> service
        self._expected: dict[str, Growth] = {}  # node -> what training is about to take (joint round)

    # ------------------------------------------------------------------ decisions
    def apply(self, d: HarvestDecision) -> ReplicaEffect:
        """Validate ``d``, book it, and return what the backend must carry out. An invalid
        decision raises :class:`InvalidDecision` and changes nothing."""
        if isinstance(d, PlaceReplica):
            s = self.services.get(d.service)
            if s is None or d.node not in self.node_names or not d.cores > 0:
                raise InvalidDecision(f"place {d}: unknown service or node, or no cores")
            _check_node(s, d.node)
            return StartReplica(s.id, self._add(s, d.node, d.cores, d.max_batch, d.max_wait_s))
        if not isinstance(d, ResizeReplica | MigrateReplica | EvictReplica):
            raise InvalidDecision(f"unknown decision {d!r}")
        s, r = self._replica(d.replica)
        if isinstance(d, ResizeReplica):
            if not d.cores > 0:
                raise InvalidDecision(f"resize {d.replica} to {d.cores} cores")
            new = s.replicas[r.id] = Replica(r.id, r.node, d.cores, r.max_batch, r.max_wait_s)
            return SetReplicaQuota(s.id, new, r.cores)
        if isinstance(d, MigrateReplica):
            if d.to_node not in self.node_names:
                raise InvalidDecision(f"migrate {d.replica}: unknown node {d.to_node}")
            _check_node(s, d.to_node)
            new = self._add(s, d.to_node, r.cores, r.max_batch, r.max_wait_s)
            self._drop(s, r)
            return MoveReplica(s.id, r, new)
        self._drop(s, r)
        return StopReplica(s.id, r)

    def undo(self, e: ReplicaEffect) -> None:
        """Take back a booked effect the backend could not carry out (a replica that never
        listened): the state is again what the backend runs."""
        s = self.services[e.service]
        if isinstance(e, StartReplica | MoveReplica):
            self._drop(s, e.replica if isinstance(e, StartReplica) else e.new)
        if isinstance(e, MoveReplica):
            s.replicas[e.old.id] = e.old
            self.owner[e.old.id] = s.id

    def remove(self, rid: str) -> Replica | None:
        """A replica that died or hung is gone (no decision asked for it): out of the state."""
        sid = self.owner.get(rid)
        if sid is None:
            return None
        s = self.services[sid]
        r = s.replicas[rid]
        self._drop(s, r)
        return r

    def _add(self, s: ServiceRecord, node: str, cores: float, max_batch: int, max_wait_s: float) -> Replica:
        r = Replica(f"{s.id}/r{s.next_id}", node, cores, max_batch, max_wait_s)
        s.next_id += 1
        s.replicas[r.id] = r
        self.owner[r.id] = s.id
        return r

    def _drop(self, s: ServiceRecord, r: Replica) -> None:
        del s.replicas[r.id]
        del self.owner[r.id]

    def _replica(self, rid: str) -> tuple[ServiceRecord, Replica]:
        sid = self.owner.get(rid)
        if sid is None:
            raise InvalidDecision(f"unknown replica {rid}")
        s = self.services[sid]
        return s, s.replicas[rid]

    # ------------------------------------------------------------------ reads
    def replicas(self) -> list[tuple[ServiceRecord, Replica]]:
        return [(s, r) for s in self.services.values() for r in s.replicas.values()]

    def cores_on(self) -> dict[str, float]:
        """Inference cores (replica limits) per node that has replicas."""
        out: dict[str, float] = {}
        for s in self.services.values():
            for r in s.replicas.values():
                out[r.node] = out.get(r.node, 0.0) + r.cores
        return out

    # ------------------------------------------------------------------ the policy's view
    def expect(self, decisions: Sequence[Decision]) -> None:
        """Training decided ``decisions`` and applies them right after this harvest round: the
        CPU, requests and memory they add on a node count as training's in the next
        :meth:`node_usage`."""
        self._expected = self.training.growth(decisions)

    def node_usage(self, node: Node, now: float, *, reserve: float, need: float | None, used: float) -> NodeUsage:
        """What the policy sees of training on ``node``: ``need`` (``None``: the containers'
        CPU limits) and ``used`` as the backend measured them, the limits, requests and
        memory of the training containers there, plus what this round's training decisions
        are about to take (CPU counted into need and limits; used once per :meth:`expect`)."""
        limits, request, mem = self.training.node_totals(node.name)
        g = self._expected.pop(node.name, Growth())
        need = limits if need is None else need
        return NodeUsage(node.name, node.cores, reserve, need + g.cpu, request + g.request, now, training_used=used,
                         mem_used_mib=mem + g.mem_mib, training_limit=limits + g.cpu)

    def snapshot(self, now: float, usage: dict[str, NodeUsage], first_rates: dict[str, float]) -> HarvestSnapshot:
        """The harvesting policy's snapshot; ``first_rates`` is each service's rate forecast
        before any window was measured."""
        self._expected = {}
        services = tuple(ServiceState(s.id, s.model, s.slo_p99_s, s.forecast(first_rates[s.id]),
                                      tuple(s.replicas.values()), s.last_p99_s, s.mem_mib_per_replica,
                                      s.min_replicas, s.max_replicas, s.last_error_rate, s.last_at_s, s.nodes)
                         for s in self.services.values())
        return HarvestSnapshot(now, self.nodes, usage, services, self.pool)
