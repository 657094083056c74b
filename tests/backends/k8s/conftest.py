"""Tier A: a real kube-apiserver 1.20.2 (+ kube-controller-manager for garbage collection)
and etcd on free loopback ports, one per test session. The binaries are built once per
machine by ``tools/k8s/build.sh`` (cached outside the repository); a machine that cannot
build them skips these tests and says why. There is no kubelet: :class:`Kubelet` plays it
(pod status, forced deletion of terminating pods), and tests publish NodeSlacks as the agent
would."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.cluster import Informers
from reamer.backends.k8s.devcluster import DEFAULT_CACHE, DevCluster, add_node, find_binaries
from reamer.backends.k8s.inference import K8sInference
from reamer.backends.k8s.kube import ApiError, Kube, custom, nodes, pods
from reamer.backends.k8s.training import K8sTraining
from reamer.cli.k8s import crds
from reamer.models.profiles import shipped_profiles
from reamer.policies import make_policy
from reamer.runtime.k8s import controller_step, scheduler_step

PROFILES = shipped_profiles()

REPO = Path(__file__).resolve().parents[3]


def _binaries(say) -> tuple[Path | None, str]:
    bin_dir, why = find_binaries()
    if bin_dir is not None:
        return bin_dir, ""
    if shutil.which("apt-get") is None:
        return None, f"{why} (and no apt-get here to build them)"
    DEFAULT_CACHE.mkdir(parents=True, exist_ok=True)
    log = DEFAULT_CACHE / "build.log"
    say(f"building kube-apiserver 1.20.2 once into {DEFAULT_CACHE} (about 4-7 min; log: {log})")
    t0 = time.monotonic()
    with log.open("w") as out:
        p = subprocess.Popen([str(REPO / "tools" / "k8s" / "build.sh")], stdout=out, stderr=subprocess.STDOUT)
        while p.poll() is None:
            time.sleep(1)
            if int(time.monotonic() - t0) % 30 == 0:
                last = (log.read_text(errors="replace").strip().splitlines() or [""])[-1].strip()
                say(f"  still building ({time.monotonic() - t0:.0f} s): {last[:100]}")
    if p.returncode != 0:
        return None, f"tools/k8s/build.sh failed (exit {p.returncode}): see {log}"
    say(f"built in {time.monotonic() - t0:.0f} s")
    return find_binaries()


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory, pytestconfig) -> DevCluster:
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:  # progress on the terminal, past pytest's capture
        with capman.global_and_fixture_disabled():
            print(line, file=sys.stderr, flush=True)

    bin_dir, why = _binaries(say)
    if bin_dir is None:
        pytest.skip(f"no kube-apiserver: {why}")
    dc = DevCluster(bin_dir, tmp_path_factory.mktemp("apiserver"), extra_users={"alice": ("devs",)}).start()
    kube = Kube.connect(str(dc.kubeconfig()))
    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for crd in crds():
        kube.create(base, crd)
    for crd in crds():
        name = crd["metadata"]["name"]
        deadline = time.monotonic() + 30
        while not any(c.get("type") == "Established" and c.get("status") == "True"
                      for c in (kube.get(f"{base}/{name}").get("status") or {}).get("conditions") or []):
            assert time.monotonic() < deadline, f"{name} not established"
            time.sleep(0.1)
    yield dc
    dc.stop()


@pytest.fixture(scope="session")
def kube(devcluster) -> Kube:
    return Kube.connect(str(devcluster.kubeconfig()))


def clear_bound_pods(kube: Kube) -> None:
    """Remove every pod bound to a node, in every namespace: the components count other
    namespaces' pods on their nodes, and an earlier test's nodes had the same names."""
    for p in kube.list(pods(None))[0]:
        if (p.get("spec") or {}).get("nodeName"):
            kube.delete(pods(ko.meta(p)["namespace"], ko.meta(p)["name"]), grace_s=0)


@pytest.fixture
def ns(kube) -> str:
    """A fresh namespace, and no nodes, NodeSlacks or bound pods left from an earlier test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    clear_bound_pods(kube)
    for n in kube.list(nodes())[0]:
        kube.delete(nodes(ko.meta(n)["name"]))
    for s in kube.list(custom("nodeslacks"))[0]:
        kube.delete(custom("nodeslacks", name=ko.meta(s)["name"]))
    return name


