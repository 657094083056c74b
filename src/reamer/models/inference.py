"""Inference service model: service-time profiles, one replica's batching queue, sizing (DESIGN.md §3.2).

**Service time.** Per model, measured with ONNX Runtime by ``bench/inference_profile.py`` and
shipped in ``reamer/data/inference_profiles.json``::

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
  requests already wait, the next batch starts at once (the oldest is assumed to have waited
  ``max_wait`` already). That is exact for ``max_wait = 0`` and for ``max_wait`` shorter than
  the service time; for a longer ``max_wait`` it under-states the wait of light-load
  requests that arrived just before a completion. ``tests/models/test_inference.py`` checks it
  against :func:`simulate_replica` (within 10% on p99 for load <= 0.8 of saturation).

**Sizing.** :func:`capacity_per_replica` bisects the analytic mode for the largest rate whose
p99 meets the SLO; :func:`size_service` picks cores per replica and batching that minimise
the total cores of ``ceil(rate / capacity)`` replicas.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy import stats

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


def load_inference_profiles(path: str | Path | None = None) -> dict[str, InferenceProfile]:
    """Profiles shipped in ``reamer/data/inference_profiles.json`` (or read from ``path``)."""
    from importlib import resources

    from reamer.errors import InputError

    if path is None:
        source = "reamer/data/inference_profiles.json"
        text = resources.files("reamer.data").joinpath("inference_profiles.json").read_text()
    else:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise InputError(source, "file", "a readable JSON file", e.strerror) from None
    try:
        models = json.loads(text)["models"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise InputError(source, "top level", 'a JSON object with "models"') from None
    out: dict[str, InferenceProfile] = {}
    for name, m in models.items():
        try:
            a, b, f = float(m["a_ms"]) / 1e3, float(m["b_ms"]) / 1e3, float(m["parallel_fraction"])
            measured = tuple((int(c), int(k), float(ms) / 1e3) for c, k, ms in m.get("measured", ()))
        except (KeyError, TypeError, ValueError):
            raise InputError(source, f"models.{name}", "a_ms, b_ms, parallel_fraction numbers") from None
        if not (a >= 0 and b > 0 and 0 <= f <= 1):
            raise InputError(source, f"models.{name}", "a_ms >= 0, b_ms > 0, 0 <= parallel_fraction <= 1")
        out[name] = InferenceProfile(name, a, b, f, measured, str(m.get("input", "")), float(m.get("params_m", 0.0)))
    return out


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
    if np.ndim(batch):
        return (profile.a_s + profile.b_s * np.asarray(batch, dtype=float)) / e * slowdown
    return (profile.a_s + profile.b_s * batch) / e * slowdown


def max_throughput_per_s(profile: InferenceProfile, cores: float, max_batch: int, slowdown: float = 1.0) -> float:
    """Saturation rate of one replica: ``max_batch / S(max_batch)``."""
    return max_batch / service_time_s(profile, cores, max_batch, slowdown)


def load_ratio(rate: float, profile: InferenceProfile, cores: float, max_batch: int, slowdown: float = 1.0) -> float:
    """Offered load relative to saturation (the utilisation of the bulk queue, ``rho``)."""
    return rate / max_throughput_per_s(profile, cores, max_batch, slowdown)


# --------------------------------------------------------------------------- arrivals


def poisson_arrivals(rate_per_s: float, duration_s: float, rng: np.random.Generator, start_s: float = 0.0) -> np.ndarray:
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
    return lat


# --------------------------------------------------------------------------- analytic

_U = 32  # midpoint grid for uniform arrival instants within a service / formation window
_TINY = 1e-13


def _pois_pmf(mu: np.ndarray, kmax: int) -> np.ndarray:
    """pmf of Poisson(mu) for k = 0..kmax, rows per mu (no tail mass)."""
    k = np.arange(kmax + 1)
    return stats.poisson.pmf(k[None, :], np.asarray(mu, float)[:, None])


def _chain(lam: float, s: np.ndarray, B: int, tau: float, N: int) -> tuple[np.ndarray, np.ndarray]:
    """(stationary law of the number waiting at batch completions 0..N, law of K0)."""
    # K0: batch size formed from an empty system (first arrival, then B-1 more or tau).
    if B == 1:
        pk0 = np.array([0.0, 1.0])
    else:
        pk0 = np.zeros(B + 1)
        pk0[1:B] = stats.poisson.pmf(np.arange(B - 1), lam * tau)
        pk0[B] = max(0.0, 1.0 - pk0[1:B].sum())
    ks = np.minimum(np.arange(N + 1), B)
    ks[0] = 1  # placeholder, row 0 handled below
    pois = _pois_pmf(lam * s[1:], N)  # rows k=1..B
    P = np.zeros((N + 1, N + 1))
    row0 = pk0[1:] @ pois
    P[0] = row0
    for n in range(1, N + 1):
        k = ks[n]
        L = n - k
        P[n, L:] = pois[k - 1, : N + 1 - L]
    P[:, N] += np.maximum(0.0, 1.0 - P.sum(axis=1))  # truncation: overflow mass stays at N
    A = P.T - np.eye(N + 1)
    A[0, :] = 1.0
    rhs = np.zeros(N + 1)
    rhs[0] = 1.0
    pi = np.linalg.solve(A, rhs)
    pi = np.maximum(pi, 0.0)
    return pi / pi.sum(), pk0


def _atoms(lam: float, s: np.ndarray, B: int, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Latency atoms (values, probabilities) of a Poisson arrival in steady state."""
    mean_batch_arrivals = lam * s[B]
    N = int(B + max(4 * B, mean_batch_arrivals + 12 * math.sqrt(mean_batch_arrivals + 1) + 20))
    for _ in range(8):  # grow the truncation until the top states hold no mass
        pi, pk0 = _chain(lam, s, B, tau, N)
        if pi[-max(B, N // 10):].sum() < 1e-9:
            break
        N *= 2
    else:
        return np.array([math.inf]), np.array([1.0])
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
    Q = N + int(mean_batch_arrivals + 12 * math.sqrt(mean_batch_arrivals + 1) + 20)
    rows_w, rows_q, rows_R = [], [], []
    for k in range(1, B + 1):
        u = g * s[k]
        pq = _pois_pmf(lam * u, Q)  # (U, Q+1)
        if k < B:
            if e0[k] <= _TINY:
                continue
            mass = pq * (e0[k] * lam * s[k] / _U)
        else:
            mass = np.stack([np.convolve(eB, pq[j])[: Q + 1] for j in range(_U)]) * (lam * s[k] / _U)
        rows_w.append(mass)
        rows_R.append(np.repeat((s[k] - u)[:, None], Q + 1, axis=1))
        rows_q.append(np.broadcast_to(np.arange(Q + 1), mass.shape))
    if rows_w:
        w = np.concatenate([r.ravel() for r in rows_w])
        keep = w > _TINY * 1e-3
        w = w[keep]
        R = np.concatenate([r.ravel() for r in rows_R])[keep]
        q = np.concatenate([np.asarray(r).ravel() for r in rows_q])[keep]
        m, r = np.divmod(q, B)
        W = R + m * s[B]
        cmax = B - r - 1  # free places behind the tagged request in its batch
        x = np.arange(B)
        px = stats.poisson.pmf(x[None, :], lam * W[:, None])
        px = np.where(x[None, :] < cmax[:, None], px, 0.0)
        px[np.arange(len(W)), cmax] = np.maximum(0.0, 1.0 - px.sum(axis=1))  # tail: batch fills up
        kk = np.minimum(r[:, None] + 1 + x[None, :], B)
        vals.append((W[:, None] + s[kk]).ravel())
        wts.append((w[:, None] * px).ravel())
    v = np.concatenate(vals)
    p = np.concatenate(wts)
    return v, p / p.sum()


@lru_cache(maxsize=4096)
def _atoms_cached(lam: float, s: tuple[float, ...], B: int, tau: float) -> tuple[np.ndarray, np.ndarray]:
    v, p = _atoms(lam, np.array((0.0,) + s), B, tau)
    order = np.argsort(v, kind="stable")
    return v[order], np.cumsum(p[order])


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
    if rate <= 0:  # light-traffic limit: every batch times out with one request
        return (max_wait_s if max_batch > 1 else 0.0) + s[0]
    if rate * s[-1] / max_batch >= 0.999:
        return math.inf
    v, cdf = _atoms_cached(float(rate), s, int(max_batch), float(max_wait_s))
    i = int(np.searchsorted(cdf, q * cdf[-1]))
    return float(v[min(i, len(v) - 1)])


def analytic_p99_s(
    rate: float, profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float, slowdown: float = 1.0
) -> float:
    """Stationary p99 latency (s) of one replica at Poisson ``rate`` (analytic mode; inf if unstable)."""
    return analytic_quantile_s(0.99, rate, profile, cores, max_batch, max_wait_s, slowdown)


def analytic_slo_miss(
    rate: float, profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float, slo_s: float,
    slowdown: float = 1.0,
) -> float:
    """Share of requests slower than ``slo_s`` (analytic mode)."""
    _check(rate, max_batch, max_wait_s)
    s = _service_vector(profile, cores, max_batch, slowdown)
    if rate <= 0:
        return float((max_wait_s if max_batch > 1 else 0.0) + s[0] > slo_s)
    if rate * s[-1] / max_batch >= 0.999:
        return 1.0
    v, cdf = _atoms_cached(float(rate), s, int(max_batch), float(max_wait_s))
    i = int(np.searchsorted(v, slo_s, side="right"))
    return float(1.0 - (cdf[i - 1] if i > 0 else 0.0))


# --------------------------------------------------------------------------- sizing


@lru_cache(maxsize=8192)
def capacity_per_replica(
    profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float, slo_p99_s: float,
    slowdown: float = 1.0, rel_tol: float = 0.005,
) -> float:
    """Largest Poisson rate (1/s) one replica serves with analytic p99 <= SLO (0 if none).

    Bisection on the analytic mode between 0 and the saturation rate; assumes p99 rises with
    the rate above the lightest load that meets the SLO.
    """
    if analytic_p99_s(0.0, profile, cores, max_batch, max_wait_s, slowdown) > slo_p99_s:
        return 0.0
    hi = 0.999 * max_throughput_per_s(profile, cores, max_batch, slowdown)
    lo = 0.0
    while hi - lo > rel_tol * max(lo, 1e-9) and hi - lo > 1e-9:
        mid = 0.5 * (lo + hi)
        if analytic_p99_s(mid, profile, cores, max_batch, max_wait_s, slowdown) <= slo_p99_s:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class Sizing:
    """Replica shape and count for one service at one rate."""

    cores: float  # per replica
    max_batch: int
    max_wait_s: float
    replicas: int
    capacity_per_s: float  # per replica, at the SLO
    p99_s: float  # analytic p99 at rate / replicas

    @property
    def total_cores(self) -> float:
        return self.cores * self.replicas


DEFAULT_CORES = (1, 2, 4, 8)
DEFAULT_BATCHES = (1, 2, 4, 8, 16)
DEFAULT_WAITS = (0.0,)


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
) -> Sizing | None:
    """Cores per replica, batching and replica count meeting the p99 SLO at ``rate`` with fewest cores.

    ``replicas = max(min_replicas, ceil(rate * (1 + headroom) / capacity))``. Ties go to fewer
    replicas, then to more spare capacity. ``wait_options`` are seconds (default: greedy
    batching, ``max_wait = 0``, which is what a linear ``a + b*batch`` profile favours and where
    the analytic mode is exact). ``None`` when no option meets the SLO at all.
    """
    if rate < 0 or slo_p99_s <= 0:
        raise ValueError("rate >= 0 and slo_p99_s > 0 required")
    best, best_key = None, None
    need = rate * (1.0 + headroom)
    for c in core_options:
        for b in batch_options:
            for w in wait_options:
                cap = capacity_per_replica(profile, float(c), int(b), float(w), float(slo_p99_s), float(slowdown))
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
    p99 = analytic_p99_s(rate / n, profile, c, b, w, slowdown) if n > 0 else 0.0
    return Sizing(c, b, w, n, cap, p99)
