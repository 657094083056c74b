"""Real runs of the local backend (issue 5): NEARCHUS drives real PS training through the one
backend interface; nothing is left behind after a run, after Ctrl-C, or after ``kill -9`` of
the controller followed by the startup sweep. Root, cgroups, iproute2, torch needed: skipped
with the reason elsewhere."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from reamer.backends.local import session
from reamer.backends.local.cgroups import CgroupExecutor
from reamer.backends.local.netns import list_namespaces
from reamer.config.local import parse_local
from reamer.models.profiles import load_profiles
from reamer.reports.local import phases
from reamer.runtime.local import run_scenario

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

SCENARIO = {
    "name": "test-local",
    "seed": 1,
    "max_s": 150,
    "hosts": [{"name": "ps-a", "cores": 1.0, "cpus": [0], "link_mbit": 5},
              {"name": "trainer", "cores": 2.0},
              {"name": "ps-b", "cores": 1.0, "cpus": [0], "link_mbit": 5}],
    "jobs": [{"id": "j1", "model": "resnet_narrow", "samples": 2000, "ps": 1, "workers": 1, "ps_cores": 1.0,
              "worker_cores": 1.0, "max_ps": 2, "max_workers": 1}],
    "policy": {"training": "nearchus", "harvest": None, "interval_s": 3, "options": {"nearchus": {"block_s": 60}}},
}


def _need_local() -> None:
    reason = session.unavailable()
    if reason is not None:
        pytest.skip(f"no real local run here: {reason}")


def _workload_pids() -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"reamer.workloads.real" in cmd:
                out.append(int(d.name))
    return out


def _reported(pid: int, event: str) -> bool:
    """Whether the workload process ``pid`` has written an ``event`` line to its telemetry
    file (its stdout)."""
    try:
        return f'"event": "{event}"' in Path(os.readlink(f"/proc/{pid}/fd/1")).read_text()
    except OSError:
        return False


def _left() -> tuple[list[str], list[str], list[int]]:
    ex = CgroupExecutor(session.CGROUP_ROOT, prefix=session.CGROUP_PREFIX, controllers=("cpu", "cpuset"))
    ns = [n for n in list_namespaces() if n.startswith(session.NETNS_PREFIX + "-")]
    return ex.list_owned(), ns, _workload_pids()


def test_nearchus_adds_a_ps_to_a_network_bound_real_job_and_speed_rises():
    _need_local()
    run = run_scenario(parse_local(SCENARIO, "test"), load_profiles(None))
    ph = phases(run.result.rounds, "j1")
    assert run.result.unfinished == 0, ph
    first = ph[0]
    assert (first["ps"], first["bottleneck"]) == (1, "network"), ph
    grown = [p for p in ph if p["ps"] == 2 and p["speed"] is not None]
    assert grown, f"NEARCHUS never added a PS: {ph}"
    assert grown[0]["speed"] > 1.3 * first["speed"], ph
    assert run.result.restarts_s and all(r > 0 for r in run.result.restarts_s)
    assert _left() == ([], [], [])


def _controller(tmp_path: Path) -> subprocess.Popen:
    sc = {**SCENARIO, "jobs": [{**SCENARIO["jobs"][0], "samples": 10**6}], "max_s": 120}
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump(sc))
    return subprocess.Popen([sys.executable, "-m", "reamer.cli.main", "local", str(path),
                             "--report", str(tmp_path / "r.html"), "--state-dir", str(tmp_path / "state")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal


def _wait_running(tmp_path: Path, p: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        owned, ns, pids = _left()
        if len(owned) >= 2 and len(pids) >= 2:
            time.sleep(1.0)
            return
        assert p.poll() is None, p.stdout.read() if p.stdout else ""
        time.sleep(0.5)
    raise AssertionError("the controller never started the job")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_the_controller_leaves_nothing(tmp_path, sig):
    _need_local()
    assert _left() == ([], [], [])
    p = _controller(tmp_path)
    try:
        _wait_running(tmp_path, p)
        p.send_signal(sig)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert _left() == ([], [], [])


def test_kill_9_then_the_startup_sweep_removes_everything(tmp_path):
    _need_local()
    p = _controller(tmp_path)
    try:
        _wait_running(tmp_path, p)
        p.kill()
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    owned, ns, pids = _left()
    assert owned and ns and pids  # a crash leaves things behind ...
    removed = session.sweep_leftovers()  # ... which the next run's first step removes
    assert set(owned) <= set(removed) and set(ns) <= set(removed)
    time.sleep(0.5)
    assert _left() == ([], [], [])


@pytest.mark.parametrize("role", ["worker", "ps"])
def test_a_process_killed_mid_run_restarts_the_job_from_its_checkpoint_and_the_job_finishes(role):
    """kill -9 of a worker or of the PS: the controller notices, the job resumes from its
    latest complete checkpoint (the PS checkpoints every 20 steps), at most that interval of
    steps is lost, the job finishes, the JSON says what died, and nothing is left behind."""
    _need_local()
    sc = {**SCENARIO, "name": "test-kill-worker", "max_s": 120,
          "hosts": [{"name": "ps-a", "cores": 1.0, "cpus": [0]}, {"name": "trainer", "cores": 1.0, "cpus": [1]}],
          "jobs": [{**SCENARIO["jobs"][0], "samples": 8000, "max_ps": 1}],
          "policy": {"training": "static", "harvest": None, "interval_s": 2}}
    killed: list[int] = []

    def killer() -> None:
        """Mid-run: once the worker has reported training steps (on a loaded machine its start
        alone can take longer than any fixed delay; a kill during the launch is another fault)."""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not killed:
            procs = {}
            for pid in _workload_pids():
                try:
                    procs[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
            training = any(b"ps_training\x00worker\x00" in cmd and _reported(pid, "interval")
                           for pid, cmd in procs.items())
            for pid, cmd in procs.items():
                if training and f"ps_training\x00{role}\x00".encode() in cmd:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.5)

    threading.Thread(target=killer, daemon=True).start()
    run = run_scenario(parse_local(sc, "test"), load_profiles(None))
    assert killed, f"the {role} was never killed"
    res = run.result
    assert res.unfinished == 0 and not res.failed_jobs, (res.failures, res.failed_jobs)
    assert [f[1] for f in res.failures] == ["j1"] and role in res.failures[0][2]
    assert 0 <= res.failures[0][3] <= 20  # steps lost: at most one checkpoint interval
    assert "j1" in res.jct_s
    assert _left() == ([], [], [])


@pytest.mark.parametrize("fault,why", [(signal.SIGKILL, "exited"), (signal.SIGSTOP, "stopped answering")],
                         ids=["kill-9", "sigstop"])
def test_a_replica_killed_or_stopped_mid_run_leaves_routing_and_is_replaced(fault, why):
    """kill -9 (or SIGSTOP for 10 s) of the only replica: it leaves routing within a round (a
    stopped one after two missed health probes), the harvesting policy places a new one, the
    outage windows count as missed, later windows meet the SLO, the errors reported are the
    load generator's, and nothing is left behind."""
    _need_local()
    sc = {"name": "test-kill-replica", "seed": 1, "max_s": 120, "system_reserve_cores": 0.25,
          "hosts": [{"name": "trainer", "cores": 2.0, "cpus": [0, 1]}],
          "jobs": [{"id": "j", "model": "small_cnn", "samples": 64, "batch": 32, "ps": 1, "workers": 1,
                    "ps_cores": 0.25, "worker_cores": 0.25}],
          "services": [{"id": "vgg", "model": "vgg_cifar", "slo_p99_ms": 250, "window_s": 5,
                        "rates": [10] * 12}],  # a minute: room for a slow start and a replacement's start
          "policy": {"training": "static", "harvest": "reamer", "interval_s": 2,
                     "options": {"reamer": {"core_options": [0.5, 0.75, 1.0], "min_cores": 0.25, "core_step": 0.25,
                                            "stable_s": 0, "stale_s": 10}}}}
    killed: list[int] = []

    serving = threading.Event()  # set after the first round that saw a measured window

    def on_round(rec) -> None:
        if rec.inference.get("vgg", {}).get("p99_ms") is not None:
            serving.set()

    def killer() -> None:
        # the fault comes once the replica serves and the load runs (not at a wall-clock offset:
        # a loaded machine may still be starting the replica then)
        if not serving.wait(90):
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            servers = []
            for pid in _workload_pids():
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"inference_server" in cmd:
                    servers.append(pid)
            if len(servers) == 1:  # the only replica (not one a move is starting or retiring)
                pid = servers[0]
                os.kill(pid, fault)
                killed.append(pid)
                if fault == signal.SIGSTOP:
                    time.sleep(10)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                return
            time.sleep(0.2)

    threading.Thread(target=killer, daemon=True).start()
    run = run_scenario(parse_local(sc, "test"), load_profiles(None), on_round=on_round)
    assert killed, "the replica was never killed"
    res = run.result
    assert [f[2] for f in res.replica_failures] == [why], res.replica_failures
    windows = run.services["vgg"]
    placed = [e for e in run.events if e[1] == "PlaceReplica"]
    assert len(placed) >= 2, placed  # the first replica, and the one that replaced it
    rep = run.load_reports["vgg"]
    errors = sum(rep.get("errors", {}).values())
    assert errors == sum(w["errors"] for w in windows) and errors > 0
    assert windows[-1]["errors"] == 0 and windows[-1]["p99_ms"] is not None and windows[-1]["p99_ms"] <= 250
    from reamer.reports.local import summarize

    m = summarize(run, {"vgg": 250.0})
    assert m["windows_missed:vgg"] >= 1 and m["errors:vgg"] == errors
    assert _left() == ([], [], [])


