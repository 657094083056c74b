"""Training jobs (the spec a user submits, and its live view) and inference services."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from reamer.domain.cluster import Container, Resources, Role


@dataclass(frozen=True, slots=True)
class TrainingJob:
    """What a user submits: a parameter-server data-parallel training job.

    ``ps``/``workers`` and ``ps_res``/``worker_res`` are the user's request (what the
    ``static`` policy keeps for the job's life). ``samples`` is the work to do.

    ``duration_s`` (optional): a fixed wall-clock run time, as a pod deleted at the end of its
    lifetime: the job completes at its first start + ``duration_s`` whatever its speed, having
    done the samples its speed allowed (``samples`` is then only its nominal size, e.g. the work
    at its request speed, which policies may read; its progress is not capped by it).

    ``one_node``: the job's PS and workers are the containers of one pod (openb's GPU pods): they
    are placed on one node, and their gradient traffic stays in the host, off the NIC.

    ``ps_nodes``/``worker_nodes`` (optional): the only nodes a PS / a worker may be placed on (a pod
    template's node selector, required node affinity and tolerated taints; an openb pod's allowed
    GPU models); None: any node. A placement is checked when it is decided; a container already
    running stays where it is when the set changes (Kubernetes' IgnoredDuringExecution).
    """

    id: str
    model: str
    arrival_s: float
    samples: float
    ps: int
    workers: int
    ps_res: Resources
    worker_res: Resources
    batch: int = 32
    max_ps: int = 8
    max_workers: int = 16
    max_cores_per_container: float = 16.0
    duration_s: float | None = None
    one_node: bool = False
    ps_nodes: frozenset[str] | None = None
    worker_nodes: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.duration_s is not None and not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"job {self.id}: duration_s must be a finite number > 0, got {self.duration_s!r}")

    @property
    def request(self) -> Resources:
        return self.ps_res.scale(self.ps) + self.worker_res.scale(self.workers)

    def nodes_for(self, role: Role) -> frozenset[str] | None:
        """The nodes a container of ``role`` may be placed on (None: any)."""
        return self.ps_nodes if role is Role.PS else self.worker_nodes


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


class JobView(NamedTuple):
    """A job as a policy sees it at one instant (immutable; a named tuple: the simulator makes
    one per running job and telemetry interval)."""

    spec: TrainingJob
    state: JobState
    containers: tuple[Container, ...] = ()
    samples_done: float = 0.0  # as last reported, at ``progress_s``
    progress_s: float = 0.0
    started_s: float | None = None
    last_change_s: float | None = None  # last time its allocation changed
    order: int = 0  # queued jobs: its place in the FIFO queue (increasing along the queue)

    @property
    def remaining(self) -> float:
        return max(0.0, self.spec.samples - self.samples_done)

    @property
    def id(self) -> str:
        return self.spec.id

    def of_role(self, role: Role) -> tuple[Container, ...]:
        return tuple([c for c in self.containers if c.role is role])  # (a list first: faster than a generator)

    @property
    def allocated(self) -> Resources:
        total = Resources()
        for c in self.containers:
            total = total + c.res
        return total


@dataclass(frozen=True, slots=True)
class InferenceService:
    """A latency-SLO inference service."""

    id: str
    model: str
    slo_p99_ms: float
    peak_rate_per_s: float = 0.0
    mem_mib_per_replica: float = 2048.0
