"""bench/reamer.py's speed-up against static+reamer, and its need options. (The bench itself
simulates for minutes; its output is cited in docs/results.md.)"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "reamer.py"


def _bench():
    sys.path.insert(0, str(BENCH.parent))  # its sibling _common
    try:
        spec = importlib.util.spec_from_file_location("reamer_bench", BENCH)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH.parent))
    return mod


def _run(policy, seed, samples, packing=70, load=0.5, qos="guaranteed"):
    return {"policy": policy, "seed": seed, "params": {"packing_pct": packing, "peak_load": load, "training_qos": qos},
            "metrics": {"training_samples": samples}}


def test_speedup_is_against_static_reamer_of_the_same_seed_qos_packing_and_load():
    b = _bench()
    runs = [_run("static+reamer", 1, 100.0), _run("nearchus+reamer", 1, 130.0), _run("naive", 1, 90.0),
            _run("static+reamer", 2, 200.0), _run("nearchus+reamer", 2, 180.0),
            _run("nearchus+reamer", 1, 50.0, packing=85),  # no baseline at 85 %
            _run("static+reamer", 1, 120.0, qos="burstable"), _run("nearchus+reamer", 1, 132.0, qos="burstable")]
    b.speedups(runs)
    got = [r["metrics"]["training_speedup_vs_static_ratio"] for r in runs]
    assert got == [1.0, 1.3, 0.9, 1.0, 0.9, None, 1.0, 1.1]


def test_joint_harvest_is_against_the_uncoordinated_run_and_pooled_over_runs():
    b = _bench()

    def run(policy, seed, hours, samples, packing=70):
        r = _run(policy, seed, samples, packing)
        r["metrics"]["harvested_core_hours"] = hours
        return r

    runs = [run("nearchus+reamer-uncoordinated", 1, 10.0, 100.0), run("nearchus+reamer", 1, 6.0, 110.0),
            run("nearchus+reamer-uncoordinated", 2, 30.0, 100.0), run("nearchus+reamer", 2, 36.0, 90.0),
            run("nearchus+reamer", 3, 5.0, 50.0),  # no uncoordinated run of seed 3
            run("nearchus+reamer-uncoordinated", 1, 0.0, 100.0, packing=85), run("nearchus+reamer", 1, 2.0, 1.0, 85),
            run("static+reamer", 1, 12.0, 100.0), run("static+reamer", 2, 1.0, 100.0)]
    b.speedups(runs)
    got = [r["metrics"].get("harvested_vs_uncoordinated_ratio") for r in runs]
    assert got == [None, 0.6, None, 1.2, None, None, None, None, None]  # joint runs only; none against 0
    # Σ ÷ Σ over the runs both policies have: (6 + 36 + 2) ÷ (10 + 30 + 0), the harvest of seed 1 counting
    # less than its per-run ratio says; and the speed-up (110 + 90) ÷ (100 + 100)
    assert b.pooled(runs, "nearchus+reamer-uncoordinated", "harvested_core_hours", "nearchus+reamer") == 44.0 / 40.0
    assert b.pooled(runs, "static+reamer", "training_samples", "nearchus+reamer") == 1.0
    assert b.pooled(runs, "static+reamer", "training_samples", "naive") is None


def test_the_need_options_take_a_number_or_pai2020():
    b = _bench()
    assert b._number_or_pai("pai2020") == "pai2020" and b._number_or_pai("0.3") == 0.3
    with pytest.raises(argparse.ArgumentTypeError):
        b._number_or_pai("lots")
    assert set(b.POLICIES) >= {"static+reamer", "nearchus+reamer-uncoordinated", "nearchus+reamer"}
    assert b.POLICIES["nearchus+reamer-uncoordinated"][2] == "none" and b.POLICIES["nearchus+reamer"][2] == "joint"


def test_set_overrides_the_inference_section_and_a_policys_options(tmp_path):
    b = _bench()
    ap = argparse.ArgumentParser()
    ov = (b._override(ap, "inference.need_percentile=75"), b._override(ap, "reamer.stable_s=60"),
          b._override(ap, "inference.coordination=none"))
    assert ov == (("inference", "need_percentile", 75), ("reamer", "stable_s", 60), ("inference", "coordination", "none"))
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,8,V100M16\n")  # openb's node list columns
    sc = b.scenario(1, nodes, 3600.0, 4.0, "joint", 0.0, 1.0, 100.0, "burstable", ov)
    assert sc.inference.need_percentile == 75 and sc.inference.coordination == "none"
    assert sc.policy.options["reamer"] == {"stable_s": 60}
    assert sc.policy.options["nearchus"]["trim_ps"] is False  # the bench's own options stay
    assert b.scenario(1, nodes, 3600.0, 4.0, "joint", 0.0, 1.0, 100.0, "burstable").inference.need_percentile == 95


def test_set_rejects_what_is_not_section_key_value(capsys):
    b = _bench()
    with pytest.raises(SystemExit) as e:
        b._override(argparse.ArgumentParser(prog="reamer.py"), "stable_s")
    assert e.value.code == 2 and "expected SECTION.KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--packings", "150"], ["--loads", "0"], ["--set", "reamer"]])
def test_bad_arguments_stop_before_any_run(args, tmp_path, monkeypatch, capsys):
    b = _bench()
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["reamer.py", "--json", str(out), *args])
    with pytest.raises(SystemExit) as e:
        b.main()
    assert e.value.code == 2 and not out.exists()
    assert len([x for x in capsys.readouterr().err.splitlines() if "error:" in x]) == 1
