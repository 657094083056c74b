"""``static``: the Kubernetes default. Each job gets exactly the user's request for its whole
life; FIFO order; a job starts only when all its containers fit (gang). With ``backfill``
(default, as kube-scheduler) later jobs that fit start ahead of a blocked head.

A round's cost does not grow with the queue: the policy keeps the queued jobs grouped by
request (as kube-scheduler's equivalence classes), and tries each group's jobs in FIFO
order only until one does not fit — free capacity only shrinks within a round, so the
group's later jobs would not fit either. The decisions are those of a scan of the whole
queue in order, skipping a request once it did not fit.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

from pydantic import BaseModel, ConfigDict

from reamer.domain import (
    ClusterSnapshot,
    Decision,
    JobView,
    Role,
    StartJob,
    TrainingJob,
)
from reamer.policies.placement import FreeMap, Strategy

_order = attrgetter("order")


class StaticConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    backfill: bool = True
    placement: Strategy = "spread"  # kube-scheduler LeastAllocated


def request_of(spec: TrainingJob) -> list[tuple[Role, object]]:
    return [(Role.PS, spec.ps_res)] * spec.ps + [(Role.WORKER, spec.worker_res)] * spec.workers


def shape_of(spec: TrainingJob) -> tuple[float, ...]:
    """A job's request as plain numbers, and whether it is one pod (jobs with the same place alike)."""
    p, w = spec.ps_res, spec.worker_res
    return (spec.ps, p.cpu, p.mem_mib, p.gpu, spec.workers, w.cpu, w.mem_mib, w.gpu, spec.one_node)


@dataclass
class _Group:
    """Queued jobs of one request, in FIFO order; those before ``head`` have left the queue
    (entries past it may have too: they are dropped when found)."""

    total: tuple[float, float, float]  # the request summed over its containers (cores, MiB, GPUs)
    jobs: list[JobView] = field(default_factory=list)
    head: int = 0


def _queued(queue: Sequence[JobView], v: JobView) -> bool:
    """Is ``v`` (its enqueue) still in ``queue``, which is sorted by ``order``?"""
    i = bisect_left(queue, v.order, key=_order)
    return i < len(queue) and queue[i].order == v.order and queue[i].id == v.id


class Static:
    name = "static"
    interval_s: float | None = None

    def __init__(self, config: StaticConfig | None = None) -> None:
        self.cfg = config or StaticConfig()
        self._free: FreeMap | None = None
        self._groups: dict[tuple[float, ...], _Group] = {}
        self._ids: dict[int, str] = {}  # order -> job id of the enqueues taken in
        self._seen = 0  # the highest order taken in
        self._nodes: object = None  # the snapshot's node tuple they came with (a new one: another state)

    def decide(self, snap: ClusterSnapshot) -> list[Decision]:
        queue = snap.queue
        if not queue:
            return []
        if queue[0].order <= 0:  # a snapshot made without the cluster state's queue numbers
            queue = tuple(replace(v, order=i) for i, v in enumerate(queue, 1))
            self._nodes = None  # taken in afresh each round
        self._take_in(queue, snap.nodes)
        heap: list[tuple[int, tuple[float, ...]]] = []
        for key, g in list(self._groups.items()):
            jobs = g.jobs
            while g.head < len(jobs) and not _queued(queue, jobs[g.head]):
                self._ids.pop(jobs[g.head].order, None)
                g.head += 1
            if g.head == len(jobs):
                del self._groups[key]
                continue
            if g.head > 64 and 2 * g.head > len(jobs):
                del jobs[:g.head]
                g.head = 0
            heap.append((jobs[g.head].order, key))
        heapq.heapify(heap)
        free = self._free = FreeMap(snap, self._free)
        left = [float(x) for x in free.free.sum(axis=0)]  # Σ free: a request above it cannot fit
        at: dict[tuple[float, ...], int] = {}
        out: list[Decision] = []
        while heap:
            _, key = heapq.heappop(heap)
            g = self._groups[key]
            k = at.get(key, g.head)
            job = g.jobs[k]
            placed = None
            if all(need <= have * (1 + 1e-9) + 1e-6 for need, have in zip(g.total, left, strict=True)):
                placed = free.place_gang(request_of(job.spec), self.cfg.placement, one_node=job.spec.one_node)
            if placed is None:  # this request does not fit now, nor will it later this round
                if not self.cfg.backfill:
                    break
                continue
            out.append(StartJob(job.id, placed))
            left = [have - need for have, need in zip(left, g.total, strict=True)]
            k += 1
            while k < len(g.jobs) and not _queued(queue, g.jobs[k]):
                k += 1
            if k < len(g.jobs):
                at[key] = k
                heapq.heappush(heap, (g.jobs[k].order, key))
        return out

    def _take_in(self, queue: Sequence[JobView], nodes: object) -> None:
        """Group the enqueues newer than any taken in (the queue's tail). If the queue does not
        continue what was taken in (another cluster state), start over from it."""
        i = bisect_left(queue, self._seen + 1, key=_order)
        if nodes is not self._nodes or (i > 0 and self._ids.get(queue[i - 1].order) != queue[i - 1].id):
            self._nodes = nodes
            self._seen = 0
            self._groups.clear()
            self._ids.clear()
            i = 0
        for v in queue[i:]:
            key = shape_of(v.spec)
            g = self._groups.get(key)
            if g is None:
                req = v.spec.request
                g = self._groups[key] = _Group((req.cpu, req.mem_mib, req.gpu))
            g.jobs.append(v)
            self._ids[v.order] = v.id
        if queue:
            self._seen = max(self._seen, queue[-1].order)
