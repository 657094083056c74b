"""What the components read of pods they do not run (``reamer.backends.k8s.objects``): their
requests as kube-scheduler counts them, and the slim copy the pod cache keeps of them. Pure:
the pods are dicts as the API server returns them."""

from __future__ import annotations

import pytest

from reamer.backends.k8s import objects as ko
from reamer.domain import Resources


def _c(cpu=None, mem=None, gpu=None, limits=False):
    r = {k: v for k, v in (("cpu", cpu), ("memory", mem), ("nvidia.com/gpu", gpu)) if v is not None}
    return {"name": "c", "image": "x", "resources": {"limits" if limits else "requests": r}}


@pytest.mark.parametrize(("spec", "want"), [
    ({"containers": [_c("500m", "1Gi"), _c("1", "512Mi", "1")]}, Resources(1.5, 1536, 1)),
    ({"containers": [_c(mem="1Gi", cpu="2", limits=True)]}, Resources(2, 1024, 0)),  # requests default to limits
    # the larger of Σ containers and the largest init container, per resource, plus the overhead
    ({"containers": [_c("1", "1Gi"), _c("1", "1Gi")], "initContainers": [_c("3", "512Mi"), _c("500m", "4Gi")],
      "overhead": {"cpu": "250m", "memory": "128Mi"}}, Resources(3.25, 4096 + 128, 0)),
    # sidecars (restartPolicy Always) run beside the containers, and beside the init containers after them
    ({"containers": [_c("1")], "initContainers": [{**_c("500m"), "restartPolicy": "Always"}, _c("2")]},
     Resources(2.5, 0, 0)),
    ({"containers": [_c("1")], "initContainers": [_c("2"), {**_c("500m"), "restartPolicy": "Always"}]},
     Resources(2.0, 0, 0)),
    ({"containers": [_c("1")], "initContainers": [{**_c("3"), "restartPolicy": "Always"}, _c("2")]},
     Resources(5.0, 0, 0)),
    ({}, Resources()),
], ids=["sum", "limits", "init-overhead", "sidecar-first", "sidecar-after", "big-sidecar", "empty"])
def test_pod_requests_as_kube_scheduler_counts_them(spec, want):
    got = ko.pod_requests({"spec": spec})
    assert (got.cpu, got.mem_mib, got.gpu) == pytest.approx((want.cpu, want.mem_mib, want.gpu))


def test_slim_pod_keeps_what_placement_needs_and_nothing_else():
    pod = {"metadata": {"name": "p", "namespace": "team", "uid": "u1", "resourceVersion": "42",
                        "deletionTimestamp": "2026-01-01T00:00:00Z", "labels": {"a": "b"},
                        "annotations": {"big": "x" * 10_000}, "managedFields": [{"m": 1}] * 50},
           "spec": {"nodeName": "n1", "containers": [{**_c("2", "1Gi"), "env": [{"name": "E", "value": "v"}] * 100}],
                    "initContainers": [_c("4"), {**_c("1"), "restartPolicy": "Always"}], "overhead": {"cpu": "100m"},
                    "volumes": [{"name": "v"}] * 20},
           "status": {"phase": "Running", "conditions": [{"type": "Ready"}] * 5}}
    slim = ko.slim_pod(pod)
    assert ko.pod_requests(slim) == ko.pod_requests(pod)
    assert (slim["spec"]["nodeName"], slim["status"]["phase"], ko.deleting(slim), ko.terminated(slim)) == \
        ("n1", "Running", True, False)
    assert slim["metadata"] == {k: pod["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                                 "deletionTimestamp")}
    assert len(repr(slim)) < len(repr(pod)) / 20
    assert not ko.is_reamer_pod(slim)
