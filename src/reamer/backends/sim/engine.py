"""Event queue ordered by (time, priority, sequence): deterministic for equal times.

A queued event can be superseded (a job re-timed before its completion: its new completion is
queued, the old one stays where it is); :meth:`EventQueue.compact` drops the superseded ones,
so the queue holds about as many events as are live, not every one ever superseded."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from enum import IntEnum
from typing import Any


class Ev(IntEnum):
    """Event kinds; the value is the priority among events at the same time."""

    COMPLETION = 0
    ARRIVAL = 1
    TICK = 2
    HARVEST = 3  # inference harvest round and SLO window (after the training round)


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, Ev, int, Any]] = []
        self._seq = 0
        self.popped = 0  # events taken off the queue, and the superseded ones dropped before their time (compact)

    def push(self, t: float, kind: Ev, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))  # (an Ev compares as its int)

    def __len__(self) -> int:
        return len(self._heap)

    def peek_time(self) -> float:
        return self._heap[0][0]

    def pop(self) -> tuple[float, Ev, Any]:
        t, kind, _, payload = heapq.heappop(self._heap)
        self.popped += 1
        return t, kind, payload

    def compact(self, live: Callable[[Ev, Any], bool], until: float = float("inf")) -> int:
        """Drop the events ``live(kind, payload)`` says are superseded; returns how many. The
        others keep their order (each has its own sequence number). A dropped event due by
        ``until`` (the run's end) counts in ``popped`` as the pop it saves would have."""
        keep, dropped, due = [], 0, 0
        for e in self._heap:
            if live(e[1], e[3]):
                keep.append(e)
            else:
                dropped += 1
                due += e[0] <= until
        heapq.heapify(keep)
        self._heap = keep
        self.popped += due
        return dropped
