"""Tier C, opt-in: end to end on a real cluster with kubelets (kind or k3s ≥ 1.33, where
in-place pod resize is on by default). Skipped unless ``REAMER_E2E_KUBECONFIG`` names a
kubeconfig; docs/kubernetes.md says how to set one up. Uses a throw-away namespace and
``REAMER_E2E_IMAGE`` (default ``busybox:1.36``, any image that can ``sleep``)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.cluster import Informers
from reamer.backends.k8s.kube import ApiError, Kube, custom, pods
from reamer.backends.k8s.training import K8sTraining
from reamer.cli.k8s import crds
from reamer.domain import Resize, Resources
from reamer.models.profiles import shipped_profiles
from reamer.policies import make_policy
from reamer.runtime.k8s import controller_step

KUBECONFIG = os.environ.get("REAMER_E2E_KUBECONFIG")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not KUBECONFIG, reason="tier C is opt-in: set REAMER_E2E_KUBECONFIG to a "
                                                        "kind/k3s ≥ 1.33 cluster's kubeconfig")]


@pytest.fixture
def cluster():
    kube = Kube.connect(KUBECONFIG)
    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for crd in crds():
        try:
            kube.create(base, crd)
        except ApiError as e:
            if e.status != 409:
                raise
    ns = f"reamer-e2e-{uuid.uuid4().hex[:6]}"
    kube.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    time.sleep(2)
    yield kube, ns
    kube.delete(f"/api/v1/namespaces/{ns}")


def _wait(pred, timeout_s=180.0, what=""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


def test_job_runs_and_resizes_in_place(cluster):
    kube, ns = cluster
    image = os.environ.get("REAMER_E2E_IMAGE", "busybox:1.36")
    tmpl = {"spec": {"containers": [{"name": "train", "image": image, "command": ["sleep", "3600"],
                                     "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]}]}}
    role = {"replicas": 1, "resources": {"cpu": "100m", "memory": "64Mi"}, "template": tmpl}
    kube.create(custom("trainingjobs", ns), {"apiVersion": "reamer.io/v1alpha1", "kind": "TrainingJob",
                                             "metadata": {"name": "e2e"}, "spec": {
                                                 "model": "small_cnn", "samples": 1e9, "ps": role, "worker": role}})
    inf = Informers(kube, ns, kinds=("nodes", "pods", "jobs", "slacks")).start()
    try:
        be = K8sTraining(kube, inf, ns, shipped_profiles().models)
        step = controller_step(be, make_policy("static", None, interval_s=5.0), time.time)
        inf.sync()
        step()
        _wait(lambda: all(ko.ready(p) for p in kube.list(pods(ns))[0]) and len(kube.list(pods(ns))[0]) == 2,
              what="both pods Ready")
        inf.sync()
        be.observe(time.time())
        worker = next(c for c in be.view.state.owner if "/worker" in c)
        be.actuate([Resize(worker, Resources(0.2, 64.0))], time.time())
        assert be.counts["resizes"] == 1 and be.counts["recreates"] == 0
        name = be.view.pod_names[worker]
        _wait(lambda: ((kube.get(pods(ns, name))["status"].get("containerStatuses") or [{}])[0]
                       .get("resources", {}).get("limits", {}).get("cpu") == "200m"), what="the resize applied")
    finally:
        inf.stop()
