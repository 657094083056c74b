"""The CLI's contract (docs/cli.md): --version, completion, choices from the one policy registry,
--harvest on simulate, --json - (JSON on stdout, the rest on stderr), output paths checked
before any work, one-line errors with documented exit codes, and `reamer cleanup`."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reamer.cli import common
from reamer.cli.main import app
from reamer.policies import policy_names

REAMER = str(Path(sys.executable).parent / "reamer")
WIDE = {"COLUMNS": "250"}  # help tables unwrapped

TINY_COLO = """\
name: tinycolo
seed: 1
horizon_s: 3600
cluster:
  nic_gbps: 10
  node_pools:
    - {name: v100, count: 2, cores: 64, mem_gib: 384, gpus: 8, gpu_model: V100M32}
workload:
  kind: synthetic
  jobs: 4
  mean_interarrival_s: 300
  models: [resnet50, mobilenet_v2]
  workers: [1, 2]
  ps: [1, 1]
  worker_cores: [4, 8]
  ps_cores: [1, 2]
  gpus_per_worker: 1
  runtime_s: [600, 1800]
inference:
  services:
    - {id: resnet, model: resnet50, slo_p99_ms: 300, peak_rate_per_s: 20}
  pool: {name: inference, count: 1, cores: 32, mem_gib: 128}