def make_node(kube: Kube, name: str, cpu: float, mem_gi: int = 64, gpus: int = 0, nic_gbps: float = 10.0) -> dict:
    alloc = {"cpu": str(cpu), "memory": f"{mem_gi}Gi", "pods": "110"}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    return add_node(kube, name, alloc, {"reamer.io/nic-gbps": str(nic_gbps)})


class Kubelet:
    """Plays the kubelet of every node: pods Running and Ready, terminating pods gone."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns

    def sync(self, ready: bool = True) -> None:
        for p in self.kube.list(pods(self.ns))[0]:
            m = ko.meta(p)
            if m.get("deletionTimestamp"):
                self.kube.delete(pods(self.ns, m["name"]), grace_s=0)
            elif (p.get("spec") or {}).get("nodeName") and ready and not ko.ready(p):
                self.kube.merge_patch(pods(self.ns, m["name"], "status"), {"status": {
                    "phase": "Running", "podIP": "127.0.0.1", "qosClass": "Burstable",
                    "conditions": [{"type": "Ready", "status": "True"}]}})

    def finish(self, name: str) -> None:
        self.kube.merge_patch(pods(self.ns, name, "status"), {"status": {"phase": "Succeeded"}})


def container_waiting(kube: Kube, ns: str, pod: str, container: str, reason: str, message: str = "",
                      restarts: int = 0, last: dict | None = None, phase: str | None = None) -> None:
    """As the kubelet reports a container that waits (an image pull, a crash loop): ``reason``
    and ``message``, its ``restarts`` and its ``last`` termination."""
    st = {"containerStatuses": [{"name": container, "image": "x", "imageID": "", "ready": False,
                                 "restartCount": restarts, "state": {"waiting": {"reason": reason, "message": message}},
                                 "lastState": {"terminated": last} if last else {}}]}
    kube.merge_patch(pods(ns, pod, "status"), {"status": {**st, **({"phase": phase} if phase else {})}})


def publish_slack(kube: Kube, node: str, *, reported_at: float, window_s: float = 5.0, pods_: list[dict] = (),
                  cores: float = 16.0, training_need: float = 0.0) -> None:
    """A NodeSlack as the agent would publish it."""
    path = custom("nodeslacks", name=node)
    try:
        kube.create(custom("nodeslacks"), {"apiVersion": "reamer.io/v1alpha1", "kind": "NodeSlack",
                                           "metadata": {"name": node}, "spec": {}})
    except ApiError as e:
        if e.status != 409:
            raise
    kube.merge_patch(path + "/status", {"status": {
        "reportedAt": reported_at, "windowSeconds": window_s, "cores": cores, "systemReserved": 0.0,
        "systemUsed": 0.0, "trainingUsed": sum(p.get("cpuUsed", 0.0) for p in pods_), "trainingNeed": training_need,
        "slack": max(0.0, cores - training_need), "pods": list(pods_)}})


class Component:
    """A component's backend and policy, one round at a time as the component runs it
    (its caches re-listed first); ``round()`` returns the Round."""

    def round(self):
        self.inf.sync()
        return self.step()

    def stop(self) -> None:
        self.inf.stop()


class Controller(Component):
    def __init__(self, kube: Kube, ns: str, policy: str = "nearchus", **kw) -> None:
        self.inf = Informers(kube, ns, kinds=("nodes", "pods", "jobs", "slacks")).start()
        self.backend = K8sTraining(kube, self.inf, ns, PROFILES.models, **kw)
        self.policy = make_policy(policy, None, interval_s=5.0)
        self.step = controller_step(self.backend, self.policy, time.time)


class Scheduler(Component):
    def __init__(self, kube: Kube, ns: str, stale_s: float = 30.0) -> None:
        self.inf = Informers(kube, ns).start()
        self.backend = K8sInference(kube, self.inf, ns, PROFILES.models, list(PROFILES.inference), stale_s=stale_s)
        self.policy = make_policy("reamer", {"stale_s": stale_s, "stable_s": 0.0}, kind="harvest", interval_s=5.0,
                                  profiles=PROFILES.inference)
        self.step = scheduler_step(self.backend, self.policy, time.time)


@pytest.fixture
def components(kube, ns):
    """``make("controller" | "scheduler", **kw)``; every component made is stopped after the test."""
    made: list[Component] = []

    def make(kind: str, **kw) -> Component:
        c = (Scheduler if kind == "scheduler" else Controller)(kube, ns, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture
def controller(components):
    return lambda **kw: components("controller", **kw)
