"""The node agent against a real kube-apiserver 1.20.2: it finds its node's pods with a field
selector, scrapes their metrics, publishes its NodeSlack (owned by the Node), and the
controller reads the training telemetry from it. The pods' cgroups do not exist here (no
kubelet): the cgroup side is covered by test_k8s_agent.py on real cgroups."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from conftest import Kubelet, make_node
from test_k8s_controller import job_pods, training_job
from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.agent import METRICS_PORT, Agent
from reamer.backends.k8s.kube import custom


class _Counter(BaseHTTPRequestHandler):
    samples = 0

    def do_GET(self):  # noqa: N802
        type(self).samples += 320
        body = (f"# TYPE reamer_train_samples_total counter\nreamer_train_samples_total {self.samples}\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        return None


def test_agent_publishes_what_the_controller_reads(kube, ns, controller):
    make_node(kube, "node-a", 16)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    tj = training_job("scraped", ps=1, workers=1)
    tj["spec"]["worker"]["template"]["metadata"]["annotations"] = {METRICS_PORT: str(srv.server_port)}
    kube.create(custom("trainingjobs", ns), tj)
    c = controller(policy="static")
    c.round()
    Kubelet(kube, ns).sync()
    agent = Agent(kube, "node-a", cgroup_root=Path("/sys/fs/cgroup"), scrape_host="127.0.0.1")
    try:
        agent.round()
        time.sleep(0.5)
        slack = agent.round()
    finally:
        srv.shutdown()
    st = slack["status"]
    assert slack["metadata"]["ownerReferences"][0]["kind"] == "Node" and st["cores"] == 16.0
    names = {e["name"] for e in st["pods"] if e["namespace"] == ns}  # (other tests' pods may sit on node-a)
    assert names == {ko.meta(p)["name"] for p in job_pods(kube, ns, "scraped")}
    [w] = [e for e in st["pods"] if e["namespace"] == ns and "-worker" in e["name"]]
    assert w["metrics"]["reamer_train_samples_total:rate"] > 0 and st["windowSeconds"] > 0.4
    rnd = c.round()
    tel = rnd.snapshot.telemetry["scraped"]
    assert tel.speed == w["metrics"]["reamer_train_samples_total:rate"]
    assert kube.get(custom("trainingjobs", ns, "scraped"))["status"]["samplesDone"] > 0
