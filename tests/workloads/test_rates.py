"""Request-rate sources: the seeded diurnal generator and the Alibaba GenAI QPS reader."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reamer.errors import InputError
from reamer.workloads.rates import read_genai_qps, diurnal_rates

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
GENAI = DATA / "genai_qps.csv"
HEADER = "timestamp_anon,value,container_ip,request_type\n"


# --------------------------------------------------------------------------- diurnal


def test_diurnal_same_seed_same_rates_other_seed_differs():
    a = diurnal_rates(2 * 1440, 100.0, 20.0, np.random.default_rng(7))
    b = diurnal_rates(2 * 1440, 100.0, 20.0, np.random.default_rng(7))
    c = diurnal_rates(2 * 1440, 100.0, 20.0, np.random.default_rng(8))
    assert a.shape == (2880,)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_diurnal_noiseless_shape_peak_and_trough():
    r = diurnal_rates(1440, 120.0, 30.0, np.random.default_rng(0), noise=0.0, peak_hour=14.0)
    assert r.max() == pytest.approx(120.0)
    assert r.min() == pytest.approx(30.0)
    assert int(np.argmax(r)) == 14 * 60  # peak at 14:00
    assert int(np.argmin(r)) == 2 * 60  # trough 12 h later (02:00)
    day2 = diurnal_rates(1440, 120.0, 30.0, np.random.default_rng(0), noise=0.0, start_minute=1440)
    np.testing.assert_allclose(r, day2)  # periodic with the day


def test_diurnal_noise_is_mean_one_and_keeps_the_shape():
    base = diurnal_rates(7 * 1440, 100.0, 20.0, np.random.default_rng(0), noise=0.0)
    noisy = diurnal_rates(7 * 1440, 100.0, 20.0, np.random.default_rng(0), noise=0.1)
    ratio = noisy / base
    assert abs(ratio.mean() - 1.0) < 0.02
    assert 0.07 < np.log(ratio).std() < 0.13
    hourly = noisy.reshape(-1, 60).mean(axis=1).reshape(7, 24).mean(axis=0)
    assert int(np.argmax(hourly)) in (13, 14)
    assert int(np.argmin(hourly)) in (1, 2)


@settings(max_examples=40, deadline=None)
@given(
    trough=st.floats(0.0, 50.0),
    extra=st.floats(0.0, 500.0),
    seed=st.integers(0, 2**32 - 1),
    noise=st.floats(0.0, 0.5),
    minutes=st.integers(0, 3000),
)
def test_diurnal_rates_are_finite_and_non_negative(trough, extra, seed, noise, minutes):
    r = diurnal_rates(minutes, trough + extra, trough, np.random.default_rng(seed), noise=noise)
    assert r.shape == (minutes,)
    assert np.all(np.isfinite(r)) and np.all(r >= 0)


def test_diurnal_rejects_bad_parameters():
    with pytest.raises(ValueError):
        diurnal_rates(10, 10.0, 20.0, np.random.default_rng(0))  # trough above peak
    with pytest.raises(ValueError):
        diurnal_rates(10, 10.0, 1.0, np.random.default_rng(0), noise_corr=1.0)


# --------------------------------------------------------------------------- GenAI trace

needs_data = pytest.mark.skipif(
    not GENAI.is_file(), reason=f"real data not present: {GENAI} (../shared/data next to the repo)"
)


@needs_data
def test_genai_real_trace_per_minute():
    r = read_genai_qps(GENAI)
    assert 1300 <= len(r) <= 1400  # 22.3 h of 60-s windows
    assert np.all(r >= 0) and r.max() > 0
    assert 5.0 < r.max() < 20.0  # summed across ~100 containers, req/s
    hourly = read_genai_qps(GENAI, window_s=3600.0)
    assert len(hourly) == 23
    assert hourly[:10].mean() > 5 * hourly[-6:].mean()  # busy first half, quiet night at the end


@needs_data
def test_genai_request_types_add_up_and_scale_to_peak():
    total = read_genai_qps(GENAI)
    gen = read_genai_qps(GENAI, request_type="Generative Requests")
    api = read_genai_qps(GENAI, request_type="api requests")
    assert len(gen) == len(api) == len(total)
    np.testing.assert_allclose(gen + api, total, atol=1e-9)
    scaled = read_genai_qps(GENAI, peak_per_s=400.0)
    assert scaled.max() == pytest.approx(400.0)
    np.testing.assert_allclose(scaled / 400.0, total / total.max())


def write(tmp_path: Path, text: str, name: str = "qps.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_genai_sums_containers_and_averages_instants(tmp_path):
    # 57-s grid: instants 0, 57, 114, 171 (empty), 228; two containers at 0 and 57
    p = write(tmp_path, HEADER + "1000,1.0,a,Generative Requests\n1000,2.0,b,Generative Requests\n"
              "1057,0.5,a,Generative Requests\n1114,4.0,,API Requests\n1228,1.0,a,Generative Requests\n")
    r = read_genai_qps(p, window_s=114.0)  # windows [0,114), [114,228), [228,342)
    np.testing.assert_allclose(r, [(3.0 + 0.5) / 2, (4.0 + 0.0) / 2, 1.0])
    gen = read_genai_qps(p, window_s=114.0, request_type="Generative Requests")
    np.testing.assert_allclose(gen, [(3.0 + 0.5) / 2, 0.0, 1.0])
    held = read_genai_qps(p, window_s=30.0)  # shorter than the grid: hold the last instant
    np.testing.assert_allclose(held, [3.0, 0.5, 0.5, 4.0, 4.0, 0.0, 0.0, 1.0])


def one_line_error(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_genai_missing_column_names_file_and_field(tmp_path):
    p = write(tmp_path, "timestamp_anon,container_ip,request_type\n1000,a,API Requests\n")
    with pytest.raises(InputError) as e:
        read_genai_qps(p)
    msg = one_line_error(e)
    assert str(p) in msg and "value" in msg and "header" in msg


def test_genai_negative_value_names_file_row_and_field(tmp_path):
    p = write(tmp_path, HEADER + "1000,1.0,a,API Requests\n1057,-0.5,a,API Requests\n")
    with pytest.raises(InputError) as e:
        read_genai_qps(p)
    msg = one_line_error(e)
    assert str(p) in msg and "row 3" in msg and "field value" in msg and "-0.5" in msg


def test_genai_bad_timestamp_and_empty_and_unknown_type(tmp_path):
    p = write(tmp_path, HEADER + "soon,1.0,a,API Requests\n", "ts.csv")
    with pytest.raises(InputError) as e:
        read_genai_qps(p)
    assert "row 2, field timestamp_anon" in one_line_error(e)
    p = write(tmp_path, HEADER, "empty.csv")
    with pytest.raises(InputError) as e:
        read_genai_qps(p)
    assert str(p) in one_line_error(e)
    p = write(tmp_path, HEADER + "1000,1.0,a,API Requests\n", "type.csv")
    with pytest.raises(InputError) as e:
        read_genai_qps(p, request_type="Embedding Requests")
    msg = one_line_error(e)
    assert str(p) in msg and "request_type" in msg and "API Requests" in msg
    with pytest.raises(InputError) as e:
        read_genai_qps(tmp_path / "absent.csv")
    assert "absent.csv" in one_line_error(e)


def test_genai_zero_trace_cannot_scale(tmp_path):
    p = write(tmp_path, HEADER + "1000,0,a,API Requests\n")
    with pytest.raises(InputError) as e:
        read_genai_qps(p, peak_per_s=10.0)
    assert "field value" in one_line_error(e)
    assert math.isclose(read_genai_qps(p)[0], 0.0)
