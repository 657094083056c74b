"""Restart safety against a real kube-apiserver 1.20.2: the controller and the scheduler run as
real processes, are SIGKILLed at points inside a reconcile (``--crash-at``, a fault hook that
kills the process there), and restarted. Each time the cluster converges with no
TrainingJob, InferenceService or pod lost or duplicated (pods and owner references counted)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import Controller, Kubelet, make_node, publish_slack
from test_k8s_controller import job_pods, training_job
from test_k8s_scheduler import inference_service, replica_pods

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.kube import custom
from reamer.domain import Resize, Resources

pytestmark = pytest.mark.slow
REAMER = str(Path(sys.executable).parent / "reamer")


def run(devcluster, ns, component, *args, crash_at=None, rounds=None, timeout=60):
    cmd = [REAMER, "--log-level", "info", "k8s", component, "--kubeconfig", str(devcluster.kubeconfig()),
           "-n", ns, "--interval", "0.2", *args]
    if crash_at:
        cmd += ["--crash-at", crash_at]
    if rounds:
        cmd += ["--rounds", str(rounds)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p


def killed(p) -> bool:
    return p.returncode == -signal.SIGKILL


def check_job(kube, ns, name, uid):
    """The job's live pods are exactly its recorded shape, each owned once by the job."""
    tj = kube.get(custom("trainingjobs", ns, name))
    assert tj["metadata"]["uid"] == uid, "the TrainingJob was lost and recreated"
    st = tj["status"]
    live = job_pods(kube, ns, name)
    assert sorted(ko.meta(p)["name"] for p in live) == sorted(c["pod"] for c in st["containers"])
    per_container = Counter(ko.labels(p)[ko.CONTAINER] for p in live)
    assert all(n == 1 for n in per_container.values()), f"duplicated: {per_container}"
    for p in live:
        refs = p["metadata"]["ownerReferences"]
        assert len(refs) == 1 and refs[0]["uid"] == uid
        assert ko.pod_cpu_limit(p) == next(c["cpu"] for c in st["containers"] if c["pod"] == ko.meta(p)["name"])
    return st


@pytest.mark.parametrize("point", ["after-status", "gang-start", "after-pod-create"])
def test_controller_killed_during_gang_start_converges(kube, ns, devcluster, point):
    make_node(kube, "node-a", 32)
    uid = kube.create(custom("trainingjobs", ns), training_job("gang", ps=2, workers=3, cpu="2"))["metadata"]["uid"]
    p = run(devcluster, ns, "controller", "--policy", "static", crash_at=point)
    assert killed(p), p.stderr[-2000:]
    assert "fault injection: killed at " + point in p.stderr
    before = len(job_pods(kube, ns, "gang"))
    assert before < 5 or point == "after-pod-create"
    p = run(devcluster, ns, "controller", "--policy", "static", rounds=5)
    assert p.returncode == 0, p.stderr[-2000:]
    st = check_job(kube, ns, "gang", uid)
    assert (st["phase"], st["ps"], st["workers"], st["epoch"]) == ("Running", 2, 3, 1)
    assert len(kube.list(custom("trainingjobs", ns))[0]) == 1


