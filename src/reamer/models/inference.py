"""Inference service model: service-time profiles, one replica's batching queue, sizing (docs/design.md, inference model).

**Service time.** Per model, measured with ONNX Runtime by ``reamer calibrate``
(:mod:`reamer.calibration.inference`) and shipped in ``reamer/data/profiles.json``::

    S(cores, batch) = (a + b * batch) / E(cores) * slowdown
    E(c) = 1 / ((1 - f) + f / c)   for c >= 1,   E(c) = c below one core (time share)

``a`` is the per-batch overhead, ``b`` the per-sample cost on one core, ``f`` the Amdahl
parallel fraction (fitted from 1- vs 2-core runs), ``slowdown`` >= 1 the latency inflation
from co-located training.

**One replica** is one server (all its cores run one batch at a time) with FIFO dynamic
batching: a batch starts when the server is free *and* either ``max_batch`` requests wait
or the oldest has waited ``max_wait``; it takes up to ``max_batch`` of the oldest requests.

Two latency modes, both in seconds:

* :func:`simulate_replica` — request-level simulation of that rule (exact, given arrivals).
* :func:`analytic_p99_s` — a numerical solution of the M/G^(1,B)/1 bulk-service queue
  (Poisson arrivals, batch-size-dependent deterministic service). An embedded Markov chain on
  the number waiting at batch completions gives the stationary state; the latency law of a
  Poisson (PASTA) arrival is then exact given that state: residual service, ``floor(q/B)``
  full batches ahead, its own batch's start, and its batch size including later arrivals
  (uniform arrival instants within a service and within a batch-formation window are
  integrated on a midpoint grid). Batch formation from an empty system (wait for ``B-1``
  more arrivals or ``max_wait``) is exact. One approximation: when a batch completes while
  requests already wait, the next batch starts at once (as if the oldest had waited
  ``max_wait`` already). That is exact for ``max_wait = 0`` (greedy batching, the sizing
  default) and otherwise slightly optimistic: it skips the extra wait of a light queue whose
  oldest request arrived less than ``max_wait`` before the completion. A development sweep
  against :func:`simulate_replica` (300k-request runs, loads 0.1-0.9 of saturation, batches
  1-16) gave p99 within 1.5% for ``max_wait = 0``, within 6% for ``max_wait`` up to twice
  ``S(1)`` and within 8% up to ten times ``S(1)``; ``tests/models/test_inference.py``
  re-checks six points of the default scenario. Cost: 1-50 ms per call (cached);
  :class:`P99Curve` precomputes a rate grid for microsecond lookups.

**Sizing.** :func:`capacity_per_replica` root-finds the analytic mode for the largest rate
whose p99 meets the SLO; :func:`size_service` picks cores per replica and batching that minimise
the total cores of ``ceil(rate / capacity)`` replicas.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from reamer.domain.inference import Replica

# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True, slots=True)
class InferenceProfile:
    """Fitted service-time model of one inference model (seconds, one reference core)."""

    name: str
    a_s: float  # per-batch overhead
    b_s: float  # per-sample cost
    parallel_fraction: float  # Amdahl f
    measured: tuple[tuple[int, int, float], ...] = ()  # (cores, batch, seconds) behind the fit
    input: str = ""
    params_m: float = 0.0
    # The serving path around the model, measured through the real server (0 when only the
    # model was profiled): CPU per request in the server besides the model (HTTP parsing,
    # decoding, the reply) — it occupies the replica's cores like the model does — and a
    # fixed delay per request outside the server's CPU (loopback, client stack).
    request_s: float = 0.0
    delay_s: float = 0.0
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # profiles key the sizing caches: hash what tells them apart, not ``measured``
        object.__setattr__(self, "_hash", hash((self.name, self.a_s, self.b_s, self.parallel_fraction)))

    def __hash__(self) -> int:
        return self._hash


def effective_cores(cores: float, parallel_fraction: float) -> float:
    """Amdahl-effective cores; below one core the quota is a time share (E = cores)."""
    if cores <= 0:
        return 0.0
    if cores <= 1.0:
        return float(cores)
    f = parallel_fraction
    return 1.0 / ((1.0 - f) + f / cores)


def service_time_s(profile: InferenceProfile, cores: float, batch, slowdown: float = 1.0):
    """Seconds to run one batch of ``batch`` requests (scalar or array) on ``cores`` cores."""
    e = effective_cores(cores, profile.parallel_fraction)
    if e <= 0:
        raise ValueError("cores must be > 0")
    per = profile.b_s + profile.request_s
    if not isinstance(batch, (int, float)) and np.ndim(batch):
        return (profile.a_s + per * np.asarray(batch, dtype=float)) / e * slowdown
    return (profile.a_s + per * batch) / e * slowdown


def max_throughput_per_s(profile: InferenceProfile, cores: float, max_batch: int, slowdown: float = 1.0) -> float:
    """Saturation rate of one replica: ``max_batch / S(max_batch)``."""
    return max_batch / service_time_s(profile, cores, max_batch, slowdown)


# --------------------------------------------------------------------------- arrivals


def poisson_arrivals(
    rate_per_s: float, duration_s: float, rng: np.random.Generator, start_s: float = 0.0
) -> np.ndarray:
    """Sorted arrival times of a Poisson process of ``rate_per_s`` on ``[start, start + duration)``."""
    if rate_per_s < 0 or duration_s < 0:
        raise ValueError("rate and duration must be >= 0")
    n = int(rng.poisson(rate_per_s * duration_s))
    return start_s + np.sort(rng.random(n)) * duration_s


def arrivals_for_rates(rates_per_s, window_s: float, rng: np.random.Generator, start_s: float = 0.0) -> np.ndarray:
    """Sorted arrivals of a Poisson process whose rate is constant within each window."""
    rates = np.asarray(rates_per_s, dtype=float)
    if np.any(rates < 0) or window_s <= 0:
        raise ValueError("rates must be >= 0 and window_s > 0")
    counts = rng.poisson(rates * window_s)
    starts = start_s + window_s * np.repeat(np.arange(len(rates)), counts)
    return np.sort(starts + rng.random(int(counts.sum())) * window_s)


# --------------------------------------------------------------------------- request-level


def simulate_replica(
    arrival_times,
    profile: InferenceProfile,
    cores: float,
    max_batch: int,
    max_wait_s: float,
    slowdown: float = 1.0,
) -> np.ndarray:
    """Latency (s) of every request, in arrival order, through one replica's batching queue.

    Arrivals must be sorted. A batch starts when the server is free and either ``max_batch``
    requests wait or the oldest has waited ``max_wait_s``; it serves up to ``max_batch`` of the
    oldest requests for ``S(cores, batch) * slowdown``.
    """
    arr = np.asarray(arrival_times, dtype=float)
    n = len(arr)
    lat = np.empty(n)
    if n == 0:
        return lat
    if np.any(np.diff(arr) < 0):
        raise ValueError("arrival_times must be sorted")
    if max_batch < 1 or max_wait_s < 0:
        raise ValueError("max_batch >= 1 and max_wait_s >= 0 required")
    svc = [0.0] + [float(service_time_s(profile, cores, k, slowdown)) for k in range(1, max_batch + 1)]
    a = arr.tolist()
    i, free = 0, -math.inf
    while i < n:
        ready = a[i] + max_wait_s  # the oldest has waited max_wait
        if i + max_batch - 1 < n:
            ready = min(ready, a[i + max_batch - 1])  # or max_batch are waiting
        start = max(free, ready)
        j = bisect.bisect_right(a, start, i, min(n, i + max_batch))  # waiting at start, capped
        k = j - i
        free = start + svc[k]
        lat[i:j] = free - arr[i:j]
        i = j
    return lat + profile.delay_s


# --------------------------------------------------------------------------- analytic

_MAX_LOAD = 0.999  # load ratio treated as unstable
_U = 32  # midpoint grid for uniform arrival instants within a service / formation window
_TINY = 1e-13
_MAX_STATES = 20000  # chain size treated as unstable
_RHO_RATIO = 1.001  # capacity_per_replica brackets its root between loads this ratio apart ...
_RHO_MIN = 1e-6  # ... from 95% of saturation down to this load (below it: 0)


def _pois_pmf(mu, kmax: int) -> np.ndarray:
    """pmf of Poisson(mu) for k = 0..kmax, one row per mu (no tail mass)."""
    from scipy import special  # deferred: scipy costs ~0.5 s at import

    k = np.arange(kmax + 1, dtype=float)
    mu = np.asarray(mu, dtype=float)[:, None]
    return np.exp(special.xlogy(k[None, :], mu) - mu - special.gammaln(k + 1.0)[None, :])


def _pois_max(mu: float) -> int:
    """A count above which Poisson(mu) holds < 1e-15 of its mass."""
    return int(mu + 9.0 * math.sqrt(mu) + 30)


def _chain(lam: float, s: np.ndarray, B: int, tau: float, N: int) -> tuple[np.ndarray, np.ndarray]:
    """(stationary law of the number waiting at batch completions 0..N, law of K0)."""
    from scipy import sparse
    from scipy.sparse.linalg import spsolve  # deferred: scipy costs ~0.5 s at import

    # K0: batch size formed from an empty system (first arrival, then B-1 more or tau).
    if B == 1:
        pk0 = np.array([0.0, 1.0])
    else:
        pk0 = np.zeros(B + 1)
        pk0[1:B] = _pois_pmf([lam * tau], B - 2)[0]
        pk0[B] = max(0.0, 1.0 - pk0[1:B].sum())
    amax = min(N, _pois_max(lam * s[B]))
    pois = _pois_pmf(lam * s[1:], amax)  # rows k = 1..B: arrivals during a service of k
    n = np.arange(1, N + 1)
    k = np.minimum(n, B)
    rows = np.concatenate([np.zeros(amax + 1, int), np.repeat(n, amax + 1)])
    cols = np.concatenate([np.arange(amax + 1), ((n - k)[:, None] + np.arange(amax + 1)[None, :]).ravel()])
    vals = np.concatenate([pk0[1:] @ pois, pois[k - 1].ravel()])
    cols = np.minimum(cols, N)  # truncation: overflow mass stays at N
    P = sparse.csr_matrix((vals, (rows, cols)), shape=(N + 1, N + 1))
    P = P + sparse.csr_matrix((np.maximum(0.0, 1.0 - np.asarray(P.sum(axis=1)).ravel()),
                               (np.arange(N + 1), np.full(N + 1, N))), shape=(N + 1, N + 1))  # fmt: skip
    # pi (I - P) = 0 with pi_0 = 1: (I - P)[1:, 1:]^T pi[1:] = P[0, 1:]
    M = (sparse.identity(N, format="csr") - P[1:, 1:]).T.tocsc()
    rest = spsolve(M, np.asarray(P[0, 1:].todense()).ravel())
    pi = np.maximum(np.concatenate([[1.0], np.atleast_1d(rest)]), 0.0)
    return pi / pi.sum(), pk0


def _tail_states(lam: float, s: np.ndarray, B: int) -> int:
    """Waiting count beyond which the chain holds ~1e-13 of its mass (geometric tail z0^-n).

    z0 > 1 solves z^B = exp(lam*S(B)*(z - 1)), the decay rate of the bulk queue's tail.
    """
    from scipy import optimize  # deferred: scipy costs ~0.5 s at import

    mu = lam * s[B]
    g = lambda z: B * math.log(z) - mu * (z - 1.0)  # noqa: E731
    hi = 2.0
    while g(hi) > 0:
        hi *= 2.0
    z0 = optimize.brentq(g, 1.0 + 1e-12 * (1 + B / max(mu, 1e-12)), hi) if g(1.0 + 1e-9) > 0 else 1.0 + 1e-9
    return int(2 * B + _pois_max(mu) + 30.0 / math.log(z0))


def _atoms(lam: float, s: np.ndarray, B: int, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Latency atoms (values, probabilities) of a Poisson arrival in steady state."""
    from scipy import stats  # deferred: scipy costs ~0.5 s at import

    mean_batch_arrivals = lam * s[B]
    N = _tail_states(lam, s, B)
    if N > _MAX_STATES:
        return np.array([math.inf]), np.array([1.0])
    pi, pk0 = _chain(lam, s, B, tau, N)
    vals: list[np.ndarray] = []
    wts: list[np.ndarray] = []
    g = (np.arange(_U) + 0.5) / _U  # midpoints of U(0,1)

    # (1) members of batches formed from an empty system (arrivals during idle + formation)
    p0 = pi[0]
    if p0 > _TINY:
        for k in range(1, B):  # timeout with k < B members: first waits tau, others U(0,tau)
            if pk0[k] <= _TINY:
                continue
            vals += [np.array([tau + s[k]]), g * tau + s[k]]
            wts += [np.array([p0 * pk0[k]]), np.full(_U, p0 * pk0[k] * (k - 1) / _U)]
        if pk0[B] > _TINY:
            if B == 1 or tau <= 0:
                vals.append(np.array([s[B]]))
                wts.append(np.array([p0 * pk0[B] * B]))
            else:  # B-th member arrives at T < tau ~ Erlang(B-1, lam) truncated
                edges = np.linspace(0.0, tau, _U + 1)
                cdf = stats.gamma.cdf(edges, B - 1, scale=1.0 / lam)
                wt = np.diff(cdf)
                wt = wt / wt.sum() * pk0[B] * p0 if wt.sum() > 0 else np.full(_U, pk0[B] * p0 / _U)
                T = 0.5 * (edges[1:] + edges[:-1])
                vals += [T + s[B], (T[:, None] * g[None, :]).ravel() + s[B], np.array([s[B]])]
                wts += [wt, np.repeat(wt * (B - 2) / _U, _U), np.array([wt.sum()])]

    # (2) arrivals during a service of k with L older requests left waiting
    N = len(pi) - 1
    e0 = np.zeros(B + 1)  # episode weights with L = 0, by k
    e0[1:] += p0 * pk0[1:]
    e0[1:B] += pi[1:B]
    eB = np.zeros(N - B + 1)  # episodes of k = B by leftover L
    eB += pi[B:]
    eB[0] += e0[B]
    e0[B] = 0.0
    amax = _pois_max(mean_batch_arrivals)  # arrivals during one service, at most
    rows_w, rows_q, rows_R = [], [], []
    for k in range(1, B + 1):
        u = g * s[k]
        pq = _pois_pmf(lam * u, amax)  # (U, amax+1): arrivals before the tagged one
        if k < B:
            if e0[k] <= _TINY:
                continue
            mass = pq * (e0[k] * lam * s[k] / _U)
        else:  # plus the L older requests left over when the batch started
            mass = np.stack([np.convolve(eB, pq[j]) for j in range(_U)]) * (lam * s[k] / _U)
        rows_w.append(mass)
        rows_R.append(np.broadcast_to((s[k] - u)[:, None], mass.shape))
        rows_q.append(np.broadcast_to(np.arange(mass.shape[1]), mass.shape))
    if rows_w:
        w = np.concatenate([r.ravel() for r in rows_w])
        keep = w > _TINY * 1e-3
        w = w[keep]
        R = np.concatenate([r.ravel() for r in rows_R])[keep]
        q = np.concatenate([r.ravel() for r in rows_q])[keep]
        m, r = np.divmod(q, B)
        W = R + m * s[B]
        cmax = B - r - 1  # free places behind the tagged request in its batch
        x = np.arange(B)
        px = _pois_pmf(lam * W, B - 1)
        px = np.where(x[None, :] < cmax[:, None], px, 0.0)
        px[np.arange(len(W)), cmax] = np.maximum(0.0, 1.0 - px.sum(axis=1))  # tail: batch fills up
        kk = np.minimum(r[:, None] + 1 + x[None, :], B)
        vals.append((W[:, None] + s[kk]).ravel())
        wts.append((w[:, None] * px).ravel())
    v = np.concatenate(vals)
    p = np.concatenate(wts)
    return v, p / p.sum()


