"""Inference model: service-time profiles, request-level vs analytic latency, sizing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reamer.models.profiles import shipped_profiles
from reamer.models.inference import (
    InferenceProfile,
    P99Curve,
    analytic_p99_s,
    analytic_slo_miss,
    arrivals_for_rates,
    capacity_per_replica,
    effective_cores,
    max_throughput_per_s,
    poisson_arrivals,
    service_time_s,
    simulate_replica,
    size_service,
)

PROFILES = dict(shipped_profiles().inference)
MODELS = ("resnet50", "mobilenet_v2", "vgg16", "bert_base", "deepspeech2")


def sim_p99(rate, prof, cores, max_batch, max_wait_s, slowdown=1.0, n=150_000, seed=0):
    """p99 of the request-level simulation over ~n Poisson requests (first 5% as warm-up)."""
    arr = poisson_arrivals(rate, n / rate, np.random.default_rng(seed))
    lat = simulate_replica(arr, prof, cores, max_batch, max_wait_s, slowdown)
    return float(np.percentile(lat[len(lat) // 20 :], 99))


# --------------------------------------------------------------------------- profiles


def test_shipped_profiles_cover_the_models_and_fit_their_measurements():
    assert set(MODELS) <= set(PROFILES)
    for name in MODELS:
        p = PROFILES[name]
        assert p.a_s >= 0 and p.b_s > 0 and 0 <= p.parallel_fraction <= 1
        assert len(p.measured) >= 4
        for cores, batch, secs in p.measured:  # the fit is within 35% of every measured point
            assert service_time_s(p, cores, batch) == pytest.approx(secs, rel=0.35)
    per_sample = {n: service_time_s(PROFILES[n], 1, 8) / 8 for n in ("mobilenet_v2", "resnet50", "vgg16")}
    assert per_sample["mobilenet_v2"] < per_sample["resnet50"] < per_sample["vgg16"]  # 0.3 < 4.1 < 15.5 GMACs


def test_service_time_formula_and_amdahl():
    p = InferenceProfile("m", a_s=0.01, b_s=0.02, parallel_fraction=0.8)
    assert service_time_s(p, 1, 4) == pytest.approx(0.09)
    e2 = 1 / (0.2 + 0.4)
    assert effective_cores(2, 0.8) == pytest.approx(e2)
    assert service_time_s(p, 2, 4, slowdown=1.5) == pytest.approx(0.09 / e2 * 1.5)
    assert effective_cores(0.5, 0.8) == 0.5  # a fractional quota is a time share
    np.testing.assert_allclose(service_time_s(p, 1, np.array([1, 2])), [0.03, 0.05])


# --------------------------------------------------------------------------- request-level


def test_simulate_replica_batches_by_size_and_by_wait():
    p = InferenceProfile("m", a_s=0.010, b_s=0.010, parallel_fraction=0.0)  # S(k) = 10 + 10k ms
    lat = simulate_replica([0.0, 0.0, 0.0], p, 1, max_batch=2, max_wait_s=0.0)
    np.testing.assert_allclose(lat, [0.030, 0.030, 0.050])  # batch of 2, then 1 after it
    lat = simulate_replica([0.0, 0.010], p, 1, max_batch=4, max_wait_s=0.050)
    np.testing.assert_allclose(lat, [0.080, 0.070])  # oldest waits 50 ms, then a batch of 2
    lat = simulate_replica([0.0, 0.010, 0.020], p, 1, max_batch=3, max_wait_s=1.0)
    np.testing.assert_allclose(lat, [0.060, 0.050, 0.040])  # full batch starts at once
    lat = simulate_replica([0.0, 0.001], p, 1, max_batch=1, max_wait_s=1.0)
    np.testing.assert_allclose(lat, [0.020, 0.039])  # max_batch 1: no waiting, FIFO


def test_arrivals_are_seeded_and_have_the_rate():
    a = poisson_arrivals(50.0, 200.0, np.random.default_rng(3))
    b = poisson_arrivals(50.0, 200.0, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    assert len(a) == pytest.approx(10_000, rel=0.05) and np.all(np.diff(a) >= 0)
    c = arrivals_for_rates([10.0, 0.0, 30.0], 60.0, np.random.default_rng(1))
    counts = np.histogram(c, bins=[0, 60, 120, 180])[0]
    assert counts[1] == 0 and counts[0] == pytest.approx(600, rel=0.15) and counts[2] == pytest.approx(1800, rel=0.1)


# --------------------------------------------------------------------------- analytic vs request-level

# The default scenario's operating range: ResNet-50 and MobileNet-v2 replicas of 2-4 cores,
# load 0.3-0.7 of saturation, greedy batching plus one point with a max wait of one
# single-request service time.
AGREE = [
    ("resnet50", 2, 4, 0.0, 0.3),
    ("resnet50", 2, 8, 0.0, 0.7),
    ("resnet50", 4, 8, "S1", 0.5),
    ("mobilenet_v2", 2, 8, 0.0, 0.5),
    ("mobilenet_v2", 4, 16, 0.0, 0.7),
    ("mobilenet_v2", 4, 8, "S1", 0.3),
]


@pytest.mark.parametrize("model,cores,max_batch,wait,load", AGREE)
def test_analytic_p99_agrees_with_request_level(model, cores, max_batch, wait, load):
    prof = PROFILES[model]
    wait_s = float(service_time_s(prof, cores, 1)) if wait == "S1" else wait
    rate = load * max_throughput_per_s(prof, cores, max_batch)
    an = analytic_p99_s(rate, prof, cores, max_batch, wait_s)
    sim = sim_p99(rate, prof, cores, max_batch, wait_s)
    assert an == pytest.approx(sim, rel=0.10), f"analytic {an * 1e3:.1f} ms vs simulated {sim * 1e3:.1f} ms"


def test_analytic_slo_miss_matches_simulation():
    prof = PROFILES["resnet50"]
    rate = 0.6 * max_throughput_per_s(prof, 2, 8)
    slo = analytic_p99_s(rate, prof, 2, 8, 0.0)
    assert analytic_slo_miss(rate, prof, 2, 8, 0.0, slo) == pytest.approx(0.01, rel=0.02)
    arr = poisson_arrivals(rate, 150_000 / rate, np.random.default_rng(1))
    lat = simulate_replica(arr, prof, 2, 8, 0.0)
    assert np.mean(lat > slo) == pytest.approx(0.01, abs=0.002)


def test_light_and_saturated_limits():
    prof = PROFILES["resnet50"]
    s1 = service_time_s(prof, 2, 1)
    assert analytic_p99_s(0.0, prof, 2, 8, 0.0) == pytest.approx(s1)
    assert analytic_p99_s(0.0, prof, 2, 8, 0.05) == pytest.approx(s1 + 0.05)
    assert analytic_p99_s(1.01 * max_throughput_per_s(prof, 2, 8), prof, 2, 8, 0.0) == math.inf


# --------------------------------------------------------------------------- monotonicity


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["resnet50", "mobilenet_v2", "bert_base"]),
    max_batch=st.sampled_from([1, 4, 8]),
    load=st.floats(0.05, 0.8),
    step=st.floats(0.03, 0.15),
)
def test_p99_rises_with_rate_and_falls_with_cores(model, max_batch, load, step):
    prof = PROFILES[model]
    rate = load * max_throughput_per_s(prof, 1, max_batch)
    p1, p2, p4, p8 = (analytic_p99_s(rate, prof, c, max_batch, 0.0) for c in (1, 2, 4, 8))
    assert p1 > p2 > p4 > p8
    higher = (load + step) * max_throughput_per_s(prof, 1, max_batch)
    assert analytic_p99_s(higher, prof, 1, max_batch, 0.0) > p1
    assert analytic_p99_s(rate, prof, 1, max_batch, 0.0, slowdown=1.2) > p1


def test_simulated_p99_monotone_in_cores_and_rate():
    prof = PROFILES["mobilenet_v2"]
    rate = 0.6 * max_throughput_per_s(prof, 2, 8)
    assert sim_p99(rate, prof, 2, 8, 0.0, n=60_000) > sim_p99(rate, prof, 4, 8, 0.0, n=60_000)
    assert sim_p99(1.2 * rate, prof, 2, 8, 0.0, n=60_000) > sim_p99(rate, prof, 2, 8, 0.0, n=60_000)


# --------------------------------------------------------------------------- sizing


def test_capacity_is_where_p99_meets_the_slo():
    prof = PROFILES["resnet50"]
    slo = 4.0 * service_time_s(prof, 2, 1)
    cap = capacity_per_replica(prof, 2, 8, 0.0, slo)
    assert 0 < cap < max_throughput_per_s(prof, 2, 8)
    assert analytic_p99_s(cap, prof, 2, 8, 0.0) <= slo
    assert analytic_p99_s(cap * 1.01, prof, 2, 8, 0.0) > slo * 0.995
    assert capacity_per_replica(prof, 2, 8, 0.0, 0.5 * service_time_s(prof, 2, 1)) == 0.0  # SLO below S(1)


def test_greedy_batching_latency_scales_with_the_service_times():
    """At max_wait = 0 the law at k x the service times and rate / k is k x the law: the
    shared (unit-time) law gives what the queue's own law gives, whatever the cores or slowdown."""
    from reamer.models.inference import _atoms, _service_vector

    prof = PROFILES["bert_base"]
    for cores, slowdown, B, load in ((1.0, 1.0, 4, 0.6), (3.5, 1.0, 4, 0.6), (2.0, 1.7, 8, 0.85)):
        s = _service_vector(prof, cores, B, slowdown)
        rate = load * B / s[-1]
        v, p = _atoms(rate, np.array((0.0,) + s), B, 0.0)  # the queue's own law, no sharing
        order = np.argsort(v, kind="stable")
        v, p = v[order], p[order]
        direct = float(np.interp(0.99, np.cumsum(p) - 0.5 * p, v)) + prof.delay_s
        assert analytic_p99_s(rate, prof, cores, B, 0.0, slowdown) == pytest.approx(direct, rel=1e-9)
        slo = 1.2 * direct
        direct_miss = 1.0 - float(np.interp(slo - prof.delay_s, v, np.cumsum(p) - 0.5 * p))
        assert analytic_slo_miss(rate, prof, cores, B, 0.0, slo, slowdown) == pytest.approx(direct_miss, abs=1e-9)


