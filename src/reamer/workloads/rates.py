"""Request-rate sources for inference services: rates in requests/s, one value per window.

* :func:`diurnal_rates` — a seeded synthetic day/night curve, one rate per minute.
* :func:`read_genai_qps` — the Alibaba GenAI gateway trace (``cluster-trace-v2026-GenAI``
  ``qps.csv``; ``genai_qps.csv`` of the cluster-trace data set, docs/design.md; CC BY 4.0).

**The GenAI trace.** Rows are ``timestamp_anon, value, container_ip, request_type``: ``value``
is one container's request rate (req/s) at a sample instant. Sample instants lie on a fixed
grid (57 s in the shipped file, 22.3 h, 108 containers, two request types); a container
appears only at instants where it had traffic (the smallest value, 0.09 req/s, recurs as a
floor, and 19% of instants have no row at all, mostly at night), so a missing
(container, instant) pair counts as zero. The service rate at an instant is the sum over
containers; the rate of a window is the mean of the instants on the grid inside it (empty
instants counting zero). The default window is 60 s, the SLO's judging window, so the two
sources are interchangeable; with a 57-s grid each 60-s window holds one instant (every
19th holds two). A window shorter than the grid holds the last instant's rate.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from reamer.errors import InputError
from reamer.workloads.csvio import number, read_rows

MINUTES_PER_DAY = 1440
GENAI_COLUMNS = ("timestamp_anon", "value", "container_ip", "request_type")


def diurnal_rates(
    minutes: int,
    peak_per_s: float,
    trough_per_s: float,
    rng: np.random.Generator,
    *,
    peak_hour: float = 14.0,
    noise: float = 0.05,
    noise_corr: float = 0.9,
    start_minute: int = 0,
) -> np.ndarray:
    """Per-minute request rates (req/s) of a day/night cycle with correlated noise.

    Shape: ``base(h) = trough + (peak - trough) * (1 + cos(2*pi*(h - peak_hour)/24)) / 2``
    with ``h`` the hour of day of minute ``start_minute + i`` (so the trough is 12 h from
    ``peak_hour``). Noise: ``rate = base * exp(e - noise**2/2)`` with ``e`` an AR(1) series per
    minute (correlation ``noise_corr``, stationary standard deviation ``noise``), mean-one
    multiplicative, so the noiseless curve is the expectation. All randomness comes from
    ``rng``: the same seed gives the same rates.
    """
    if minutes < 0:
        raise ValueError("minutes must be >= 0")
    if not (0 <= trough_per_s <= peak_per_s):
        raise ValueError("need 0 <= trough_per_s <= peak_per_s")
    if noise < 0 or not (0 <= noise_corr < 1):
        raise ValueError("need noise >= 0 and 0 <= noise_corr < 1")
    hours = ((start_minute + np.arange(minutes)) % MINUTES_PER_DAY) / 60.0
    base = trough_per_s + (peak_per_s - trough_per_s) * 0.5 * (1.0 + np.cos(2.0 * math.pi * (hours - peak_hour) / 24.0))
    if noise == 0 or minutes == 0:
        return base
    shocks = rng.standard_normal(minutes) * noise * math.sqrt(1.0 - noise_corr**2)
    e = np.empty(minutes)
    prev = rng.standard_normal() * noise  # start in the stationary law
    for i in range(minutes):
        prev = noise_corr * prev + shocks[i]
        e[i] = prev
    return base * np.exp(e - 0.5 * noise**2)


def read_genai_qps(
    path: str | Path,
    *,
    window_s: float = 60.0,
    request_type: str | None = None,
    peak_per_s: float | None = None,
) -> np.ndarray:
    """Service request rate (req/s) per ``window_s`` window from an Alibaba GenAI ``qps.csv``.

    Sums ``value`` across containers per sample instant and averages the instants of each
    window (see the module notes); windows start at the file's first instant and cover its
    span, so series of different request types line up. ``request_type`` keeps only rows of
    that type (e.g. ``"Generative Requests"``, ``"API Requests"``; case-insensitive). ``peak_per_s`` rescales
    the series so its largest window equals it. Bad input raises
    :class:`reamer.errors.InputError` naming the file, row and field.
    """
    path = Path(path)
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    if peak_per_s is not None and peak_per_s < 0:
        raise ValueError("peak_per_s must be >= 0")
    required = ["timestamp_anon", "value"] + (["request_type"] if request_type is not None else [])
    want = request_type.strip().lower() if request_type is not None else None
    ts: list[float] = []
    vs: list[float] = []
    all_t: list[float] = []  # every row's instant: the grid and the span, whatever the filter
    types: set[str] = set()
    for i, row in read_rows(path, required):
        t = number(path, i, row, "timestamp_anon")
        v = number(path, i, row, "value")
        all_t.append(t)
        if want is not None:
            kind = row["request_type"].strip()
            types.add(kind)
            if kind.lower() != want:
                continue
        ts.append(t)
        vs.append(v)
    if not ts:
        if want is not None and types:
            found = ", ".join(sorted(types))
            raise InputError(str(path), "field request_type", f"rows of type {request_type!r} (found {found})")
        raise InputError(str(path), "rows", "at least one data row")
    t = np.asarray(ts)
    v = np.asarray(vs)
    span = np.asarray(all_t)
    t0 = float(span.min())
    step = _grid_step(span, window_s)
    slot = np.rint((t - t0) / step).astype(np.int64)  # sample instant on the grid
    n_slots = int(np.rint((span.max() - t0) / step)) + 1
    totals = np.bincount(slot, weights=v, minlength=n_slots)  # summed over containers; empty = 0
    grid_t = np.arange(len(totals)) * step
    win = np.floor(grid_t / window_s + 1e-9).astype(np.int64)
    n_win = int(win[-1]) + 1
    sums = np.bincount(win, weights=totals, minlength=n_win)
    counts = np.bincount(win, minlength=n_win)
    rates = np.divide(sums, counts, out=np.zeros(n_win), where=counts > 0)
    if np.any(counts == 0):  # windows shorter than the grid: hold the last instant's rate
        idx = np.maximum.accumulate(np.where(counts > 0, np.arange(n_win), 0))
        rates = rates[idx]
    if peak_per_s is not None:
        top = float(rates.max())
        if top <= 0:
            raise InputError(str(path), "field value", "a positive rate somewhere to scale to the peak")
        rates = rates * (peak_per_s / top)
    return rates


def _grid_step(t: np.ndarray, window_s: float) -> float:
    """The trace's sampling step: the most common gap between distinct sample instants."""
    u = np.unique(t)
    if len(u) < 2:
        return window_s
    gaps = np.round(np.diff(u), 6)
    vals, counts = np.unique(gaps, return_counts=True)
    return float(vals[np.argmax(counts)])
