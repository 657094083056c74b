"""Snapshots and decisions of the inference-harvesting loop (Cloud Reamer, docs/design.md#the-harvesting-loop).

A harvesting policy sees a :class:`HarvestSnapshot` — nodes, what training uses and needs on
each, and the inference services with their replicas — and returns a list of
:data:`HarvestDecision`. It never sees a backend.

Conventions shared by every harvesting policy and backend:

* cores are CPU cores (fractions allowed; a replica's ``cores`` is its CPU limit), memory MiB,
  times seconds, rates requests per second;
* a service's requests are split across its replicas in proportion to each replica's
  capacity at the SLO (weighted round-robin / least-outstanding-requests routing);
  :func:`reamer.models.inference.routing_weights` gives the weights;
* :class:`MigrateReplica` is make-before-break: the backend starts the new replica on
  ``to_node`` (same shape) and stops the old one only once the new one serves. The new
  replica has a new id (as a new pod would); the old id is gone once the round is applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from reamer.domain.cluster import Node


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """What training and the system use and need on one node, as last measured at ``metrics_at``.

    ``training_need`` is the cores training must be able to get: NEARCHUS's measured need
    (its allocations) in the joint loop, else a high percentile (p95) of training usage.
    ``training_request`` is what the training pods requested (what Kubernetes schedules by).
    ``training_used`` / ``system_used`` are window-averaged usage (what Koordinator-style
    reclaiming reads); ``None`` = same as ``training_need`` / ``system_reserve``.
    ``mem_used_mib`` is memory held by training and the system (not by inference).
    ``training_limit`` is the sum of the training containers' CPU limits: training can never
    take back more than that (NEARCHUS trims it to the measured need in the joint loop).
    """

    node: str
    cores: float
    system_reserve: float
    training_need: float
    training_request: float
    metrics_at: float
    training_used: float | None = None
    system_used: float | None = None
    mem_used_mib: float = 0.0
    training_limit: float | None = None  # Σ CPU limits of the training containers (None = unknown)

    @property
    def training_usage(self) -> float:
        return self.training_need if self.training_used is None else self.training_used

    @property
    def system_usage(self) -> float:
        return self.system_reserve if self.system_used is None else self.system_used


@dataclass(frozen=True, slots=True)
class Replica:
    """One running replica of an inference service: its node, CPU limit and batching."""

    id: str
    node: str
    cores: float
    max_batch: int
    max_wait_s: float


@dataclass(frozen=True, slots=True)
class ServiceState:
    """An inference service at one instant.

    ``predicted_rate_per_s``: the rate forecast for the next window (the policy sizes for it);
    ``observed_p99_s``: p99 latency measured over the last window (``None`` = no requests /
    no measurement yet).
    """

    id: str
    model: str
    slo_p99_s: float
    predicted_rate_per_s: float
    replicas: tuple[Replica, ...] = ()
    observed_p99_s: float | None = None
    mem_mib_per_replica: float = 2048.0
    min_replicas: int | None = None  # the service's own bounds (None: the policy's defaults)
    max_replicas: int | None = None
    observed_error_rate: float | None = None  # share of the last window's requests that failed (None: not measured)
    observed_at_s: float | None = None  # when that window was measured (None: not said; each round counts as a new window's)
    nodes: frozenset[str] | None = None  # the only nodes its replicas may run on (None: any)


@dataclass(frozen=True, slots=True)
class HarvestSnapshot:
    """The one thing a harvesting policy sees. ``pool`` names the dedicated inference pool:
    nodes with ``Node.pool == pool`` run no training and cost node-hours when used."""

    now: float
    nodes: tuple[Node, ...]
    usage: Mapping[str, NodeUsage] = field(default_factory=dict)  # by node name
    services: tuple[ServiceState, ...] = ()
    pool: str = "inference"


# ------------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class PlaceReplica:
    """Start a new replica of ``service`` on ``node`` (the backend names it)."""

    service: str
    node: str
    cores: float
    max_batch: int
    max_wait_s: float


@dataclass(frozen=True, slots=True)
class ResizeReplica:
    """Change a replica's CPU limit in place (no restart)."""

    replica: str
    cores: float


@dataclass(frozen=True, slots=True)
class MigrateReplica:
    """Move a replica to ``to_node``, make-before-break: start the new one (same shape), then
    stop the old one once the new one serves."""

    replica: str
    to_node: str


@dataclass(frozen=True, slots=True)
class EvictReplica:
    """Stop a replica (scale-down, or nowhere to move it)."""

    replica: str


HarvestDecision = PlaceReplica | ResizeReplica | MigrateReplica | EvictReplica