def test_latency_laws_are_kept_within_their_byte_budget():
    from reamer.models.inference import _Laws

    laws = _Laws(max_bytes=200_000)
    s = (0.01, 0.015, 0.02, 0.025)
    for load in (0.3, 0.5, 0.7, 0.9):
        laws.get((load * 4 / s[-1], s, 4, 0.0))
    assert laws._bytes <= 200_000 or len(laws._laws) == 1
    assert laws._bytes == sum(v.nbytes * 2 for v, _ in laws._laws.values())


def test_shared_results_come_back_bit_for_bit_and_only_as_whole_lines(tmp_path):
    from reamer.models.inference import SharedResults

    path = tmp_path / "results"
    a, b = SharedResults(path), SharedResults(path)  # two processes' views of one file
    assert b.get("k") is None  # no file yet
    a.put("k", [math.inf, 0.1 + 0.2])
    a.put("j", 1 / 3)
    assert b.get("k") == [math.inf, 0.1 + 0.2] and b.get("j") == 1 / 3
    with path.open("a") as f:
        f.write("half\t[1.0,")  # a line another process is still writing
    assert b.get("half") is None
    with path.open("a") as f:
        f.write(" 2.0]\n")
    assert b.get("half") == [1.0, 2.0]


def test_capacity_shared_between_processes_is_not_computed_again(tmp_path, monkeypatch):
    """What one process computed, another sharing the file reads instead of computing
    (the same value); without sharing every process computes its own."""
    import reamer.models.inference as inf

    prof = PROFILES["resnet50"]
    slo = 3.7 * service_time_s(prof, 2, 1)
    try:
        inf.share_results(tmp_path / "results")
        first = inf.capacity_per_replica.__wrapped__(prof, 2, 8, 0.0, slo)
        inf.share_results(tmp_path / "results")  # another process: nothing in memory yet

        def no_compute(*args):
            raise AssertionError("computed again")

        monkeypatch.setattr(inf, "_capacity", no_compute)
        assert inf.capacity_per_replica.__wrapped__(prof, 2, 8, 0.0, slo) == first
        inf.share_results(None)
        with pytest.raises(AssertionError, match="computed again"):
            inf.capacity_per_replica.__wrapped__(prof, 2, 8, 0.0, slo)
    finally:
        inf.share_results(None)
        monkeypatch.undo()
    assert first == capacity_per_replica(prof, 2, 8, 0.0, slo)  # what the cached function gives