def test_controller_killed_between_resize_and_recreate_converges(kube, ns, devcluster):
    make_node(kube, "node-a", 32)
    uid = kube.create(custom("trainingjobs", ns), training_job("rs", ps=1, workers=2, cpu="2"))["metadata"]["uid"]
    kubelet = Kubelet(kube, ns)
    c = Controller(kube, ns, policy="static")
    try:
        c.round()
        kubelet.sync()
        c.inf.sync()
        c.backend.observe(time.time())  # the decision is recorded in the status; its pod is still the old one
        worker = next(cid for cid in c.backend.view.state.owner if "/worker" in cid)
        st = c.backend.view.crs["rs"]["status"]
        recs = [dict(x) for x in st["containers"]]
        for x in recs:
            if x["name"] == worker.split("/")[1]:
                x["cpu"] = 6.0
        cr = dict(c.backend.view.crs["rs"])
        cr["status"] = {**st, "containers": recs}
        kube.replace(custom("trainingjobs", ns, "rs", "status"), cr)
    finally:
        c.stop()
    p = run(devcluster, ns, "controller", "--policy", "static", crash_at="resize-recreate")
    assert killed(p), p.stderr[-2000:]
    kubelet.sync()
    p = run(devcluster, ns, "controller", "--policy", "static", rounds=4)
    assert p.returncode == 0, p.stderr[-2000:]
    kubelet.sync()
    p = run(devcluster, ns, "controller", "--policy", "static", rounds=4)
    assert p.returncode == 0, p.stderr[-2000:]
    st = check_job(kube, ns, "rs", uid)
    rec = next(x for x in st["containers"] if x["name"] == worker.split("/")[1])
    assert rec["cpu"] == 6.0 and st["epoch"] == 2  # the job restarted from its checkpoint at the new size
    assert len(job_pods(kube, ns, "rs")) == 3


@pytest.mark.parametrize("point", ["after-create", "mid-migration"])
def test_scheduler_killed_mid_placement_or_migration_converges(kube, ns, devcluster, point):
    make_node(kube, "gpu-a", 16)
    publish_slack(kube, "gpu-a", reported_at=time.time(), cores=16)
    uid = kube.create(custom("trainingjobs", ns), training_job("tr", ps=1, workers=1, cpu="2"))["metadata"]["uid"]
    isvc = kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=20.0))["metadata"]["uid"]
    kubelet = Kubelet(kube, ns)
    c = Controller(kube, ns, policy="static")
    try:
        c.round()
        kubelet.sync()
        if point == "mid-migration":
            p = run(devcluster, ns, "scheduler", rounds=2)
            assert p.returncode == 0, p.stderr[-2000:]
            kubelet.sync()
            make_node(kube, "gpu-b", 16)
            for n in ("gpu-a", "gpu-b"):
                publish_slack(kube, n, reported_at=time.time(), cores=16)
            c.inf.sync()
            c.backend.observe(time.time())
            worker = next(cid for cid in c.backend.view.state.owner if "/worker" in cid)
            c.backend.actuate([Resize(worker, Resources(13.0, 2048.0))], time.time())
        p = run(devcluster, ns, "scheduler", crash_at=point)
        assert killed(p), p.stderr[-2000:]
        for n in ("gpu-a", "gpu-b"):
            publish_slack(kube, n, reported_at=time.time(), cores=16)
        for _ in range(3):
            kubelet.sync()
            p = run(devcluster, ns, "scheduler", rounds=2)
            assert p.returncode == 0, p.stderr[-2000:]
        kubelet.sync()
        live = [p for p in replica_pods(kube, ns, "vgg") if not ko.deleting(p)]
        st = kube.get(custom("inferenceservices", ns, "vgg"))
        assert st["metadata"]["uid"] == isvc
        assert live and all(p["spec"].get("nodeName") for p in live), "a replica pod was left unbound"
        assert len(live) == st["status"]["replicas"]
        assert Counter(ko.labels(p)[ko.REPLICA] for p in live).most_common(1)[0][1] == 1
        for p in live:
            refs = p["metadata"]["ownerReferences"]
            assert len(refs) == 1 and refs[0]["uid"] == isvc
        if point == "mid-migration":
            assert all(p["spec"]["nodeName"] == "gpu-b" for p in live)  # moved, and the old one gone
            for _ in range(3):
                c.round()
                kubelet.sync()
            [w] = [p for p in job_pods(kube, ns, "tr") if ko.labels(p)[ko.ROLE] == "worker"]
            assert ko.pod_cpu_limit(w) == 13.0
        check_job(kube, ns, "tr", uid)
    finally:
        c.stop()
