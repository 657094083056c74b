"""Dynamic batching with admission control in front of one ONNX Runtime session.

One batcher thread owns the session (ONNX Runtime releases the GIL in ``run``, so the event
loop keeps serving while a batch runs). Requests wait in one bounded FIFO queue; the
batcher takes the first waiting request, then keeps collecting until ``max_batch`` samples
wait or ``max_wait_ms`` has passed since it found the queue non-empty, and runs one batch
of up to ``max_batch`` samples (a request is never split).

Admission (:meth:`Batcher.admit`, called on the event loop; nothing blocks there):

- the queue holds at most ``max_queue_samples`` samples: past that → shed ``queue_full``;
- the expected completion of the request is estimated from what is ahead of it — the rest of
  the running batch, the queued samples plus its own in batches of ``max_batch``, each at its
  measured service time — and if it lies past the request's deadline the request is shed
  ``deadline`` at once, without queueing (the client learns in microseconds, not after its
  deadline; ``Retry-After`` says when the queue is expected to have drained enough);
- a queued request whose deadline has passed when the batcher would take it, or would pass
  before its batch is done (at the batch's measured service time), is dropped (``expired``),
  not computed: its answer would come after its client gave up.

Service times: per batch size an exponentially weighted moving average of the measured wall
time of a batch from the moment it is taken to the moment its results are handed back
(``session.run`` and the batcher's own Python work, on this replica's CPU share, with the
event loop competing for the same cores and the GIL: under overload on one core that is a
third more than ``session.run`` alone, bench/overload.py), seeded at start by
:meth:`Batcher.warm_up` (sizes 1 and ``max_batch``) and interpolated linearly between measured
sizes. ``EWMA_ALPHA`` = 0.1: the average follows a change (a CPU quota resize) within about
ten batches, tens of milliseconds to a second at the rates served here.

Results: a request admitted from a running asyncio event loop gets an ``asyncio.Future`` of
that loop, and the batcher hands a whole batch's results back with one
``loop.call_soon_threadsafe`` (one wake-up of the loop and one GIL hand-over per batch, not
one per request: with one per request, the batcher thread waited for the GIL up to eight
times a batch under load); otherwise a :class:`concurrent.futures.Future`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

EWMA_ALPHA = 0.1
MAX_WINDOW = 10  # batches: the EWMA's horizon (1 / EWMA_ALPHA)
# Admission margin: the MARGIN_QUANTILE percentile of how much later than predicted the
# requests answered in the last MARGIN_WINDOW_S seconds were, recomputed
# every MARGIN_EVERY answers (0.3 s at the ~300 requests/s of bench/overload.py: the window
# holds ~600, short enough to follow the onset of overload, long enough for a p99). It learns
# only from answered requests, so it expires with them: once nothing was answered for
# MARGIN_WINDOW_S (a transient made it so large that everything is shed) it is 0 again.
# The SLOs here judge the 99th percentile: 1 % of requests may be late. Under overload the
# admitted requests are answered close to their deadline, so a request is late when either
# this margin or the client's allowance for the way there and back (the load generator's
# OUTSIDE_QUANTILE) falls short; each is held to half of that 1 % (a union bound), or the two
# would miss ~2 % together.
MARGIN_QUANTILE = 99.5
MARGIN_WINDOW_S = 2.0
MARGIN_EVERY = 100
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Shed:
    """A request not computed: ``reason`` (``queue_full``, ``deadline``, ``expired``,
    ``stopping``), the wait it would have had and when to retry (seconds)."""

    reason: str
    expected_wait_s: float
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class Served:
    """A computed request: its rows of the batch output, the size of that batch and when it
    was predicted at admission to be answered (on the batcher's clock)."""

    out: np.ndarray
    batch: int
    predicted: float


@dataclass(frozen=True, slots=True)
class Failed:
    error: str


Outcome = Served | Shed | Failed


class ServiceTimes:
    """Per batch size 1..``max_batch``, the service time (seconds) admission predicts with: the
    larger of an EWMA of the measured times and the largest of the last ``window`` measured
    (a windowed max filter, as BBR keeps for bandwidth, over about the EWMA's horizon). The
    EWMA alone lags a step in load by about ten batches, and under overload the queue fills
    to the deadline within that lag on the old, shorter times."""

    def __init__(self, max_batch: int, alpha: float = EWMA_ALPHA, window: int = MAX_WINDOW):
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha: expected in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.ewma: list[float | None] = [None] * (max_batch + 1)
        self.recent: list[deque[float]] = [deque(maxlen=max(1, window)) for _ in range(max_batch + 1)]
        self.t: list[float | None] = [None] * (max_batch + 1)

    def observe(self, n: int, seconds: float) -> None:
        old = self.ewma[n]
        self.ewma[n] = seconds if old is None else old + self.alpha * (seconds - old)
        self.recent[n].append(seconds)
        self.t[n] = max(self.ewma[n], max(self.recent[n]))

    def estimate(self, n: int) -> float:
        """Measured at ``n``, else interpolated between the nearest measured sizes (beyond the
        largest measured one: proportional to ``n``; none measured: 0)."""
        if n <= 0:
            return 0.0
        v = self.t[n]
        if v is not None:
            return v
        lo = next((k for k in range(n - 1, 0, -1) if self.t[k] is not None), None)
        hi = next((k for k in range(n + 1, len(self.t)) if self.t[k] is not None), None)
        if lo is not None and hi is not None:
            tl, th = self.t[lo], self.t[hi]
            assert tl is not None and th is not None
            return tl + (th - tl) * (n - lo) / (hi - lo)
        k = lo if lo is not None else hi
        if k is None:
            return 0.0
        tk = self.t[k]
        assert tk is not None
        return tk * n / k


class _Pending:
    __slots__ = ("deadline", "future", "loop", "n", "predicted", "x")

    def __init__(self, x: np.ndarray, deadline: float, predicted: float):
        self.x, self.n, self.deadline, self.predicted = x, len(x), deadline, predicted
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        self.future: Future[Outcome] | asyncio.Future[Outcome] = (
            Future() if self.loop is None else self.loop.create_future())


def _resolve(done: list[tuple[_Pending, Outcome]]) -> None:
    """Set each result (on the futures' event loop, or any thread for concurrent ones)."""
    for p, outcome in done:
        if not p.future.done():  # an asyncio future can have been cancelled (client gone)
            p.future.set_result(outcome)


def _deliver(done: list[tuple[_Pending, Outcome]]) -> None:
    """Hand results back: one ``call_soon_threadsafe`` per event loop, the rest directly."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Pending, Outcome]]] = {}
    direct = []
    for p, outcome in done:
        if p.loop is None:
            direct.append((p, outcome))
        else:
            by_loop.setdefault(p.loop, []).append((p, outcome))
    _resolve(direct)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, items)
        except RuntimeError:  # the loop closed: nobody waits for these any more
            pass


class Batcher:
    """The batcher thread, its bounded queue and the admission decision (module docstring)."""

    def __init__(self, session: Any, max_batch: int, max_wait_ms: float, max_queue_samples: int,
                 metrics: Any = None, clock: Callable[[], float] = time.monotonic):
        if max_batch < 1:
            raise ValueError(f"max_batch: expected >= 1, got {max_batch!r}")
        if max_queue_samples < max_batch:
            raise ValueError(f"max_queue_samples: expected >= max_batch ({max_batch}), got {max_queue_samples!r}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms: expected >= 0, got {max_wait_ms!r}")
        self.session = session
        self.input_name = session.get_inputs()[0].name
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1e3
        self.max_queue_samples = max_queue_samples
        self.metrics = metrics  # a ServerMetrics, or None
        self.clock = clock
        self.times = ServiceTimes(max_batch)
        self.cv = threading.Condition()
        self.q: deque[_Pending] = deque()
        self.queued = 0  # samples in q
        self.running: tuple[float, int] | None = None  # (started, samples) of the batch being run
        self.late: deque[tuple[float, float]] = deque()  # (answered at, answered − predicted), seconds
        self.margin_s = 0.0
        self._since_margin = 0
        self._answers = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="batcher", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def warm_up(self, sample_shape: tuple[int, ...], runs: int = 3) -> None:
        """Run batches of 1 and ``max_batch`` zero samples ``runs`` times each (the first run of
        a session is slow) and seed the service times with the last run of each size."""
        for n in sorted({1, self.max_batch}):
            x = np.zeros((n, *sample_shape), dtype=np.float32)
            dt = 0.0
            for _ in range(max(1, runs)):
                t0 = time.perf_counter()
                self.session.run(None, {self.input_name: x})
                dt = time.perf_counter() - t0
            self.times.observe(n, dt)
        log.info("warm-up: batch 1 %.2f ms, batch %d %.2f ms", 1e3 * self.times.estimate(1), self.max_batch,
                 1e3 * self.times.estimate(self.max_batch))

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Finish the running batch; every queued request is answered ``stopping``."""
        with self.cv:
            self.stopping = True
            left = list(self.q)
            self.q.clear()
            self.queued = 0
            self._gauges()
            self.cv.notify_all()
        _deliver([(p, Shed("stopping", 0.0, 1.0)) for p in left])
        if self.thread.is_alive():
            self.thread.join(timeout=timeout_s)

    # ------------------------------------------------------------------ admission
    def expected_wait_s(self, n: int = 1, now: float | None = None) -> float:
        """Expected time until a request of ``n`` samples arriving now is answered."""
        with self.cv:
            return self._expected_wait(self.clock() if now is None else now, n)

    def _expected_wait(self, now: float, n: int) -> float:
        w = 0.0
        if self.running is not None:
            started, k = self.running
            w += max(0.0, started + self.times.estimate(k) - now)
        full, rest = divmod(self.queued + n, self.max_batch)
        w += full * self.times.estimate(self.max_batch) + self.times.estimate(rest)
        if rest and not full and self.running is None:
            w += self.max_wait_s  # it would start a batch that may wait to fill
        return w

    def answered(self, served: Served, at: float | None = None) -> None:
        """A served request's answer is ready (call it from where the answer is sent): how late
        against its prediction feeds the admission margin."""
        now = self.clock() if at is None else at
        self.late.append((now, now - served.predicted))
        while self.late[0][0] < now - MARGIN_WINDOW_S:
            self.late.popleft()
        self._since_margin += 1
        self._answers += 1
        # cold (fewer than MARGIN_EVERY answers yet): refreshed every tenth of that
        if self._since_margin >= (MARGIN_EVERY if self._answers > MARGIN_EVERY else MARGIN_EVERY // 10):
            self._since_margin = 0
            margin = max(0.0, float(np.percentile([v for _, v in self.late], MARGIN_QUANTILE)))
            with self.cv:
                self.margin_s = margin
            if self.metrics is not None:
                self.metrics.margin.set(margin)

    def _margin(self, now: float) -> float:
        """The margin, or 0 once nothing was answered for ``MARGIN_WINDOW_S``."""
        return self.margin_s if self.late and self.late[-1][0] >= now - MARGIN_WINDOW_S else 0.0

    def _refuse(self, now: float, n: int, deadline: float) -> Shed | None:
        if self.stopping:
            return Shed("stopping", 0.0, 1.0)
        wait = self._expected_wait(now, n) + self._margin(now)
        if self.queued + n > self.max_queue_samples:
            # room frees at the rate batches complete
            excess = self.queued + n - self.max_queue_samples
            return Shed("queue_full", wait, math.ceil(excess / self.max_batch) * self.times.estimate(self.max_batch))
        if now + wait > deadline:
            return Shed("deadline", wait, max(0.0, now + wait - deadline))
        return None

    def refuse(self, n: int, deadline: float) -> Shed | None:
        """What :meth:`admit` would answer a request of ``n`` samples now if it sheds it (None:
        it would queue it): lets the server shed before it reads the body."""
        with self.cv:
            return self._refuse(self.clock(), n, deadline)

    def admit(self, x: np.ndarray, deadline: float) -> Future[Outcome] | asyncio.Future[Outcome] | Shed:
        """Queue ``x`` (``n`` samples, ``1 <= n <= max_batch``) to be answered by ``deadline``
        (on :attr:`clock`), or say why not (never blocks). Called from an event loop, the
        future is that loop's."""
        n = len(x)
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"samples per request: expected 1..{self.max_batch}, got {n}")
        now = self.clock()
        with self.cv:
            shed = self._refuse(now, n, deadline)
            if shed is not None:
                return shed
            p = _Pending(x, deadline, now + self._expected_wait(now, n))
            self.q.append(p)
            self.queued += n
            self._gauges()
            self.cv.notify()
        return p.future

    # ------------------------------------------------------------------ batcher thread
    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self.q))
            self.metrics.queue_samples.set(self.queued)

    def _take(self, now: float) -> tuple[list[_Pending], list[_Pending], int]:
        """Pop (under the lock) the next batch in FIFO order: (to run, expired, samples to run);
        expired: the deadline passes before the batch would be done."""
        items: list[_Pending] = []
        expired: list[_Pending] = []
        n = 0
        while self.q and n + self.q[0].n <= self.max_batch:
            p = self.q.popleft()
            self.queued -= p.n
            if p.deadline < now + self.times.estimate(n + p.n):  # its answer would come too late
                expired.append(p)
                continue
            items.append(p)
            n += p.n
        self._gauges()
        if items:
            self.running = (now, n)
        return items, expired, n

    def _loop(self) -> None:
        # a batch's service time: from its take to the next take when the batcher went straight
        # on (all it did in between counts), else to the hand-back of its results
        last: tuple[float, int] | None = None  # (taken, samples) of the batch whose time is pending
        while True:
            with self.cv:
                if last is not None and not self.q:  # it will idle: the last batch ended at its hand-back
                    self.times.observe(last[1], time.perf_counter() - last[0])
                    last = None
                while not self.q and not self.stopping:
                    self.cv.wait()
                if self.stopping:
                    return
                fill_until = self.clock() + self.max_wait_s
                while self.queued < self.max_batch and not self.stopping:
                    left = fill_until - self.clock()
                    if left <= 0:
                        break
                    self.cv.wait(left)
                if self.stopping:
                    return
                taken = time.perf_counter()
                if last is not None:
                    self.times.observe(last[1], taken - last[0])
                    last = None
                items, expired, n = self._take(self.clock())
            done: list[tuple[_Pending, Outcome]] = [(p, Shed("expired", 0.0, 1.0)) for p in expired]
            if items:
                done += self._run(items, n)
            _deliver(done)
            if items:
                with self.cv:
                    self.running = None
                last = (taken, n)

    def _run(self, items: list[_Pending], n: int) -> list[tuple[_Pending, Outcome]]:
        try:
            x = items[0].x if len(items) == 1 else np.concatenate([p.x for p in items])
            t0 = time.perf_counter()
            (out,) = self.session.run(None, {self.input_name: x})
            dt = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - reported to every waiting request
            log.exception("session.run of a batch of %d failed", n)
            return [(p, Failed(f"{type(e).__name__}: {e}")) for p in items]
        if self.metrics is not None:
            self.metrics.run_s.observe(dt)
            self.metrics.batch.observe(n)
            self.metrics.samples.inc(n)
        done: list[tuple[_Pending, Outcome]] = []
        i = 0
        for p in items:
            done.append((p, Served(out[i : i + p.n], n, p.predicted)))
            i += p.n
        return done
