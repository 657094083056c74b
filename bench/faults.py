"""Faults injected into real runs of the local backend (root, cgroups, network namespaces):
what each costs against a fault-free reference of the same scenario.

    python bench/faults.py --json bench-faults.json [--faults kill_worker kill_ps ...]

Two scenarios, each run once without a fault (``none``) and once per fault:

* **training**: one PS job (resnet_narrow, 8,000 samples, 1 PS + 1 worker on 1 core each),
  ``static`` policy; faults ``kill_worker`` / ``kill_ps`` (SIGKILL 6 s in) and
  ``kill_controller`` (``reamer local`` with a state folder, SIGKILL 6 s in, the same command
  again 1 s later, as a supervisor restarts a crashed service);
* **inference**: one replica of vgg_cifar at 10 req/s (SLO 250 ms, 5 s windows) harvested by
  ``reamer`` beside a tiny job; faults ``kill_replica`` (SIGKILL 15 s in) and ``stop_replica``
  (SIGSTOP 15 s in, SIGCONT 10 s later).

Metrics per run: ``recovery_s`` (training: from the fault being noticed, the next round, to
the job running again from its checkpoint; ``kill_controller``: from the restart of the
controller to the job running again — the crashed run's workloads leaving cleanly, the
sweep, the relaunch; inference: the outage its clients saw, failed requests ÷ offered rate),
``steps_lost`` (steps the workers had reported before the fault that were trained again after
the restart), ``requests_failed``, ``slo_windows_missed``, ``job_finished`` (1/0); ``wall_s``
is the run's time from its first start to its end (for ``kill_controller``, both controllers').
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from reamer.backends.local import session
from reamer.config.local import parse_local
from reamer.models.profiles import load_profiles
from reamer.reports.local import summarize
from reamer.reports.results import document, run_entry, write_json
from reamer.runtime.local import run_scenario

TRAINING = {
    "name": "faults-training", "seed": 1, "max_s": 150,
    "hosts": [{"name": "ps-a", "cores": 1.0, "cpus": [0]}, {"name": "trainer", "cores": 1.0, "cpus": [1]}],
    "jobs": [{"id": "j", "model": "resnet_narrow", "samples": 8000, "ps": 1, "workers": 1, "ps_cores": 1.0,
              "worker_cores": 1.0, "max_ps": 1, "max_workers": 1}],
    "policy": {"training": "static", "harvest": None, "interval_s": 2},
}
INFERENCE = {
    "name": "faults-inference", "seed": 1, "max_s": 120, "system_reserve_cores": 0.25,
    "hosts": [{"name": "trainer", "cores": 2.0, "cpus": [0, 1]}],
    "jobs": [{"id": "j", "model": "small_cnn", "samples": 64, "batch": 32, "ps": 1, "workers": 1, "ps_cores": 0.25,
              "worker_cores": 0.25}],
    "services": [{"id": "vgg", "model": "vgg_cifar", "slo_p99_ms": 250, "window_s": 5, "rates": [10] * 8}],
    "policy": {"training": "static", "harvest": "reamer", "interval_s": 2,
               "options": {"reamer": {"core_options": [0.5, 0.75, 1.0], "min_cores": 0.25, "core_step": 0.25,
                                      "stable_s": 0, "stale_s": 10}}},
}
FAULTS = {  # fault -> (scenario, process to hit, signal, seconds in)
    "kill_worker": (TRAINING, b"ps_training\x00worker\x00", signal.SIGKILL, 6.0),
    "kill_ps": (TRAINING, b"ps_training\x00ps\x00", signal.SIGKILL, 6.0),
    "kill_replica": (INFERENCE, b"inference_server", signal.SIGKILL, 15.0),
    "stop_replica": (INFERENCE, b"inference_server", signal.SIGSTOP, 15.0),
    "kill_controller": (TRAINING, b"", signal.SIGKILL, 6.0),  # the controller itself: see run_kill_controller
}


def _pids(marker: bytes) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
    return out


def _inject(marker: bytes, sig: int, after_s: float, start: float, hit: list[float]) -> None:
    while time.monotonic() < start + after_s + 60 and not hit:
        if time.monotonic() >= start + after_s:
            for pid in _pids(marker):
                os.kill(pid, sig)
                hit.append(time.monotonic() - start)
                if sig == signal.SIGSTOP:
                    time.sleep(10)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                return
        time.sleep(0.2)


def run_one(fault: str, sc: dict) -> dict[str, float]:
    hit: list[float] = []
    start = time.monotonic()
    if fault != "none":
        _, marker, sig, after = FAULTS[fault]
        threading.Thread(target=_inject, args=(marker, sig, after, start, hit), daemon=True).start()
    run = run_scenario(parse_local(sc, "bench/faults.py"), load_profiles(None))
    res = run.result
    slo = {s["id"]: float(s["slo_p99_ms"]) for s in sc.get("services", [])}
    m = summarize(run, slo)
    recovery = None
    if hit and res.failures:
        recovery = res.restarts_s[-1] if res.restarts_s else None
    elif hit and res.replica_failures:  # the outage its clients saw: failed requests ÷ offered rate
        rate = sum(sum(s["rates"]) / len(s["rates"]) for s in sc["services"])
        recovery = sum(m.get(f"errors:{s}", 0.0) for s in slo) / rate
    nan = float("nan")  # not applicable (written as null)
    return {"recovery_s": nan if recovery is None else recovery, "steps_lost": float(sum(f[3] for f in res.failures)),
            "requests_failed": float(sum(m.get(f"errors:{s}", 0.0) for s in slo)),
            "slo_windows_missed": float(sum(m.get(f"windows_missed:{s}", 0.0) for s in slo)),
            "job_finished": float(res.unfinished == 0 and not res.failed_jobs), "fault_at_s": hit[0] if hit else nan,
            "wall_s": res.wall_s}


def run_kill_controller(sc: dict, after_s: float = 6.0, restart_after_s: float = 1.0) -> dict[str, float]:
    """``reamer local`` killed with SIGKILL ``after_s`` in, then resumed in this process from its
    state folder ``restart_after_s`` later."""
    from reamer.backends.local.runstate import read_state

    with tempfile.TemporaryDirectory(prefix="reamer-faults-") as tmp:
        state, path = Path(tmp) / "state", Path(tmp) / "sc.yaml"
        path.write_text(yaml.safe_dump(sc))
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-m", "reamer.cli.main", "local", str(path), "--state-dir", str(state),
                              "--report", str(Path(tmp) / "r.html")], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(after_s)
        if p.poll() is not None:
            raise RuntimeError(f"the controller exited (code {p.returncode}) before the fault")
        p.kill()
        p.wait()
        hit = time.monotonic() - t0
        started_wall = read_state(state).started_wall  # type: ignore[union-attr]
        time.sleep(restart_after_s)
        t_restart = time.time()
        run = run_scenario(parse_local(sc, "bench/faults.py"), load_profiles(None), state_dir=state)
    res = run.result
    resumed = [t for t, _, what in run.events if what.startswith("restarted from step")]
    nan = float("nan")
    recovery = started_wall + resumed[0] - t_restart + res.restarts_s[0] if resumed and res.restarts_s else nan
    return {"recovery_s": recovery, "steps_lost": float(sum(f[3] for f in res.failures)), "requests_failed": 0.0,
            "slo_windows_missed": 0.0, "job_finished": float(res.unfinished == 0 and not res.failed_jobs),
            "fault_at_s": hit, "wall_s": time.time() - started_wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_out", help="write results here")
    ap.add_argument("--faults", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    args = ap.parse_args()
    why = session.unavailable()
    if why is not None:
        print(f"error: bench/faults.py needs a real local run: {why}", file=sys.stderr)
        return 2
    runs = []
    scenarios = {id(FAULTS[f][0]): FAULTS[f][0] for f in args.faults}
    for sc in scenarios.values():
        for fault in ["none", *(f for f in args.faults if FAULTS[f][0] is sc)]:
            print(f"{sc['name']}: {fault} ...", file=sys.stderr, flush=True)
            m = run_kill_controller(sc) if fault == "kill_controller" else run_one(fault, sc)
            print("  " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items()),
                  file=sys.stderr, flush=True)
            runs.append(run_entry(sc["name"], sc["seed"], sc["policy"]["training"], m, {"fault": fault}))
    if args.json_out:
        write_json(args.json_out, document("faults", runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
