"""bench/cpu_scaling.py's pure parts: the published curves load as cited runs and fit to the
Amdahl fraction their own speed-ups give; a malformed curve is one clear error; the new
training architectures have the zoo's published parameter counts. (The measuring sweep needs
root and writable cgroups and minutes; it is run by hand, its output is docs/data/cpu_scaling.json.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cpu_scaling.py"


def _bench():
    spec = importlib.util.spec_from_file_location("cpu_scaling_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_published_curves_are_cited_runs_and_fit_their_speedups():
    b = _bench()
    runs = b.published_runs(b.PUBLISHED)
    assert runs and all(r["policy"] == "published" and r["params"]["source"] for r in runs)
    ratios = b.fractions(runs)
    f = ratios["published_parallel_fraction_paddle-11620-mklml_ratio"]
    pts = [(r["params"]["threads"], r["metrics"]["samples_per_s"]) for r in runs
           if r["params"]["curve"] == "paddle-11620-mklml"]
    s8 = dict(pts)[8] / dict(pts)[1]  # 6.01x at 8 cores: Amdahl f = (1 - 1/s) / (1 - 1/8) = 0.955
    assert f == pytest.approx((1 - 1 / s8) / (1 - 1 / 8), abs=0.02)
    assert not any(k.startswith("parallel_fraction_") for k in ratios)  # published never counted as measured


def test_a_malformed_curve_names_its_field(tmp_path):
    b = _bench()
    bad = tmp_path / "pub.json"
    bad.write_text(json.dumps({"curves": [{"id": "x", "model": "resnet50", "kind": "training", "points": [[1, 2.0]]}]}))
    with pytest.raises(SystemExit, match=r"curves\[0\]\.source: missing"):
        b.published_runs(bad)


def test_measured_fractions_come_from_the_thread_sweep():
    b = _bench()
    runs = [{"scenario": "threads", "policy": "measured", "params": {"model": "m", "threads": t, "quota_cores": None},
             "metrics": {"samples_per_s": r}} for t, r in ((1, 10.0), (2, 16.0))]
    # 2 threads at 1.6x: f = 2 (1 - 1/1.6) = 0.75
    assert b.fractions(runs)["parallel_fraction_m_ratio"] == pytest.approx(0.75, abs=1e-3)


@pytest.mark.parametrize("name", ["densenet121", "vit_b16", "bilstm"])
def test_training_architectures_have_the_published_sizes(name):
    torch = pytest.importorskip("torch")
    from reamer.calibration.archs import build_model
    from reamer.models.zoo import ZOO

    model, _, _ = build_model(torch, name)
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(ZOO[name].params_m, rel=0.01)
