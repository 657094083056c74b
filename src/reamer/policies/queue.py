"""The queue grouped by request, so that a round's cost does not grow with the queue.

A policy that starts queued jobs in FIFO order and, once a job of some request did not fit,
skips that request for the rest of the round (free capacity only shrinks within a round, so
its later jobs would not fit either) makes the decisions of a scan of the whole queue while
looking only at each request's head. :class:`RequestGroups` keeps the queued jobs grouped by
a key of their request (as kube-scheduler's equivalence classes), FIFO within each group,
and :meth:`RequestGroups.scan` yields them in FIFO order across the groups until the caller
reports a miss for a group (:meth:`RequestGroups.miss`).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from reamer.domain import JobView, TrainingJob

_order = attrgetter("order")


@dataclass
class _Group:
    """Queued jobs of one key, in FIFO order; those before ``head`` have left the queue
    (entries past it may have too: they are dropped when found)."""

    jobs: list[JobView] = field(default_factory=list)
    head: int = 0


def _queued(queue: Sequence[JobView], v: JobView) -> bool:
    """Is ``v`` (its enqueue) still in ``queue``, which is sorted by ``order``?"""
    i = bisect_left(queue, v.order, key=_order)
    return i < len(queue) and queue[i].order == v.order and queue[i].id == v.id


class RequestGroups:
    """A policy's view of the queue: its jobs grouped by ``key(spec)``. Each round's
    :meth:`scan` takes in the enqueues newer than those it knows (the queue's tail); a queue
    that does not continue what it took in (another cluster state) is taken in afresh."""

    def __init__(self, key: Callable[[TrainingJob], Hashable]) -> None:
        self._key = key
        self._groups: dict[Hashable, _Group] = {}
        self._ids: dict[int, str] = {}  # order -> job id of the enqueues taken in
        self._seen = 0  # the highest order taken in
        self._nodes: object = None  # the snapshot's node tuple they came with (a new one: another state)
        self._missed: set[Hashable] = set()

    def scan(self, queue: Sequence[JobView], nodes: object) -> Iterator[tuple[Hashable, JobView]]:
        """The queued jobs as (key, job) in FIFO order, each group's only until :meth:`miss`
        is called with its key (during this scan)."""
        if not queue:
            return
        if queue[0].order <= 0:  # a snapshot made without the cluster state's queue numbers
            queue = tuple(v._replace(order=i) for i, v in enumerate(queue, 1))
            self._nodes = None  # taken in afresh each round
        self._take_in(queue, nodes)
        heap: list[tuple[int, Hashable]] = []
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
        missed = self._missed
        missed.clear()
        at: dict[Hashable, int] = {}
        while heap:
            _, key = heapq.heappop(heap)
            g = self._groups[key]
            k = at.get(key, g.head)
            yield key, g.jobs[k]
            if key in missed:  # this request does not fit now, nor will it later this round
                continue
            k += 1
            while k < len(g.jobs) and not _queued(queue, g.jobs[k]):
                k += 1
            if k < len(g.jobs):
                at[key] = k
                heapq.heappush(heap, (g.jobs[k].order, key))

    def miss(self, key: Hashable) -> None:
        """The job of ``key`` just yielded did not fit: the scan skips the rest of its group."""
        self._missed.add(key)

    def _take_in(self, queue: Sequence[JobView], nodes: object) -> None:
        i = bisect_left(queue, self._seen + 1, key=_order)
        if nodes is not self._nodes or (i > 0 and self._ids.get(queue[i - 1].order) != queue[i - 1].id):
            self._nodes = nodes
            self._seen = 0
            self._groups.clear()
            self._ids.clear()
            i = 0
        key = self._key
        for v in queue[i:]:
            k = key(v.spec)
            g = self._groups.get(k)
            if g is None:
                g = self._groups[k] = _Group()
            g.jobs.append(v)
            self._ids[v.order] = v.id
        if queue:
            self._seen = max(self._seen, queue[-1].order)
