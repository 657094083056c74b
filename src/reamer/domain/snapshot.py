"""The one thing a policy sees: a snapshot of the cluster at ``now``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from reamer.domain.cluster import Node, Resources
from reamer.domain.jobs import JobView

if TYPE_CHECKING:
    from reamer.domain.readings import ReadingTable


class ContainerTelemetry(NamedTuple):
    """Measured over the last interval, per container (immutable; a named tuple: the
    simulator makes one per container and interval)."""

    cpu_used: float  # cores, average
    cpu_limit: float  # cores
    throttled_ratio: float  # share of CFS periods throttled, 0..1
    net_gbps: float  # average throughput
    net_capacity_gbps: float  # the link's capacity as seen by this container
    mem_used_mib: float = 0.0
    gpu_util: float = 0.0  # share of the container's GPU time busy, 0..1


class ChunkedViews(Sequence[JobView]):
    """An immutable sequence of job views made of immutable chunks (tuples), in order. A
    backend that keeps many views and changes a few of them between snapshots builds each
    snapshot from the chunks of the last one, rebuilding only the chunks that changed, so a
    snapshot costs O(chunks + changed chunks), not O(views)."""

    __slots__ = ("_chunks", "_len")

    def __init__(self, chunks: tuple[tuple[JobView, ...], ...]) -> None:
        self._chunks = chunks
        self._len = sum(map(len, chunks))

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[JobView]:
        return chain.from_iterable(self._chunks)

    def __getitem__(self, i):  # type: ignore[override]
        return tuple(self)[i]  # policies iterate; indexing (rare) goes through a tuple

    def __eq__(self, other: object) -> bool:  # equal to the tuple of the same views, as a tuple is
        return isinstance(other, tuple | ChunkedViews) and len(self) == len(other) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ChunkedViews({tuple(self)!r})"


class FreeByNode(Mapping[str, Resources]):
    """Free capacity by node name, read from a snapshot's rows (cores, MiB, GPUs) in node order:
    a snapshot hands the rows out once (``free_rows``) instead of a copy of a mapping of every
    node. ``index`` (node name -> row) and ``rows`` must not change."""

    __slots__ = ("_index", "_rows")

    def __init__(self, index: Mapping[str, int], rows: np.ndarray) -> None:
        self._index, self._rows = index, rows

    def __getitem__(self, name: str) -> Resources:
        cpu, mem, gpu = self._rows[self._index[name]].tolist()
        return Resources(cpu, mem, gpu)

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


class JobTelemetry(NamedTuple):
    """Measured over ``[since_s, now]`` for one running job (a named tuple: made per job and
    interval)."""

    since_s: float
    speed: float  # samples/s
    containers: Mapping[str, ContainerTelemetry] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    now: float
    nodes: tuple[Node, ...]
    free: Mapping[str, Resources]
    queue: tuple[JobView, ...]  # queued jobs, in arrival order (FIFO)
    running: Sequence[JobView]  # immutable: a tuple, or the simulator's ChunkedViews
    telemetry: Mapping[str, JobTelemetry] = field(default_factory=dict)  # by job id; empty between intervals
    # ``free`` as read-only rows (cores, MiB, GPUs) in ``nodes`` order (None: build them from ``free``)
    free_rows: np.ndarray | None = None
    containers_per_node: np.ndarray | None = None  # PS/worker containers per node, ``nodes`` order
    # ``telemetry`` as columns, where the backend measured it so (None: ``readings_of`` builds it)
    readings: ReadingTable | None = None
    # a periodic round (every round of a backend that runs rounds on a period); False: a round
    # the simulator runs between periods, on an arrival or a completion
    periodic: bool = True

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)
