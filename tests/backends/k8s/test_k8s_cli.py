"""``reamer k8s`` as an operator runs it: CRDs installed (idempotently), a component with its
/healthz /readyz /metrics, and bad input as one line with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import make_node, publish_slack
from test_k8s_controller import training_job

from reamer.backends.k8s.kube import custom

REAMER = str(Path(sys.executable).parent / "reamer")


def test_install_crds_is_idempotent(devcluster):
    cmd = [REAMER, "k8s", "install-crds", "--kubeconfig", str(devcluster.kubeconfig()), "--json"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert set(out) == {"trainingjobs.reamer.io", "inferenceservices.reamer.io", "nodeslacks.reamer.io"}
    assert set(out.values()) == {"updated"}  # the session fixture created them


def test_bad_kubeconfig_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    p = subprocess.run([REAMER, "k8s", "controller", "--kubeconfig", str(bad)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and str(bad) in p.stderr
    p = subprocess.run([REAMER, "k8s", "controller", "--policy", "reamer", "--kubeconfig", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--policy" in p.stderr and "training policies" in p.stderr
    p = subprocess.run([REAMER, "k8s", "controller", "--kubeconfig", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60)
    want = f"error: {tmp_path / 'nope'}: file: expected an existing kubeconfig file"
    assert p.returncode == 2 and p.stderr.strip() == want
    p = subprocess.run([REAMER, "k8s", "agent", "--node", "n", "--interval", "0", "--kubeconfig", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--interval" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_an_api_server_that_is_not_there_is_one_line_exit_1(tmp_path):
    """Nothing listens on the kubeconfig's port (a real TCP refusal on loopback)."""
    import socket

    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = tmp_path / "kubeconfig"
    kc.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    p = subprocess.run([REAMER, "k8s", "install-crds", "--kubeconfig", str(kc)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith(f"error: no answer from the API server at 127.0.0.1:{port} (")
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_a_transport_error_is_an_api_error_naming_the_server_and_the_reason():
    """What the client raises when no answer comes (urllib3's errors) becomes an ApiError with
    status 0, which every per-object guard handles like a 5xx, in one line an operator reads."""
    import ssl

    import urllib3
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, NewConnectionError, ProtocolError, SSLError

    from reamer.backends.k8s.kube import no_answer

    pool = urllib3.HTTPConnectionPool("10.0.0.1", 6443)
    cases = [(MaxRetryError(pool, "/api", NewConnectionError(None, "HTTPConnection(host='10.0.0.1', port=6443): "
                                                                  "Failed to establish a new connection: [Errno 111] "
                                                                  "Connection refused")),
              "no answer from the API server at 10.0.0.1:6443 ([Errno 111] Connection refused)"),
             (MaxRetryError(pool, "/api", ConnectTimeoutError(None, "Connection to 10.0.0.1 timed out. "
                                                                    "(connect timeout=5)")),
              "no answer from the API server at 10.0.0.1:6443 (Connection to 10.0.0.1 timed out. (connect timeout=5))"),
             (MaxRetryError(pool, "/api", SSLError(ssl.SSLCertVerificationError(
                 1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate"))),
              "no TLS session with the API server at 10.0.0.1:6443 (self-signed certificate)"),
             (ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer")),
              "no answer from the API server at https://k:6443 ([Errno 104] Connection reset by peer)")]
    for err, line in cases:
        e = no_answer(err, "https://k:6443")
        assert (e.status, str(e)) == (0, line)


def test_controller_serves_health_and_metrics(kube, ns, devcluster):
    make_node(kube, "node-a", 16)
    kube.create(custom("trainingjobs", ns), training_job("m", ps=1, workers=1))
    p = subprocess.Popen([REAMER, "k8s", "controller", "--kubeconfig", str(devcluster.kubeconfig()), "-n", ns,
                          "--interval", "0.2", "--metrics-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        port = json.loads(p.stdout.readline())["metrics_port"]
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
            if 'reamer_decisions_total{component="controller",kind="StartJob"}' in text:
                break
            time.sleep(0.2)
        assert 'reamer_rounds_total{component="controller"}' in text
        assert 'reamer_backend_actions{action="pods_created",component="controller"} 2.0' in text
        for path in ("/healthz", "/readyz"):
            assert urllib.request.urlopen(base + path, timeout=5).status == 200
        assert kube.get(custom("trainingjobs", ns, "m"))["status"]["phase"] == "Running"
    finally:
        p.terminate()
        assert p.wait(20) == 0  # SIGTERM: the loop ends after its round


def test_controller_with_harvest_runs_both_in_joint_rounds(kube, ns, devcluster):
    from test_k8s_scheduler import inference_service, replica_pods

    make_node(kube, "gpu-a", 16)
    publish_slack(kube, "gpu-a", reported_at=time.time() + 60, cores=16)
    kube.create(custom("trainingjobs", ns), training_job("j", ps=1, workers=1))
    kube.create(custom("inferenceservices", ns), inference_service("vgg"))
    cmd = [REAMER, "k8s", "controller", "--kubeconfig", str(devcluster.kubeconfig()), "-n", ns, "--interval", "0.2",
           "--policy", "static", "--harvest", "reamer", "--rounds", "3"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert kube.get(custom("trainingjobs", ns, "j"))["status"]["phase"] == "Running"
    assert [x["spec"].get("nodeName") for x in replica_pods(kube, ns, "vgg")] == ["gpu-a"]
    bad = subprocess.run([*cmd[:-4], "--harvest", "nearchus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--harvest" in bad.stderr and "harvest policies" in bad.stderr


def test_the_controller_serves_its_rounds_on_the_dashboard_and_as_series(kube, ns, devcluster, browser):
    """The joint controller (NEARCHUS + Reamer in one process) against the real API server,
    with --dashboard-port: the dashboard's API holds its rounds (both halves), the page draws
    them in headless Chromium, and /metrics has the rounds' series."""
    from test_k8s_scheduler import inference_service

    from reamer.runtime.rounds import CPU_BANDS

    make_node(kube, "gpu-d", 16)
    publish_slack(kube, "gpu-d", reported_at=time.time() + 60, cores=16)
    kube.create(custom("trainingjobs", ns), training_job("dj", ps=1, workers=1))
    kube.create(custom("inferenceservices", ns), inference_service("dvgg"))
    p = subprocess.Popen([REAMER, "k8s", "controller", "--kubeconfig", str(devcluster.kubeconfig()), "-n", ns,
                          "--interval", "0.3", "--policy", "nearchus", "--harvest", "reamer", "--metrics-port", "0",
                          "--dashboard-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ports = {k: v for _ in range(2) for k, v in json.loads(p.stdout.readline()).items() if k.endswith("_port")}
        dash, metrics = f"http://127.0.0.1:{ports['dashboard_port']}/", f"http://127.0.0.1:{ports['metrics_port']}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = json.loads(urllib.request.urlopen(dash + "api/rounds?since=0", timeout=5).read())
            if len(got["rounds"]) >= 3 and any("dj" in r["shapes"] for r in got["rounds"]):
                break
            time.sleep(0.2)
        rounds = got["rounds"]
        assert got["meta"]["backend"] == "kubernetes" and not got["finished"]
        assert all(r["halves"] == ["training", "harvest"] for r in rounds)
        assert "dvgg" in rounds[-1]["inference"] and set(CPU_BANDS) <= set(rounds[-1]["nodes"]["gpu-d"])
        text = urllib.request.urlopen(metrics + "/metrics", timeout=5).read().decode()
        assert 'reamer_job_cpu_cores{job="dj"}' in text and 'reamer_service_slo_seconds{service="dvgg"}' in text
        assert 'reamer_node_cpu_cores{node="gpu-d",use="inference"}' in text
        browser.get_log("browser")
        browser.get(dash)
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(browser, 30).until(lambda d: d.execute_script(
            "return window.reamerDashboard && reamerDashboard.draws > 0 && reamerDashboard.rounds.length >= 3"))
        drawn = browser.execute_script("return document.getElementById('plot-cores').data.map(function (t) { "
                                       "return t.name; })")
        assert drawn == ["dj"]
        assert not [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        p.terminate()
        assert p.wait(20) == 0
