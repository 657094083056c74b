"""Event queue ordered by (time, priority, sequence): deterministic for equal times."""

from __future__ import annotations

import heapq
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
        self.popped = 0

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
