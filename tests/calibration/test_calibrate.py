"""``reamer calibrate``: bad options fail before measuring; a quick real run (root, cgroups)."""

import json

import pytest
from typer.testing import CliRunner

from reamer.calibration.worker import PREFIX, open_cgroups
from reamer.cli.main import app
from reamer.models.profiles import load_profiles
from reamer.workloads.real.loadgen import schedule_of


def test_bad_parts_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["calibrate", "--quick", "--parts", "training,gpu", "--json", str(out)])
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "--parts" in lines[0], r.output
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.privileged
def test_quick_calibration_writes_a_loadable_profile_and_leaves_no_cgroup(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    ex, reason = open_cgroups()
    if ex is None:
        pytest.skip(reason)
    out = tmp_path / "profiles.json"
    r = CliRunner().invoke(app, ["calibrate", "--quick", "--inference-models", "small_cnn", "--json", str(out)])
    assert r.exit_code == 0, r.output
    p = load_profiles(out)
    doc = json.loads(out.read_text())
    assert doc["training"]["source"].startswith("reamer calibrate --quick") and "not measured" not in doc["training"]["source"]
    assert {"oversub_eff_c050_t2", "background_load_cores"} <= set(doc["training"]["diagnostics"])
    m = p.models["small_cnn"]
    assert m.measured_core_s_per_sample > 0 and 0.02 < m.params_m < 0.03  # ~24k parameters, counted
    assert [c for c, _ in doc["models"]["small_cnn"]["measured"]][0] == 1
    assert p.inference["small_cnn"].b_s > 0 and p.interference is not None
    assert "resnet50" in p.inference  # carried over from the shipped profile, with its source
    loads = doc["inference"]["small_cnn"]["serving"]["loads"]  # the server's own time per batch, per load
    assert len(loads) == 2 and all(x["server_run_ms_per_batch"] > 0 and x["server_batch_mean"] >= 1 for x in loads)
    assert all(len(schedule_of(x["load_args"])) >= x["requests"] > 0 for x in loads)  # the arrivals it sent, replayable
    assert ex.list_owned() == [] and not any(h.joinpath(PREFIX).exists() for h in ex._hier_roots())


def test_interference_is_kept_only_when_it_stands_out_of_the_noise():
    from reamer.calibration.interference import significant

    assert significant([1.10, 1.12, 1.09, 1.11, 1.10, 1.13])  # a steady 11% slowdown
    assert not significant([1.03, 0.75, 1.30, 0.98, 1.12, 0.95])  # 3% inside ±30% drift
    assert not significant([1.2, 1.2])  # too few rounds to tell