KILL_SC = {**SCENARIO, "name": "test-kill-controller", "max_s": 120,
           "hosts": [{"name": "ps-a", "cores": 1.0, "cpus": [0]}, {"name": "trainer", "cores": 1.0, "cpus": [1]}],
           "jobs": [{**SCENARIO["jobs"][0], "samples": 12000, "max_ps": 1}],
           "policy": {"training": "static", "harvest": None, "interval_s": 2}}


def _local(tmp_path: Path, *extra: str) -> subprocess.Popen:
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump(KILL_SC))
    return subprocess.Popen([sys.executable, "-m", "reamer.cli.main", "local", str(path), "--report",
                             str(tmp_path / "r.html"), "--state-dir", str(tmp_path / "state"), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})


def _checkpoint_step(tmp_path: Path) -> int:
    from reamer.workloads.real.ps_training import read_manifest

    m = read_manifest(tmp_path / "state" / "checkpoints" / "j1")
    return m[1] if m else 0


def test_kill_9_of_the_controller_then_restart_resumes_the_job_from_its_checkpoint(tmp_path):
    """kill -9 of the controller: the workloads train on (their telemetry goes to files, not a
    pipe); the same command again has them leave cleanly, sweeps the dead run's cgroups and
    namespaces, resumes the job on its recorded shape from its checkpoint with at most one
    checkpoint interval (20 steps) lost, says so, the job finishes, and nothing is left —
    the state folder included, as the run finished cleanly."""
    import json

    _need_local()
    assert _left() == ([], [], [])
    p = _local(tmp_path)
    try:
        deadline = time.monotonic() + 90
        while _checkpoint_step(tmp_path) < 40:
            assert p.poll() is None and time.monotonic() < deadline, p.stdout.read() if p.stdout else ""
            time.sleep(0.2)
        p.kill()
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    record = json.loads((tmp_path / "state" / "run.json").read_text())
    assert record["status"] == "running" and [j["status"] for j in record["jobs"]] == ["running"]
    step_at_kill = _checkpoint_step(tmp_path)
    time.sleep(3.0)
    owned, ns, pids = _left()
    assert len(pids) == 2, "the workloads died with their controller"
    assert _checkpoint_step(tmp_path) > step_at_kill, "the job did not train on without its controller"

    again = _local(tmp_path, "--json", str(tmp_path / "out.json"))
    out, _ = again.communicate(timeout=150)
    assert again.returncode == 0, out
    assert "resumed the crashed run of 'test-kill-controller'" in out, out
    doc = json.loads((tmp_path / "out.json").read_text())
    entry = doc["runs"][0]
    assert entry["metrics"]["unfinished_jobs"] == 0, entry
    (f,) = entry["failures"]
    assert f["job"] == "j1" and f["what"] == "controller restarted" and 0 <= f["steps_lost"] <= 20, f
    assert not (tmp_path / "state").exists()
    assert _left() == ([], [], [])
