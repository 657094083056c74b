"""The serving-path fit: recovers a known request cost and delay from latency quantiles."""

import numpy as np
import pytest

from reamer.calibration.serving import fit_path
from reamer.models.inference import InferenceProfile, simulate_replica
from reamer.workloads.real.loadgen import schedule_of

ENTRY = {"a_ms": 2.0, "b_ms": 5.0, "parallel_fraction": 0.5}


def quantiles(request_ms: float, delay_ms: float, rate: float, seed: int) -> tuple[float, float, float]:
    prof = InferenceProfile("t", ENTRY["a_ms"] / 1e3, ENTRY["b_ms"] / 1e3, 0.5, request_s=request_ms / 1e3,
                            delay_s=delay_ms / 1e3)
    arr = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, 40000))
    p50, p99 = np.percentile(simulate_replica(arr, prof, 1.0, 8, 0.0), [50, 99])
    return rate, float(p50), float(p99)


def test_fit_recovers_the_request_cost_and_delay():
    loads = [quantiles(1.5, 3.0, rate, seed=7) for rate in (35.0, 70.0)]
    both = fit_path(ENTRY, loads, 8, quantiles="p50,p99")
    assert both["request_ms"] == pytest.approx(1.5, abs=0.5)  # the two trade off within sampling noise
    assert both["delay_ms"] == pytest.approx(3.0, abs=1.5)
    assert both["rms_err_pct"] < 5.0
    for (_, p50, p99), (f50, f99) in zip(loads, both["predicted"], strict=True):
        assert f99 == pytest.approx(p99, rel=0.1) and f50 == pytest.approx(p50, rel=0.1)
    tail = fit_path(ENTRY, loads, 8)  # the default matches the p99s only: two equations, a flatter valley
    assert tail["request_ms"] == pytest.approx(1.5, abs=1.0) and tail["delay_ms"] == pytest.approx(3.0, abs=2.5)
    for (_, _, p99), (_, f99) in zip(loads, tail["predicted"], strict=True):
        assert f99 == pytest.approx(p99, rel=0.03)


def test_fit_without_a_serving_cost_finds_none():
    fit = fit_path(ENTRY, [quantiles(0.0, 0.0, rate, seed=3) for rate in (35.0, 70.0)], 8)
    assert fit["request_ms"] <= 0.3 and fit["delay_ms"] <= 1.0


def test_unstable_loads_are_an_error():
    with pytest.raises(RuntimeError, match="stable"):
        fit_path(ENTRY, [(1000.0, 0.01, 0.02)], 8)


def test_fit_on_the_load_generators_own_schedules_matches_their_p99():
    """45 s samples (as the calibration measures): fitted on the very arrivals, the p99s come
    back closely; the seeded default sample is another draw and matches them less well."""
    prof = InferenceProfile("t", ENTRY["a_ms"] / 1e3, ENTRY["b_ms"] / 1e3, 0.5, request_s=1.5e-3, delay_s=3e-3)
    args = [["--rate", f"{r:.4f}", "--duration", "45", "--seed", "1"] for r in (35.0, 70.0)]
    sched = [np.asarray(schedule_of(a)) for a in args]
    loads = []
    for (rate, a) in zip((35.0, 70.0), sched, strict=True):
        p50, p99 = np.percentile(simulate_replica(a, prof, 1.0, 8, 0.0), [50, 99])
        loads.append((rate, float(p50), float(p99)))
    fit = fit_path(ENTRY, loads, 8, schedules=sched)
    for (_, _, p99), (_, f99) in zip(loads, fit["predicted"], strict=True):
        assert f99 == pytest.approx(p99, rel=0.02)
    assert fit["rms_err_pct"] <= fit_path(ENTRY, loads, 8)["rms_err_pct"]
    with pytest.raises(ValueError, match="schedules"):
        fit_path(ENTRY, loads, 8, schedules=sched[:1])