class _Laws:
    """Latency laws by key, least recently used first out, bounded by their bytes (one law is
    8 KiB to a few MiB: its atoms grow with the batch and the load)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._laws: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple) -> tuple[np.ndarray, np.ndarray]:
        law = self._laws.get(key)
        if law is not None:
            self._laws.move_to_end(key)
            return law
        lam, s, B, tau = key
        v, p = _atoms(lam, np.array((0.0,) + s), B, tau)
        order = np.argsort(v, kind="stable")
        v, p = v[order], p[order]
        law = self._laws[key] = (v, np.cumsum(p) - 0.5 * p)
        self._bytes += v.nbytes * 2
        while self._bytes > self.max_bytes and len(self._laws) > 1:
            _, (old, _) = self._laws.popitem(last=False)
            self._bytes -= old.nbytes * 2
        return law


_LAWS = _Laws(256 * 2**20)


def law_cache(max_bytes: int) -> None:
    """Bound this process's cache of latency laws (default 256 MiB). Process-wide, like
    :func:`share_results`: a benchmark whose runs reuse laws sets it in its workers."""
    if max_bytes <= 0:
        raise ValueError(f"law cache: expected a positive number of bytes, got {max_bytes}")
    _LAWS.max_bytes = max_bytes


class SharedResults:
    """Results of the latency model's costly pure functions, shared through one append-only
    file by processes that compute the same ones (the workers of one benchmark). A line is
    ``key<TAB>value``: the key a digest of the function's name and the ``repr`` of its
    arguments, the value its JSON (floats round-trip exactly, ``inf`` included), so a result
    read back is bit for bit the one computed. Each line is one ``write`` to a file opened
    with ``O_APPEND``: lines of two processes never interleave; a reader takes only complete
    lines."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._known: dict[str, object] = {}
        self._offset = 0

    @staticmethod
    def key(name: str, args: tuple) -> str:
        return hashlib.blake2b(f"{name}{args!r}".encode(), digest_size=16).hexdigest()

    def get(self, key: str) -> object | None:
        if key not in self._known:
            self._read()
        return self._known.get(key)

    def put(self, key: str, value: object) -> None:
        self._known[key] = value
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{key}\t{json.dumps(value)}\n".encode())
        finally:
            os.close(fd)

    def _read(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        for line in data[:end].decode().splitlines():
            key, _, value = line.partition("\t")
            self._known[key] = json.loads(value)
        self._offset += end


_SHARED: SharedResults | None = None


def share_results(path: Path | None) -> None:
    """Share this process's capacity and latency results with every other process given the
    same ``path`` (None: keep them to this process, the default). Process-wide, like the law
    cache: for a benchmark's worker processes, set by their initializer."""
    global _SHARED
    _SHARED = SharedResults(path) if path is not None else None


def shared(name: str, fn: Callable, *args):
    """``fn(*args)``, or the result another process sharing results (:func:`share_results`)
    computed for the same ``name`` and arguments; a tuple result comes back as a tuple."""
    if _SHARED is None:
        return fn(*args)
    key = _SHARED.key(name, args)
    got = _SHARED.get(key)
    if got is None:
        got = fn(*args)
        _SHARED.put(key, got)
    return tuple(got) if isinstance(got, list) else got


def _dist(lam: float, s: tuple[float, ...], B: int, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Sorted atom values and their mid-point CDF (a continuous, piecewise-linear law)."""
    return _LAWS.get((lam, s, B, tau))


def _unit(lam: float, s: tuple[float, ...], tau: float) -> tuple[float, tuple[float, ...], float]:
    """(rate, service times, time unit) of the same queue in its own time unit.

    With greedy batching (``tau = 0``) the queue has no clock of its own, so its latency law
    scales with the service times: at service times ``k × s`` and rate ``lam / k`` it is ``k``
    times the law at ``s`` and ``lam``. Measured in ``s[B]`` (rate and times rounded to 12
    digits) the law depends only on the load and the batch-time *shape*, whatever the cores
    or slowdown that scaled it, so every replica size and contention level shares one law."""
    if tau != 0:
        return lam, s, 1.0
    unit = s[-1]
    return round(lam * unit, 12), tuple(round(x / unit, 12) for x in s), unit


@lru_cache(maxsize=65536)
def _quantile(q: float, lam: float, s: tuple[float, ...], B: int, tau: float) -> float:
    if lam <= 0:  # light-traffic limit: every batch times out with one request
        return (tau if B > 1 else 0.0) + s[0]
    if lam * s[-1] / B >= _MAX_LOAD:
        return math.inf
    lam_u, s_u, unit = _unit(lam, s, tau)
    return unit * _unit_quantile(q, lam_u, s_u, B, tau)


@lru_cache(maxsize=65536)
def _unit_quantile(q: float, lam: float, s: tuple[float, ...], B: int, tau: float) -> float:
    v, cm = _dist(lam, s, B, tau)
    return float(np.interp(q, cm, v))


def _service_vector(profile: InferenceProfile, cores: float, max_batch: int, slowdown: float) -> tuple[float, ...]:
    return tuple(float(service_time_s(profile, cores, k, slowdown)) for k in range(1, max_batch + 1))


def _check(rate: float, max_batch: int, max_wait_s: float) -> None:
    if rate < 0 or max_batch < 1 or max_wait_s < 0:
        raise ValueError("rate >= 0, max_batch >= 1, max_wait_s >= 0 required")


def analytic_quantile_s(
    q: float, rate: float, profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float,
    slowdown: float = 1.0,
) -> float:
    """Stationary latency quantile ``q`` (0..1) of one replica at Poisson ``rate`` (analytic mode)."""
    _check(rate, max_batch, max_wait_s)
    s = _service_vector(profile, cores, max_batch, slowdown)
    return _quantile(float(q), float(rate), s, int(max_batch), float(max_wait_s)) + profile.delay_s


def analytic_p99_s(
    rate: float, profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float, slowdown: float = 1.0
) -> float:
    """Stationary p99 latency (s) of one replica at Poisson ``rate`` (analytic mode; inf if unstable)."""
    return analytic_quantile_s(0.99, rate, profile, cores, max_batch, max_wait_s, slowdown)


def analytic_slo_miss(
    rate: float, profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float, slo_s: float,
    slowdown: float = 1.0,
) -> float:
    """Share of requests slower than ``slo_s`` in steady state (analytic mode)."""
    _check(rate, max_batch, max_wait_s)
    s = _service_vector(profile, cores, max_batch, slowdown)
    slo_s = slo_s - profile.delay_s
    if rate <= 0:
        return float((max_wait_s if max_batch > 1 else 0.0) + s[0] > slo_s)
    if rate * s[-1] / max_batch >= _MAX_LOAD:
        return 1.0
    lam, s, unit = _unit(float(rate), s, float(max_wait_s))
    v, cm = _dist(lam, s, int(max_batch), float(max_wait_s))
    return float(1.0 - np.interp(slo_s / unit, v, cm, left=0.0, right=1.0))


class P99Curve:
    """Precomputed latency quantile of one replica shape against the rate, for long horizons.

    Built from :func:`analytic_quantile_s` on a grid of the load ratio ``rho`` (dense at light
    load and towards saturation; 0.3-3 s to build) and interpolated linearly in ``log(p99)``;
    a lookup costs microseconds. Against the analytic mode: within 3% above 2% load, within
    5% below it (where p99 jumps as queueing first reaches 1% of requests).
    Passing ``slowdown`` rescales time: ``p99(rate, k*S) = k * p99(k*rate, S)``, exact for
    ``max_wait = 0`` (for ``max_wait > 0`` it is as if ``max_wait`` were scaled by ``k`` too).
    Rates at or beyond ``rho_max`` of saturation give ``inf``.
    """

    def __init__(self, profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float,
                 slowdown: float = 1.0, q: float = 0.99, points: int = 100, rho_max: float = 0.97):
        self.profile, self.cores, self.max_batch, self.max_wait_s = profile, cores, max_batch, max_wait_s
        self.slowdown, self.q, self.rho_max = slowdown, q, rho_max
        self.saturation_per_s = max_throughput_per_s(profile, cores, max_batch, slowdown)
        # p99 bends sharply at light load (where queueing first reaches 1% of requests) and
        # near saturation: fine steps there, ~1.3% steps in between (at 100 points)
        n_low, n_top = points // 6, points // 4
        low = np.linspace(0.0, 0.05, n_low, endpoint=False)
        mid = np.linspace(0.05, 0.8 * rho_max, points - n_low - n_top, endpoint=False)
        x = np.linspace(0.0, 1.0, n_top)
        self.rho = np.concatenate([low, mid, rho_max * (0.8 + 0.2 * (1.0 - (1.0 - x) ** 2))])
        self.log_q = np.log([analytic_quantile_s(q, r * self.saturation_per_s, profile, cores, max_batch,
                                                 max_wait_s, slowdown) for r in self.rho])  # fmt: skip

    def __call__(self, rate, slowdown: float | None = None):
        k = 1.0 if slowdown is None else slowdown / self.slowdown
        rho = np.asarray(rate, dtype=float) * k / self.saturation_per_s
        out = k * np.exp(np.interp(rho, self.rho, self.log_q))
        out = np.where(rho > self.rho_max, np.inf, out)
        return float(out) if np.ndim(out) == 0 else out


# --------------------------------------------------------------------------- sizing


@lru_cache(maxsize=8192)
def capacity_per_replica(
    profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float, slo_p99_s: float,
    slowdown: float = 1.0, quantile: float = 0.99,
) -> float:
    """Largest Poisson rate (1/s) one replica serves with analytic p99 <= SLO (0 if none).

    Root of ``log p99(rate) = log SLO`` between no load and 95% of the saturation rate (the
    cap when the SLO is looser still): bisection on a geometric grid of the load ratio (points
    0.1% apart, down to a load of 1e-6, and 0), then the root of the line through the two grid
    points around it, kept if it meets the SLO (else the lower grid point, at most 0.1% below
    the root); assumes p99 rises with the rate above the lightest load that meets the SLO
    (true for ``max_wait = 0``). With ``max_wait = 0`` the grid's latency laws are shared by
    every cores, slowdown and SLO (:func:`_unit`), so a new replica size or contention level
    costs about one new law, not a root finding's worth.
    ``quantile`` replaces 0.99 by a stricter stationary quantile as a safety margin: a replica
    whose *stationary* p99 equals the SLO misses it in 20-45% of one-minute windows (the
    per-minute p99 scatters around it); at stationary p99.9 = SLO that falls to about 0-2%.
    """
    return shared("capacity_per_replica", _capacity, profile, cores, max_batch, max_wait_s, slo_p99_s, slowdown,
                  quantile)


def _capacity(profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float, slo_p99_s: float,
              slowdown: float, quantile: float) -> float:
    if analytic_quantile_s(quantile, 0.0, profile, cores, max_batch, max_wait_s, slowdown) > slo_p99_s:
        return 0.0
    sat = max_throughput_per_s(profile, cores, max_batch, slowdown)

    def excess(rho: float) -> float:
        p = analytic_quantile_s(quantile, rho * sat, profile, cores, max_batch, max_wait_s, slowdown)
        return math.log(p / slo_p99_s) if math.isfinite(p) else 50.0

    rho_hi = 0.95
    if excess(rho_hi) <= 0:
        return rho_hi * sat
    n = math.ceil(math.log(rho_hi / _RHO_MIN) / math.log(_RHO_RATIO))

    def grid(i: int) -> float:
        return rho_hi * _RHO_RATIO ** (i - n) if i > 0 else 0.0

    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if excess(grid(mid)) > 0 else (mid, hi)
    below, above = excess(grid(lo)), excess(grid(hi))  # ≤ 0 < above
    rho = grid(lo) + (grid(hi) - grid(lo)) * below / (below - above)
    return (rho if excess(rho) <= 0 else grid(lo)) * sat


@dataclass(frozen=True, slots=True)
class Sizing:
    """Replica shape and count for one service at one rate."""

    cores: float  # per replica
    max_batch: int
    max_wait_s: float
    replicas: int
    capacity_per_s: float  # per replica, at the SLO
    rate_per_s: float  # the service's rate it was sized for
    profile: InferenceProfile
    slowdown: float = 1.0

    @property
    def total_cores(self) -> float:
        return self.cores * self.replicas

    @property
    def p99_s(self) -> float:
        """Analytic p99 of each replica at ``rate / replicas`` (computed when read: sizing
        itself needs only the capacities)."""
        if self.replicas <= 0:
            return 0.0
        return analytic_p99_s(self.rate_per_s / self.replicas, self.profile, self.cores, self.max_batch,
                              self.max_wait_s, self.slowdown)


DEFAULT_CORES = (1, 2, 4, 8)
DEFAULT_BATCHES = (1, 2, 4, 8, 16)
DEFAULT_WAITS = (0.0,)


def routing_weights(profile: InferenceProfile, replicas: Sequence[Replica], slo_p99_s: float,
                    cores: Sequence[float] | None = None, memo: dict | None = None) -> list[float]:
    """The share of a service's requests each replica gets — the routing every backend applies
    (weighted round-robin in the clients, the simulator's split) and every harvesting policy
    assumes: proportional to each replica's capacity at the SLO (:func:`capacity_per_replica`),
    equal shares when none has any. ``cores`` replaces the replicas' own core counts (the
    simulator looks them up on a grid); ``memo``, the caller's for this profile and SLO, keeps
    capacities by (cores, batch, wait) across calls."""
    cs = [r.cores for r in replicas] if cores is None else list(cores)
    memo = {} if memo is None else memo
    caps = []
    for r, c in zip(replicas, cs, strict=True):
        key = (c, r.max_batch, r.max_wait_s)
        cap = memo.get(key)
        if cap is None:
            cap = memo[key] = capacity_per_replica(profile, c, int(r.max_batch), float(r.max_wait_s), slo_p99_s)
        caps.append(cap)
    total = sum(caps)
    if total <= 0:
        return [1.0 / len(caps)] * len(caps) if caps else []
    return [c / total for c in caps]


def size_service(
    rate: float,
    slo_p99_s: float,
    profile: InferenceProfile,
    core_options=DEFAULT_CORES,
    batch_options=DEFAULT_BATCHES,
    wait_options=DEFAULT_WAITS,
    slowdown: float = 1.0,
    headroom: float = 0.0,
    min_replicas: int = 1,
    quantile: float = 0.99,
) -> Sizing | None:
    """Cores per replica, batching and replica count meeting the p99 SLO at ``rate`` with fewest cores.

    ``replicas = max(min_replicas, ceil(rate * (1 + headroom) / capacity))``. Ties go to fewer
    replicas, then to more spare capacity. ``quantile`` is passed to
    :func:`capacity_per_replica` (raise it, e.g. to 0.999, when the SLO is judged per minute). ``wait_options`` are seconds (default: greedy
    batching, ``max_wait = 0``, which is what a linear ``a + b*batch`` profile favours and where
    the analytic mode is exact). ``None`` when no option meets the SLO at all.
    """
    if rate < 0 or slo_p99_s <= 0:
        raise ValueError("rate >= 0 and slo_p99_s > 0 required")
    best, best_key = None, None
    need = rate * (1.0 + headroom)
    shapes = []
    for c in core_options:
        for b in batch_options:
            for w in wait_options:
                sat = max_throughput_per_s(profile, float(c), int(b), slowdown)
                shapes.append((c * max(min_replicas, math.ceil(need / sat - 1e-12)), c, b, w))
    for bound, c, b, w in sorted(shapes):  # cheapest possible first; skip shapes that cannot win
        if best_key is not None and bound > best_key[0]:
            break
        cap = capacity_per_replica(profile, float(c), int(b), float(w), float(slo_p99_s), float(slowdown),
                                   quantile=float(quantile))
        if cap <= 0:
            continue
        n = max(min_replicas, math.ceil(need / cap - 1e-12))
        key = (c * n, n, -(cap * n - rate), c, b, w)
        if best_key is None or key < best_key:
            best_key = key
            best = (float(c), int(b), float(w), n, cap)
    if best is None:
        return None
    c, b, w, n, cap = best
    return Sizing(c, b, w, n, cap, rate, profile, slowdown)
