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
    assert r["jct_nearchus_over_static_paper_f0p9_min_ratio"] == 0.5
    assert r["jct_nearchus_over_static_paper_f0p9_max_ratio"] == 1.0
    assert not any("optimus_paper_f" in k for k in r)  # the sensitivity runs static and nearchus only


def test_docs_tables_from_measured_and_what_if_runs(monkeypatch):
    """write_docs reads every ratio it prints from compute_ratios' keys (measured and what-if
    fractions side by side) and names the runs of a zero baseline instead of a ratio."""
    b = _bench()
    got = {}
    monkeypatch.setattr(b, "write_results_section", lambda name, lines: got.update({name: lines}))
    per = {}
    for seed in (1, 2):
        for fraction in (b.MEASURED, 0.586, 0.95):
            others = ("static", "optimus", "nearchus") if fraction == b.MEASURED else ("static", "nearchus")
            for p in others:
                jct = {"static": 100.0, "optimus": 120.0, "nearchus": 80.0}[p] * (2 if fraction == 0.95 else 1)
                per[("default", seed, p, fraction)] = {
                    "mean_jct_s": jct, "p95_jct_s": jct, "mean_queue_s": 0.0 if p == "optimus" else 10.0,
                    "speedup_vs_static_ratio": 1.0 if p == "static" else 1.25, "cpu_util_pct": 50.0,
                    "reconfigurations": 0.0}  # fmt: skip
    b.write_docs(per, [1, 2], b.compute_ratios(per, [1, 2]))
    text = "\n".join(got["NEARCHUS"])
    assert "| default | mean JCT | −35.6% | -20.0% to -20.0% | -33.3% to -33.3% |" in text
    assert "no ratio (baseline 0): 10 s vs 0 s; 10 s vs 0 s" in text  # queueing against optimus's 0
    assert "| default | 0.95 | +25.0% to +25.0% | -20.0% to -20.0% | +0.0% to +0.0% |" in text
    assert "| default | measured |" in text and "| default | 0.586 |" in text


def test_set_runs_nearchus_with_one_option_changed_and_rejects_a_bad_one(tmp_path):
    """``--set KEY=VALUE``: an ablation run beside nearchus, on the same seed (a subset: no ratios);
    a key or value the policy's config refuses is one line, exit 2, before any simulation."""
    import json
    import subprocess

    out = tmp_path / "abl.json"
    cmd = [sys.executable, str(BENCH), "--json", str(out), "--scenarios", "default", "--seeds", "1",
           "--policies", "nearchus", "--no-sensitivity", "--workers", "1", "--set", "trim=false"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    doc = json.loads(out.read_text())
    runs = {r["policy"]: r["metrics"] for r in doc["runs"]}
    assert set(runs) == {"static", "nearchus", "nearchus trim=false"} and doc["ratios"] == {}
    assert runs["nearchus trim=false"] != runs["nearchus"]  # the option took effect
    bad = subprocess.run(cmd[:-1] + ["trim=maybe"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "policy.options.nearchus.trim" in bad.stderr