@pytest.mark.parametrize("model,rate,slo", [("resnet50", 120.0, 0.25), ("mobilenet_v2", 900.0, 0.05)])
def test_sizing_meets_the_slo_in_the_request_level_sim(model, rate, slo):
    prof = PROFILES[model]
    sz = size_service(rate, slo, prof, core_options=(1, 2, 4, 8))
    assert sz is not None and sz.replicas >= 1
    assert sz.replicas == math.ceil(rate / sz.capacity_per_s - 1e-12)
    assert sz.p99_s <= slo
    per_replica = rate / sz.replicas  # random routing splits Poisson arrivals evenly
    assert sim_p99(per_replica, prof, sz.cores, sz.max_batch, sz.max_wait_s, n=100_000) <= slo * 1.02
    # no other shape in the search space uses fewer cores
    for c in (1, 2, 4, 8):
        for b in (1, 2, 4, 8, 16):
            cap = capacity_per_replica(prof, float(c), b, 0.0, float(slo))
            if cap > 0:
                assert c * math.ceil(rate / cap - 1e-12) >= sz.total_cores


def test_stricter_quantile_keeps_per_minute_p99_within_the_slo():
    prof = PROFILES["resnet50"]
    rate, slo = 120.0, 0.25
    plain = size_service(rate, slo, prof)
    strict = size_service(rate, slo, prof, quantile=0.999)
    assert strict.total_cores >= plain.total_cores
    assert analytic_p99_s(rate / strict.replicas, prof, strict.cores, strict.max_batch, 0.0) < plain.p99_s

    def minutes_over(sz):  # two hours of one replica, p99 judged per minute
        arr = poisson_arrivals(rate / sz.replicas, 7200.0, np.random.default_rng(0))
        lat = simulate_replica(arr, prof, sz.cores, sz.max_batch, sz.max_wait_s)
        minute = (arr // 60).astype(int)
        return np.mean([np.percentile(lat[minute == m], 99) > slo for m in range(120)])

    assert minutes_over(strict) <= 0.02 < minutes_over(plain)


def test_sizing_scales_replicas_with_rate_and_handles_impossible_slo():
    prof = PROFILES["resnet50"]
    small = size_service(20.0, 0.3, prof)
    big = size_service(200.0, 0.3, prof)
    assert big.total_cores > small.total_cores
    assert size_service(10.0, 0.001, prof) is None
    slowed = size_service(200.0, 0.3, prof, slowdown=1.3)
    assert slowed.total_cores >= big.total_cores


def test_p99_curve_matches_the_analytic_mode():
    prof = PROFILES["resnet50"]
    curve = P99Curve(prof, 2, 8, 0.0)
    for load in (0.1, 0.23, 0.37, 0.64, 0.85, 0.93):
        rate = load * curve.saturation_per_s
        assert curve(rate) == pytest.approx(analytic_p99_s(rate, prof, 2, 8, 0.0), rel=0.03)
        slow_rate = rate / 1.25
        assert curve(slow_rate, slowdown=1.25) == pytest.approx(
            analytic_p99_s(slow_rate, prof, 2, 8, 0.0, slowdown=1.25), rel=0.03)
    assert curve(0.99 * curve.saturation_per_s) == math.inf
    assert curve(np.array([1.0, 2.0])).shape == (2,)


def test_serving_path_costs_cpu_per_request_and_delays_every_request():
    """request_s occupies the replica like the model (per sample); delay_s adds to every latency."""
    import dataclasses

    from reamer.models.inference import InferenceProfile, analytic_p99_s, service_time_s, simulate_replica

    base = InferenceProfile("m", 0.001, 0.004, 0.8)
    served = dataclasses.replace(base, request_s=0.002, delay_s=0.0015)
    assert service_time_s(served, 1.0, 4) == pytest.approx(0.001 + 4 * 0.006)
    arr = np.sort(np.random.default_rng(0).random(200) * 10.0)
    lat0 = simulate_replica(arr, dataclasses.replace(served, delay_s=0.0), 1.0, 4, 0.0)
    assert np.allclose(simulate_replica(arr, served, 1.0, 4, 0.0), lat0 + 0.0015)
    assert analytic_p99_s(20.0, served, 1.0, 4, 0.0) == pytest.approx(
        analytic_p99_s(20.0, dataclasses.replace(served, delay_s=0.0), 1.0, 4, 0.0) + 0.0015)
    assert analytic_p99_s(20.0, served, 1.0, 4, 0.0) > analytic_p99_s(20.0, base, 1.0, 4, 0.0)


def test_law_cache_bounds_the_process_s_laws(monkeypatch):
    import reamer.models.inference as inf

    monkeypatch.setattr(inf._LAWS, "max_bytes", inf._LAWS.max_bytes)  # restored after the test
    inf.law_cache(1)  # one law at most: each new one pushes the one before out
    s = (0.01, 0.015, 0.02, 0.025)
    for load in (0.31, 0.52):
        inf._dist(load * 4 / s[-1], s, 4, 0.0)
    assert len(inf._LAWS._laws) == 1
    with pytest.raises(ValueError, match="positive number of bytes"):
        inf.law_cache(0)
