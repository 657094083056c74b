"""bench/nearchus.py's ratio keys: nearchus against static and optimus on the shipped profile's
curves, and against static at each what-if parallel fraction of the sensitivity table. (The
bench itself simulates for minutes; its output is cited in docs/results.md.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "nearchus.py"


def _bench():
    sys.path.insert(0, str(BENCH.parent))  # its sibling _common
    try:
        spec = importlib.util.spec_from_file_location("nearchus_bench", BENCH)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH.parent))
    return mod


def test_ratios_per_fraction_are_against_the_static_run_at_that_fraction():
    b = _bench()
    def m(jct, q, s):
        return {"mean_jct_s": jct, "mean_queue_s": q, "speedup_vs_static_ratio": s}

    per = {}
    for seed, k in ((1, 1.0), (2, 2.0)):
        per[("paper", seed, "static", b.MEASURED)] = m(100.0 * k, 10.0, 1.0)
        per[("paper", seed, "optimus", b.MEASURED)] = m(200.0 * k, 0.0, 0.5)
        per[("paper", seed, "nearchus", b.MEASURED)] = m(50.0 * k, 5.0, 1.5 * k)
        per[("paper", seed, "static", 0.9)] = m(80.0, 8.0, 1.0)
        per[("paper", seed, "nearchus", 0.9)] = m(40.0 * k, 2.0, 2.0)
    r = b.compute_ratios(per, [1, 2])
    assert r["jct_nearchus_over_static_paper_min_ratio"] == r["jct_nearchus_over_static_paper_max_ratio"] == 0.5
    assert r["speedup_nearchus_over_static_paper_max_ratio"] == pytest.approx(3.0)
    assert r["queue_nearchus_over_optimus_paper_min_ratio"] == float("inf")  # a zero baseline
    assert r["jct_nearchus_over_static_paper_f0.9_min_ratio"] == 0.5
    assert r["jct_nearchus_over_static_paper_f0.9_max_ratio"] == 1.0
    assert not any("optimus_paper_f" in k for k in r)  # the sensitivity runs static and nearchus only


def test_sensitivity_starts_at_the_shipped_machine_wide_fraction():
    from reamer.models.profiles import shipped_profiles

    fs = _bench().sensitivity_fractions()
    assert fs[0] == shipped_profiles().calibration.parallel_fraction and fs[1:] == [0.8, 0.9, 0.95]