"""


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, **kw)


def run(*args, env=None):
    return CliRunner().invoke(app, list(args), env=env)


def one_line(r) -> str:
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: "), r.output
    return lines[0]


@pytest.fixture
def nothing_runs(monkeypatch):
    """Every command's work fails the test if it starts."""
    import reamer.calibration.run
    import reamer.cli.local
    import reamer.cli.main
    from reamer.backends.local import session

    def started(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr(reamer.cli.main, "run_policies", started)
    monkeypatch.setattr(reamer.cli.local, "run_real", started)
    monkeypatch.setattr(reamer.calibration.run, "calibrate", started)
    monkeypatch.setattr(session, "sweep_leftovers", started)
    monkeypatch.setattr(session, "unavailable", lambda *a, **k: None)  # `local` would go on to run


@pytest.fixture
def colo(tmp_path) -> Path:
    p = tmp_path / "colo.yaml"
    p.write_text(TINY_COLO)
    return p


# ----------------------------------------------------------------------------- version, completion
def test_version_is_the_installed_package_version():
    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"reamer {version('reamer')}"


def test_completion_is_offered_and_completes_policy_names(tmp_path):
    r = run("--help")
    assert "--install-completion" in r.output and "--show-completion" in r.output
    env = {**os.environ, "_REAMER_COMPLETE": "complete_bash", "COMP_WORDS": "reamer simulate --policy ",
           "COMP_CWORD": "3"}
    p = _run([REAMER], env=env)
    assert p.returncode == 0 and p.stdout.split() == policy_names("training"), p.stderr
    env.update(COMP_WORDS="reamer simulate --harvest u")
    p = _run([REAMER], env=env)
    assert p.stdout.split() == [n for n in policy_names("harvest") if n.startswith("u")]
    env.update(COMP_WORDS="reamer cl", COMP_CWORD="1")
    assert _run([REAMER], env=env).stdout.split() == ["cleanup"]
    # --install-completion writes the script under $HOME (a scratch one here), for the shell it
    # is run from (detected from its parent processes): run from bash, as a user would, whatever
    # started the tests (`; exit $?` keeps bash the parent instead of letting it exec the command)
    home = tmp_path / "home"
    home.mkdir()
    p = _run(["bash", "-c", f"{shlex.quote(str(REAMER))} --install-completion; exit $?"],
             env={**os.environ, "HOME": str(home), "SHELL": "/bin/bash"})
    assert p.returncode == 0, p.stderr
    assert "_REAMER_COMPLETE" in (home / ".bash_completions" / "reamer.sh").read_text()


# ----------------------------------------------------------------------------- choices
def test_help_shows_the_choices_of_policy_mode_and_log_level():
    assert "|".join(policy_names("training")) in run("simulate", "--help", env=WIDE).output
    assert "|".join(policy_names("harvest")) in run("simulate", "--help", env=WIDE).output
    assert "auto|real|sim" in run("demo", "--help", env=WIDE).output
    assert "debug|info|warning|error" in run("--help", env=WIDE).output
    k8s = run("k8s", "controller", "--help", env=WIDE).output
    assert "|".join(policy_names("training")) in k8s and "|".join(policy_names("harvest")) in k8s
    assert "|".join(policy_names("harvest")) in run("k8s", "scheduler", "--help", env=WIDE).output


def test_the_choices_are_the_registry(monkeypatch):
    """No second list: a policy registered in reamer.policies.REGISTRY is shown and accepted."""
    from reamer import policies

    entry = policies.REGISTRY["static"]
    monkeypatch.setitem(policies.REGISTRY, "toy", entry)
    assert policy_names("training")[-1] == "toy"
    assert "nearchus|toy" in run("simulate", "--help", env=WIDE).output
    r = run("simulate", "-p", "toy", "--seed", "3", "-q")  # built by the registry's entry (a static policy)
    assert r.exit_code == 0, r.output


def test_a_harvest_policy_given_to_policy_says_where_it_goes(tmp_path):
    r = run("simulate", "-p", "reamer", "--json", str(tmp_path / "o.json"))
    assert r.exit_code == 2
    line = one_line(r)
    assert "--policy: value: expected one of static, optimus, nearchus (training policies), got 'reamer'" in line
    assert "--harvest reamer" in line
    assert not (tmp_path / "o.json").exists()


def test_a_bad_log_level_is_one_line():
    r = run("--log-level", "loud", "simulate")
    assert r.exit_code == 2 and "--log-level: value: expected one of debug, info, warning, error" in one_line(r)
    assert run("--log-level", "INFO", "simulate", "--help").exit_code == 0  # (any case, as before)


# ----------------------------------------------------------------------------- --harvest
def test_harvest_runs_every_training_policy_with_every_harvest_policy(colo, tmp_path):
    out = tmp_path / "o.json"
    r = run("simulate", str(colo), "-p", "static", "--harvest", "reamer", "--harvest", "naive", "--json", str(out))
    assert r.exit_code == 0, r.output
    runs = json.loads(out.read_text())["runs"]
    assert [x["policy"] for x in runs] == ["static+reamer", "static+naive"]
    assert all("slo_attainment_pct" in x["metrics"] for x in runs)
    assert "SLO met" in r.stdout  # the co-location table


def test_harvest_needs_a_scenario_with_inference(tmp_path):
    out = tmp_path / "o.json"
    r = run("simulate", "--harvest", "reamer", "--json", str(out))
    assert r.exit_code == 2 and "--harvest" in one_line(r) and "inference: section" in one_line(r)
    assert not out.exists()


def test_harvest_rejects_a_training_policy(colo):
    r = run("simulate", str(colo), "--harvest", "nearchus")
    assert r.exit_code == 2
    assert "(harvest policies), got 'nearchus'" in one_line(r) and "--policy nearchus" in one_line(r)


# ----------------------------------------------------------------------------- --json -
def test_simulate_json_dash_writes_json_to_stdout_and_the_table_to_stderr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("simulate", "-p", "static", "--seed", "7", "--json", "-")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["bench"] == "simulate" and doc["runs"][0]["policy"] == "static"
    assert "default (seed 7)" in r.stderr
    assert not (tmp_path / "-").exists()


def test_the_training_table_shows_unfinished_jobs_and_allocation_beside_use(colo):
    """JCTs are over finished jobs, so the unfinished count stands beside them; allocation
    beside use; GPU columns only for a cluster with GPUs."""
    from reamer.cli.main import _scenario, _table
    from reamer.runtime import simulate

    cpu = [c.header for c in _table([simulate(_scenario(None), "static")], "t").columns]
    assert cpu[:3] == ["policy", "finished", "unfinished"]
    assert cpu.index("CPU alloc %") + 1 == cpu.index("CPU used %")
    assert not [h for h in cpu if "GPU" in h]  # the default scenario has no GPUs
    res = simulate(_scenario(colo), "static", harvest="reamer")
    gpu = [c.header for c in _table([res], "t").columns]
    assert gpu.index("GPU alloc %") + 1 == gpu.index("GPU used %")
    row = dict(zip(gpu, [c._cells[0] for c in _table([res], "t").columns], strict=True))
    assert row["unfinished"] == f"{res.metrics['unfinished']:.0f}" and row["finished"] == f"{res.metrics['jobs']:.0f}"


def test_simulate_json_dash_as_a_process_is_parseable(colo):
    p = _run([sys.executable, "-m", "reamer.cli.main", "simulate", str(colo), "--harvest", "reamer", "--json", "-"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"][0]["policy"] == "static+reamer"
    assert "SLO met" in p.stderr


def test_calibrate_json_dash_writes_the_profile_to_stdout(monkeypatch, tmp_path):
    import reamer.calibration.run as cal

    doc = {"machine": {"cpu": "test cpu", "nproc": 2, "torch": "-", "onnxruntime": "-"},
           "training": {"core_gflops": 10.0, "parallel_fraction": 0.9, "oversub_penalty": 0.1,
                        "ps_update_ns_per_byte": 0.5, "source": "test"}}
    monkeypatch.setattr(cal, "calibrate", lambda **kw: doc)
    monkeypatch.chdir(tmp_path)
    r = run("calibrate", "--parts", "training", "--json", "-")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["machine"]["cpu"] == "test cpu"
    assert "calibration: test cpu" in r.stderr and not (tmp_path / "-").exists()


# ----------------------------------------------------------------------------- output paths
BAD_OUTPUTS = [
    ("simulate", "--json"), ("simulate", "--report"), ("demo", "--json"), ("demo", "--report"),
    ("local", "--json"), ("local", "--report"), ("calibrate", "--json"), ("cleanup", "--json"),
]


def _bad_path(kind: str, tmp_path: Path, monkeypatch) -> Path:
    if kind == "a folder":
        return tmp_path
    if kind == "under a file":
        (tmp_path / "file").write_text("")
        return tmp_path / "file" / "out.x"
    if kind == "in /sys":  # no file can be made there, root or not (root passes os.access: the probe tells)
        if not Path("/sys").is_dir():
            pytest.skip("no /sys here")
        return Path("/sys/reamer-out.x")
    ro = tmp_path / "ro"  # (root may write anywhere: the check's answer is what is faked)
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(common.os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    return ro / "sub" / "out.x"


@pytest.mark.parametrize("kind", ["a folder", "under a file", "not writable", "in /sys"])
@pytest.mark.parametrize("command,option", BAD_OUTPUTS)
def test_an_unwritable_output_is_one_line_before_anything_runs(command, option, kind, tmp_path, monkeypatch,
                                                                 nothing_runs):
    bad = _bad_path(kind, tmp_path, monkeypatch)
    extra = ["--mode", "sim"] if command == "demo" else ["--parts", "training"] if command == "calibrate" else []
    r = run(command, *extra, option, str(bad))
    assert r.exit_code == 2, r.output
    line = one_line(r)
    assert line.startswith(f"error: {option}: {bad}: expected"), line


def test_report_cannot_be_stdout(nothing_runs):
    r = run("simulate", "--report", "-")
    assert r.exit_code == 2 and "only --json writes to stdout" in one_line(r)


def test_a_missing_output_folder_is_fine(tmp_path):
    out = tmp_path / "new" / "deeper" / "o.json"
    r = run("simulate", "-p", "static", "-q", "--json", str(out))
    assert r.exit_code == 0 and json.loads(out.read_text())["runs"]


# ----------------------------------------------------------------------------- runtime errors
def test_the_table_names_the_models_whose_fraction_the_speed_model_extrapolated():
    r = run("simulate", "-p", "static", env=WIDE)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())  # the caption wraps at the table's width
    assert "parallel fractions past the cores they were measured at" in text
    assert "resnet50 (2 → 4 cores)" in text  # the default's workers reach 4 cores


def test_an_os_error_during_the_run_is_one_line_exit_1(tmp_path, monkeypatch):
    from reamer.reports import results

    out = tmp_path / "o.json"

    def full(path, doc):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(results, "write_json", full)
    r = run("simulate", "-p", "static", "-q", "--json", str(out))
    assert r.exit_code == 1
    assert one_line(r) == f"error: {out}: {os.strerror(errno.ENOSPC)}"


def test_an_unexpected_error_is_one_line_exit_1_and_debug_adds_the_traceback(monkeypatch):
    import reamer.cli.main

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(reamer.cli.main, "run_policies", boom)
    r = run("simulate", "-q")
    assert r.exit_code == 1
    assert "RuntimeError: boom" in one_line(r) and "--log-level debug" in one_line(r)
    r = run("--log-level", "debug", "simulate", "-q")
    assert r.exit_code == 1 and "Traceback" in r.stderr and "error: RuntimeError: boom" in r.stderr


def test_ctrl_c_exits_130(monkeypatch):
    import reamer.cli.main

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(reamer.cli.main, "run_policies", interrupted)
    assert run("simulate", "-q").exit_code == 130


def test_usage_errors_are_one_line():
    r = run("simulate", "--nosuch")
    assert r.exit_code == 2 and "No such option: --nosuch" in one_line(r) and "simulate --help" in one_line(r)


# ----------------------------------------------------------------------------- cleanup
@pytest.fixture
def sweep(monkeypatch, tmp_path):
    """A scratch lock and a recorded sweep (the real one would act on this machine's cgroups)."""
    from reamer.backends.local import session

    calls = []
    found = ["reamer-local/cifar-ps0", "reamer-local/cifar-w0", f"{session.NETNS_PREFIX}-4242-h0"]
    monkeypatch.setattr(session, "LOCK_PATH", tmp_path / "reamer-local.lock")
    monkeypatch.setattr(session, "sweep_leftovers", lambda root=session.CGROUP_ROOT: calls.append(root) or found)
    return calls


def test_cleanup_removes_the_leftovers_and_says_what(sweep, tmp_path):
    """The temporary folder a killed run without a state folder left (marked as the run's) goes;
    a folder of the same name without the mark is someone else's and stays."""
    from reamer.backends.local import session

    temp = tmp_path / "tmp"
    dead = temp / f"{session.TEMP_PREFIX}k9x"
    (dead / "logs").mkdir(parents=True)
    (dead / session.TEMP_MARK).write_text("4242\n")
    other = temp / f"{session.TEMP_PREFIX}mine"
    other.mkdir()
    r = run("cleanup", "--cgroup-root", str(tmp_path), "--temp-root", str(temp))
    assert r.exit_code == 0, r.output
    assert sweep == [tmp_path]
    assert r.stdout.splitlines() == ["removed cgroup reamer-local/cifar-ps0", "removed cgroup reamer-local/cifar-w0",
                                     "removed network namespace rmrl-4242-h0", f"removed temporary run folder {dead}"]
    assert not dead.exists() and other.is_dir()


def test_cleanup_json(sweep, tmp_path):
    r = run("cleanup", "--json", "-", "--temp-root", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"removed": {"cgroups": ["reamer-local/cifar-ps0", "reamer-local/cifar-w0"],
                                                "namespaces": ["rmrl-4242-h0"], "folders": []}}
    assert "removed cgroup" in r.stderr
    out = tmp_path / "c.json"
    assert run("cleanup", "--json", str(out), "--temp-root", str(tmp_path)).exit_code == 0
    assert json.loads(out.read_text())["removed"]["namespaces"] == ["rmrl-4242-h0"]


def test_cleanup_with_nothing_left(monkeypatch, sweep, tmp_path):
    from reamer.backends.local import session

    monkeypatch.setattr(session, "sweep_leftovers", lambda root: [])
    r = run("cleanup", "--temp-root", str(tmp_path))
    assert r.exit_code == 0 and r.stdout.startswith("nothing to remove")


def test_cleanup_refuses_while_a_live_run_holds_the_lock(sweep, tmp_path):
    from reamer.backends.local import session

    code = (f"import time, pathlib; from reamer.backends.local.session import run_lock\n"
            f"with run_lock(pathlib.Path({str(session.LOCK_PATH)!r})):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = run("cleanup", "--temp-root", str(tmp_path))
        assert r.exit_code == 2
        assert f"pid {holder.pid}" in one_line(r) and "no live real run" in one_line(r)
        assert sweep == []  # nothing touched
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert run("cleanup", "--temp-root", str(tmp_path)).exit_code == 0 and len(sweep) == 1  # the dead holder freed it


def test_cleanup_errors_are_one_line_exit_1(monkeypatch, sweep, tmp_path):
    from reamer.backends.local import session
    from reamer.backends.local.cgroups import CgroupError

    def denied(root):
        raise CgroupError(tmp_path / "reamer-local" / "x", "a removable cgroup", "Permission denied")

    monkeypatch.setattr(session, "sweep_leftovers", denied)
    r = run("cleanup")
    assert r.exit_code == 1 and "Permission denied" in one_line(r)

