"""The sim_vs_real bench's verdict over trials (bench/ is scripts, not the package: loaded by path)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def svr():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("sim_vs_real", BENCH / "sim_vs_real.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sim_vs_real"] = mod  # its dataclasses look their module up there
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("sim_vs_real", None)
        sys.path.remove(str(BENCH))


def trial(real_p99: float, sim_p99: float, real_speed: float = 30.0, sim_speed: float = 29.6, match: float = 1.0,
          after: tuple[float, float] | None = (58.0, 57.1)) -> dict:
    m = {"real_p99_ms": real_p99, "sim_p99_ms": sim_p99, "p99_error_pct": 100 * abs(sim_p99 - real_p99) / real_p99,
         "real_speed_per_s": real_speed, "sim_speed_per_s": sim_speed,
         "speed_error_pct": 100 * abs(sim_speed - real_speed) / real_speed, "bottleneck_match": match}
    if after is not None:
        m.update(real_speed_after_per_s=after[0], sim_speed_after_per_s=after[1],
                 speed_error_after_pct=100 * abs(after[1] - after[0]) / after[0])
    return {"metrics": m}


def test_the_verdict_compares_the_means_and_keeps_the_worst_single_trial(svr):
    m = svr.verdict([trial(40.0, 32.0), trial(30.0, 33.0), trial(35.0, 37.0)])
    assert m["real_p99_ms"] == pytest.approx(35.0) and m["sim_p99_ms"] == pytest.approx(34.0)
    assert m["p99_error_pct"] == pytest.approx(100 / 35)  # not the mean of the trials' errors (20, 10, 5.7)
    assert m["max_trial_p99_error_pct"] == pytest.approx(20.0)
    assert m["speed_error_after_pct"] == pytest.approx(100 * 0.9 / 58.0)
    assert m["bottleneck_match"] == 1.0


def test_one_mismatched_bottleneck_fails_the_match_and_a_missing_shape_drops_its_error(svr):
    m = svr.verdict([trial(40.0, 40.0), trial(40.0, 40.0, match=0.0, after=None)])
    assert m["bottleneck_match"] == 0.0
    assert "speed_error_after_pct" not in m and "real_speed_after_per_s" not in m
    nan = trial(40.0, 40.0)
    nan["metrics"]["real_speed_after_per_s"] = math.nan  # a shape with no measurement
    assert "speed_error_after_pct" not in svr.verdict([trial(40.0, 40.0), nan])
