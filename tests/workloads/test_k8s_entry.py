"""The reference PS training job meets the Kubernetes telemetry contract: run from the
``REAMER_*`` environment a TrainingJob pod gets, real PS and worker processes over real TCP,
its worker serves ``reamer_train_samples_total`` that the agent's scraper reads."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from reamer.backends.k8s.agent import scrape
from reamer.workloads.real.k8s_entry import argv_from_env

pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_env_maps_to_ps_and_worker_arguments(tmp_path):
    env = {"REAMER_ROLE": "ps", "REAMER_INDEX": "1", "REAMER_PS_HOSTS": "ps0.j:7000,ps1.j:7001",
           "REAMER_WORKER_HOSTS": "worker2.j:7000,worker3.j:7000", "REAMER_SAMPLES": "6400", "REAMER_BATCH": "32",
           "REAMER_CHECKPOINT_DIR": str(tmp_path)}
    argv = argv_from_env(env)
    assert argv[:2] == ["ps", "--host"] and argv[argv.index("--port") + 1] == "7001"
    assert argv[argv.index("--shards") + 1] == "2" and argv[argv.index("--workers") + 1] == "2"
    assert "--resume" not in argv
    (tmp_path / "manifest.json").write_text('{"shards": 1, "step": 3}')
    assert "--resume" in argv_from_env(env)
    w = argv_from_env({**env, "REAMER_ROLE": "worker", "REAMER_INDEX": "0"})
    assert w[w.index("--steps") + 1] == "100"  # 6400 samples / (32 × 2 workers)
    with pytest.raises(ValueError, match="REAMER_PS_HOSTS"):
        argv_from_env({k: v for k, v in env.items() if k != "REAMER_PS_HOSTS"})


def test_reference_job_serves_the_samples_counter():
    ps_port, metrics = _port(), _port()
    base = {**os.environ, "REAMER_PS_HOSTS": f"127.0.0.1:{ps_port}", "REAMER_WORKER_HOSTS": "127.0.0.1:0",
            "REAMER_SAMPLES": str(32 * 400), "REAMER_BATCH": "32", "REAMER_MODEL": "small_cnn",
            "REAMER_BIND": "127.0.0.1", "REAMER_METRICS_PORT": str(metrics), "REAMER_INDEX": "0"}
    cmd = [sys.executable, "-m", "reamer.workloads.real.k8s_entry"]
    ps = subprocess.Popen(cmd, env={**base, "REAMER_ROLE": "ps"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wk = subprocess.Popen(cmd, env={**base, "REAMER_ROLE": "worker"}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    try:
        first = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                fam = scrape(f"http://127.0.0.1:{metrics}/metrics")
            except OSError:
                time.sleep(0.2)
                continue
            v = sum(s[2] for s in fam["reamer_train_samples"]["samples"] if s[0].endswith("_total"))
            if first is None:
                first = v
            elif v > first:
                break
            time.sleep(0.3)
        assert first is not None and v > first and v % 32 == 0, (first, v)
    finally:
        for p in (wk, ps):
            p.kill()
            p.wait()
