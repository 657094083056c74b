"""``simulate(..., profiles=)`` / ``reamer simulate --profiles``: the profile drives the simulation."""

import json

import pytest
from typer.testing import CliRunner

from reamer.runtime.sim import _with_interference
from reamer.cli.main import app
from reamer.config.scenario import load_embedded
from reamer.models.profiles import Interference, read_profile_json

SHIPPED, _ = read_profile_json(None)


def profile(tmp_path, core_s: float, name: str):
    doc = json.loads(json.dumps(SHIPPED))
    doc["models"] = {"small_cnn": {"params_m": 0.024, "fwd_gflops": 0.0056, "core_s_per_sample": core_s,
                                   "parallel_fraction": 0.6, "batch": 32, "source": "test"}}  # fmt: skip
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def scenario(tmp_path):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,model,arrival_s,ps,workers,ps_cpu,worker_cpu,samples\n"
                    "a,small_cnn,0,1,2,1,2,2000000\nb,small_cnn,10,1,1,1,1,500000\n")  # fmt: skip
    sc = tmp_path / "sc.yaml"
    sc.write_text("name: real-models\nseed: 1\ncluster:\n  node_pools:\n    - {name: cpu, count: 4, cores: 8, mem_gib: 32}\n"
                  f"workload: {{kind: joblist, path: {jobs}}}\n")  # fmt: skip
    return sc


def speed(tmp_path, prof) -> float:
    out = tmp_path / f"{prof.stem}.out.json"
    r = CliRunner().invoke(app, ["simulate", str(scenario(tmp_path)), "--profiles", str(prof), "--json", str(out), "-q"])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())["runs"][0]["metrics"]["mean_speed_samples_per_s"]


def test_doubled_per_sample_cost_halves_a_cpu_bound_real_model_job(tmp_path):
    base = speed(tmp_path, profile(tmp_path, 0.001, "base.json"))
    slow = speed(tmp_path, profile(tmp_path, 0.002, "slow.json"))
    assert slow / base == pytest.approx(0.5, rel=0.02)


def test_real_model_unknown_without_its_profile(tmp_path):
    doc = json.loads(json.dumps(SHIPPED))
    doc["models"] = {}
    p = tmp_path / "nomodels.json"
    p.write_text(json.dumps(doc))
    r = CliRunner().invoke(app, ["simulate", str(scenario(tmp_path)), "--profiles", str(p), "-q"])
    assert r.exit_code == 2 and "field model" in r.output and "small_cnn" in r.output


def test_bad_profile_is_one_line_and_writes_nothing(tmp_path):
    doc = json.loads(json.dumps(SHIPPED))
    doc["training"]["parallel_fraction"] = 2
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    r = CliRunner().invoke(app, ["simulate", "--profiles", str(p), "--json", str(out), "-q"])
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "training.parallel_fraction" in lines[0], r.output
    assert not out.exists()


def test_profile_interference_fills_only_what_the_scenario_leaves_unset():
    sc = load_embedded("colocation")
    inter = Interference(0.3, 0.7, "test")
    got = _with_interference(sc, inter).inference
    want = {k: (getattr(sc.inference, k) if k in sc.inference.model_fields_set else v)
            for k, v in (("training_interference", 0.3), ("inference_interference", 0.7))}  # fmt: skip
    assert (got.training_interference, got.inference_interference) == tuple(want.values())
    pinned = sc.model_copy(update={"inference": sc.inference.model_copy(update={"training_interference": 0.0})})
    pinned.inference.model_fields_set.add("training_interference")
    assert _with_interference(pinned, inter).inference.training_interference == 0.0
