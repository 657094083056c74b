import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reamer.cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_simulate_json_is_reproducible(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        r = run("simulate", "--policy", "static", "--seed", "7", "--json", str(out), "-q")
        assert r.exit_code == 0, r.output
    da, db = json.loads(a.read_text()), json.loads(b.read_text())
    for d in (da, db):
        d["runs"][0]["metrics"].pop("wall_s")
    assert da == db
    run0 = da["runs"][0]
    assert da["bench"] == "simulate" and run0["seed"] == 7 and run0["policy"] == "static"
    for key in ("jobs", "mean_jct_s", "p50_jct_s", "p95_jct_s", "mean_queue_s", "makespan_s",
                "cpu_util_pct", "gpu_util_pct"):
        assert isinstance(run0["metrics"][key], float)


def _bad(tmp_path, *args, where: str):
    out = tmp_path / "out.json"
    r = run("simulate", *args, "--json", str(out), "-q")
    assert r.exit_code == 2
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and where in lines[0], r.output
    assert not out.exists()


def test_unknown_policy(tmp_path):
    _bad(tmp_path, "--policy", "nosuch", where="expected one of")


def test_malformed_yaml(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("cluster: {node_pools: [\n")
    _bad(tmp_path, str(p), where=f"{p}: line")


def test_negative_cpu_in_node_list(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\na,-1000,1024,0,\n")
    p = tmp_path / "s.yaml"
    p.write_text("cluster: {node_list: nodes.csv}\n")
    _bad(tmp_path, str(p), where=f"{nodes}: row 2, field cpu_milli")


def test_missing_column_in_job_list(tmp_path):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,model,arrival_s\na,resnet50,0\n")
    p = tmp_path / "s.yaml"
    p.write_text("cluster: {node_pools: [{name: a, count: 1, cores: 8, mem_gib: 16}]}\n"
                 "workload: {kind: joblist, path: jobs.csv}\n")
    _bad(tmp_path, str(p), where="missing ps")


def test_a_busy_dashboard_port_fails_before_the_run_and_its_outputs(tmp_path):
    import socket

    with socket.socket() as taken:  # a real port on loopback, held by another socket
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        report = tmp_path / "r.html"
        _bad(tmp_path, "--dashboard", "--dashboard-port", port, "--report", str(report), where="--dashboard-port")
        assert not report.exists()


@pytest.mark.slow
def test_demo_runs_and_writes_report(tmp_path):
    """The simulated half (the real half: tests/backends/local/test_session.py); ``--json -``:
    the JSON alone on stdout, the tables on stderr."""
    rep = tmp_path / "r.html"
    r = run("demo", "--mode", "sim", "--report", str(rep), "--json", "-")
    assert r.exit_code == 0, r.output
    policies = [x["policy"] for x in json.loads(r.stdout)["runs"]]
    assert "static" in policies and "static+reamer" in policies
    assert "Reamer demo" in r.stderr and rep.stat().st_size > 10_000


def test_demo_rejects_an_unknown_mode(tmp_path):
    r = run("demo", "--mode", "fast", "--report", str(tmp_path / "r.html"))
    assert r.exit_code == 2 and "--mode: value: expected one of auto, real, sim, got 'fast'" in r.output
    assert not (tmp_path / "r.html").exists()


def test_local_rejects_a_bad_scenario_in_one_line(tmp_path):
    p = tmp_path / "l.yaml"
    p.write_text("hosts: [{name: a, cores: -1}]\n")
    r = run("local", str(p), "--report", str(tmp_path / "r.html"))
    assert r.exit_code == 2, r.output
    assert "field hosts.0.cores" in r.output and "greater than 0" in r.output
    assert not (tmp_path / "r.html").exists()


def test_local_checks_its_policy_before_it_touches_the_machine(tmp_path, monkeypatch):
    """An unknown policy is bad input before the machine probe (which writes a test cgroup)."""
    import yaml

    from reamer.backends.local import session

    probed = []
    monkeypatch.setattr(session, "unavailable", lambda: probed.append(1) or "not probed in this test")
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "src/reamer/data/local.yaml").read_text())
    doc["policy"]["training"] = "bogus"
    p = tmp_path / "l.yaml"
    p.write_text(yaml.safe_dump(doc))
    r = run("local", str(p), "--report", str(tmp_path / "r.html"))
    assert r.exit_code == 2, r.output
    assert "field policy.training" in r.output and "bogus" in r.output and not probed


def test_identical_across_processes_and_hash_seeds(tmp_path):
    """Two separate processes (different string-hash seeds) write the same results."""
    import os
    import subprocess
    import sys

    outs = []
    for hashseed in ("1", "2"):
        out = tmp_path / f"run{hashseed}.json"
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        subprocess.run([sys.executable, "-m", "reamer.cli.main", "simulate", "-p", "static", "-p", "nearchus",
                        "--seed", "7", "--json", str(out), "-q"], check=True, env=env, capture_output=True)
        doc = json.loads(out.read_text())
        for r in doc["runs"]:
            r["metrics"].pop("wall_s")
        outs.append(doc)
    assert outs[0] == outs[1]
