"""Tier B: the controller backend and the reflector against **kmock**, an in-memory emulator
of the Kubernetes API served over HTTP on a free loopback port.

kmock is an emulator, not an authority on semantics: it ignores label and field selectors,
has no pods/binding, no resourceVersion conflicts (and no resourceVersion of its own), no
PUT, and every PATCH is a plain JSON merge; a watch replays every stored object as ADDED
and then streams live changes, whatever resourceVersion it was asked for. Semantics are the
business of tier A (a real kube-apiserver 1.20, ``test_k8s_controller.py``). kmock is used
here only for what tier A cannot do:

* the **in-place resize success path** (``PATCH pods/{name}/resize`` exists from Kubernetes
  1.33 on; 1.20 answers 404, so tier A only sees the recreate fallback), and
* **injected API faults**: 500s on list, create and resize, a watch cut mid-stream, a watch
  that ends in an ``ERROR`` event (410 Gone).

What :class:`Emulator` adds to kmock for these tests (nothing else): ``uid``,
``creationTimestamp`` and a ``resourceVersion`` on create; PUT of ``…/status`` (the
controller records shapes with it); ``pods/{name}/resize`` as a strategic merge of the
containers' resources by container name, refused (422) where Kubernetes' ``ValidatePodResize``
refuses it — the pod's QoS class would change, or a request would exceed its limit (without
those two rules the success path would pass here and fail on a real 1.33 server); and
:attr:`Emulator.rejections`, faults answered *before* kmock stores anything (a kmock reaction
answers a write only after kmock has applied it, which is the "the write landed but its answer
was lost" case, also tested).

kmock's server runs in its own event loop in a daemon thread; the code under test talks to
it through the official client's transport, as it talks to a real API server.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
import pytest
from kubernetes import client

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.cluster import Informers
from reamer.backends.k8s.kube import Kube, Reflector, custom, key, nodes, pods
from reamer.backends.k8s.training import K8sTraining
from reamer.cli.k8s import crds
from reamer.domain import Resize, Resources
from reamer.models.profiles import shipped_profiles
from reamer.policies import make_policy
from reamer.runtime.k8s import controller_step

MODELS = shipped_profiles().models
NS = "team-a"
PODS = kmock.resource("v1/pods")
NODES = kmock.resource("v1/nodes")


# ----------------------------------------------------------------------------- the emulator


@dataclass
class Rejection:
    """Answer the first ``times`` requests that ``match`` with ``status``, before kmock sees them."""

    match: Callable[[kmock.Request], bool]
    status: int = 500
    times: int = 1
    hits: int = 0


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": code,
            "reason": reason, "message": message}


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator with the few server behaviours these tests lean on (module docstring)."""

    rejections: list[Rejection] = attrs.field(factory=list)
    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        for r in self.rejections:
            if r.hits < r.times and r.match(request):
                r.hits += 1
                return aiohttp.web.json_response(_status(r.status, "InternalError", "injected fault"),
                                                 status=r.status)
        if request.resource is not None and request.action == kmock.action.CREATE and isinstance(request.data, dict):
            m = request.data.setdefault("metadata", {})
            m.setdefault("uid", str(uuid.uuid4()))
            m.setdefault("creationTimestamp", ko.rfc3339(time.time()))
            m["resourceVersion"] = str(next(self._versions))
        if request.resource is not None and request.name is not None:
            if request.method == kmock.method.PUT:
                return await self._replace(request)
            if request.method == kmock.method.PATCH and request.resource == PODS and request.subresource == "resize":
                return await self._resize(request)
        return await super()._handle(request)

    async def _store(self, request: kmock.Request, change: Callable[[dict], None]) -> aiohttp.web.StreamResponse:
        k = (request.resource, request.namespace, request.name)
        async with self._lock:
            if k not in self.objects or self.objects[k].deleted:
                return aiohttp.web.json_response(_status(404, "NotFound", f"{request.name} not found"), status=404)
            new = copy.deepcopy(self.objects[k].raw)
            change(new)
            new["metadata"]["resourceVersion"] = str(next(self._versions))
            self.objects[k].create(new)  # a new version in the object's history
            await self._buses[request.resource].put({"type": "MODIFIED", "object": new})
        return aiohttp.web.json_response(new)

    async def _replace(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """PUT: ``…/status`` replaces the status only (as the API server does), else all but metadata."""
        def change(obj: dict) -> None:
            if request.subresource == "status":
                obj["status"] = request.data.get("status")
            else:
                obj.update({k: v for k, v in request.data.items() if k != "metadata"})
        return await self._store(request, change)

    async def _resize(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """``pods/{name}/resize``: the patch's requests/limits merged into the containers of the
        same name, refused (422) where ``ValidatePodResize`` refuses it: a QoS class change, or a
        request above its limit."""
        k = (request.resource, request.namespace, request.name)
        old = self.objects[k].raw if k in self.objects and not self.objects[k].deleted else None

        def change(pod: dict) -> None:
            by_name = {c["name"]: c for c in pod["spec"]["containers"]}
            for c in request.data["spec"]["containers"]:
                res = by_name[c["name"]].setdefault("resources", {})
                for part in ("requests", "limits"):
                    if part in c.get("resources", {}):
                        res[part] = {**res.get(part, {}), **c["resources"][part]}

        if old is not None:
            new = copy.deepcopy(old)
            change(new)
            if why := resize_refusal(old, new):
                return aiohttp.web.json_response(_status(422, "Invalid", why), status=422)
        return await self._store(request, change)


def _resources(ctr: dict) -> tuple[dict[str, float], dict[str, float]]:
    """A container's (requests, limits) of cpu and memory; a request defaults to its limit."""
    r = ctr.get("resources") or {}
    lim = {k: ko.quantity(v, k) for k, v in (r.get("limits") or {}).items() if k in ("cpu", "memory")}
    req = {**lim, **{k: ko.quantity(v, k) for k, v in (r.get("requests") or {}).items() if k in ("cpu", "memory")}}
    return req, lim


def qos_class(pod: dict) -> str:
    """The pod's QoS class as Kubernetes computes it (cpu and memory of every container)."""
    rl = [_resources(c) for c in pod["spec"]["containers"]]
    if not any(req or lim for req, lim in rl):
        return "BestEffort"
    if all(set(lim) == {"cpu", "memory"} and req == lim for req, lim in rl):
        return "Guaranteed"
    return "Burstable"


def resize_refusal(old: dict, new: dict) -> str | None:
    if qos_class(new) != qos_class(old):
        return f"Pod QOS Class may not change as a result of resizing ({qos_class(old)} -> {qos_class(new)})"
    for c in new["spec"]["containers"]:
        req, lim = _resources(c)
        for r in ("cpu", "memory"):
            if r in lim and req.get(r, 0) > lim[r]:
                return f"spec.containers[{c['name']}].resources.requests.{r}: must be less than or equal to {r} limit"
    return None


class KmockCluster:
    """The emulator on a free loopback port, served from its own event loop in a daemon thread.
    DSL calls (reactions) and request views go through :meth:`call`, in that loop's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kmock", daemon=True)
        self._thread.start()
        self.emu, self.server = self._run(self._start())
        cfg = client.Configuration()
        cfg.host = str(self.server.url).rstrip("/")
        self.kube = Kube(client.ApiClient(cfg), timeout_s=5.0)
        self.closers: list[Callable[[], None]] = []

    def _run(self, coro, timeout_s: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    async def _start(self):
        emu = Emulator()
        for crd in crds():  # the custom resources' names as the shipped CRDs declare them
            spec, names = crd["spec"], crd["spec"]["names"]
            for v in spec["versions"]:
                emu.resources[f"{spec['group']}/{v['name']}/{names['plural']}"] = {
                    "kind": names["kind"], "singular": names["singular"], "namespaced": spec["scope"] == "Namespaced",
                    "shortnames": names.get("shortNames", []), "subresources": list(v.get("subresources") or {})}
        emu.resources["v1/nodes"] = {"kind": "Node", "namespaced": False, "subresources": ["status"]}
        emu.resources["v1/pods"] = {"kind": "Pod", "namespaced": True, "subresources": ["status", "resize"]}
        emu.resources["v1/services"] = {"kind": "Service", "namespaced": True}
        await emu.__aenter__()
        server = kmock.Server(emu)
        await server.__aenter__()
        return emu, server

    def call(self, fn: Callable[[], Any]) -> Any:
        async def run():
            return fn()
        return self._run(run())

    def requests(self, *criteria) -> list[kmock.Request]:
        return self.call(lambda: list(self.emu[criteria]))

    def _live(self, res: kmock.resource) -> list[kmock.Request]:
        """Watch requests whose handler still runs (aiohttp drops a request's task when it ends)."""
        tasks = [(r, r._raw_request.task) for r in self.emu[kmock.action.WATCH, res]]
        return [r for r, t in tasks if t is not None and not t.done()]

    def live_watches(self, res: kmock.resource) -> tuple[int, int]:
        """(watch requests still being served, subscribers of kmock's event bus) for ``res``.
        (1, 1): one watch, and it streams live changes (kmock drops what happens between a
        watch's replay and its subscription)."""
        def count():
            return len(self._live(res)), self.emu._buses[res].consumer_count
        return self.call(count)

    def cut_watches(self, res: kmock.resource) -> int:
        """Abort the connection of every live watch of ``res`` (no final chunk: a cut stream)."""
        def cut():
            live = self._live(res)
            for r in live:
                r._raw_request.transport.abort()
            return len(live)
        return self.call(cut)

    def close(self) -> None:
        for c in reversed(self.closers):
            c()

        async def stop():
            # end the watches still streaming (an ERROR event each) so the server stops at once
            for bus in list(self.emu._buses.values()):
                await bus.put(ConnectionAbortedError("kmock is stopping"))
            await self.server.__aexit__(None, None, None)
            await self.emu.__aexit__(None, None, None)
        try:
            self._run(stop(), 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)


@pytest.fixture
def k8s():
    k = KmockCluster()
    yield k
    k.close()


def wait_until(cond: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


# ----------------------------------------------------------------------------- objects


def node(name: str, cpu: float = 32) -> dict:
    alloc = {"cpu": str(cpu), "memory": "64Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"reamer.io/nic-gbps": "10"}},
            "status": {"capacity": alloc, "allocatable": alloc}}


def training_job(name: str, ps: int = 1, workers: int = 1, cpu: str = "2", sidecar: bool = False) -> dict:
    """``sidecar``: a second container without resources, which makes every pod Burstable
    (without it the controller's pods are Guaranteed: requests == limits)."""
    ctrs = [{"name": "train", "image": "reamer/ps-training"}]
    if sidecar:
        ctrs.append({"name": "logs", "image": "busybox"})

    def role(n: int) -> dict:
        return {"replicas": n, "resources": {"cpu": cpu, "memory": "2Gi"},
                "template": {"spec": {"containers": copy.deepcopy(ctrs)}}}
    return {"apiVersion": "reamer.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"model": "resnet50", "samples": 1e6, "ps": role(ps), "worker": role(workers)}}


class Controller:
    """The controller's backend and a policy, one round at a time (informers re-listed first)."""

    def __init__(self, k: KmockCluster, policy: str = "static") -> None:
        self.inf = Informers(k.kube, NS, kinds=("nodes", "pods", "jobs", "slacks")).start(timeout_s=5.0)
        k.closers.append(self.inf.stop)
        self.backend = K8sTraining(k.kube, self.inf, NS, MODELS)
        self.step = controller_step(self.backend, make_policy(policy, None, interval_s=5.0), time.time)

    def round(self):
        self.inf.sync()
        return self.step()


def job_pods(k: KmockCluster) -> dict[str, dict]:
    return {ko.meta(p)["name"]: p for p in k.kube.list(pods(NS))[0]}


def running_job(k: KmockCluster, sidecar: bool) -> tuple[Controller, str, str]:
    """A started job ``grow`` (1 PS, 1 worker, 2 cores each) with Running pods: the controller,
    the worker's container id and its pod's name."""
    k.kube.create(nodes(), node("node-a"))
    k.kube.create(custom("trainingjobs", NS), training_job("grow", sidecar=sidecar))
    c = Controller(k)
    assert [type(d).__name__ for d in c.round().decisions] == ["StartJob"]
    assert len(job_pods(k)) == 2
    for name in job_pods(k):  # the kubelet's part
        k.kube.merge_patch(pods(NS, name, "status"), {"status": {"phase": "Running"}})
    c.inf.sync()
    c.backend.observe(time.time())
    worker = next(cid for cid in c.backend.view.state.owner if "/worker" in cid)
    return c, worker, c.backend.view.pod_names[worker]


def worker_record(k: KmockCluster) -> dict:
    st = k.kube.get(custom("trainingjobs", NS, "grow"))["status"]
    return next(x for x in st["containers"] if x["role"] == "worker")


# ----------------------------------------------------------------------------- in-place resize


def test_resize_patches_the_pod_in_place(k8s):
    """A Burstable pod (a sidecar without resources): a limit-only grow keeps its QoS class,
    so Kubernetes accepts it (the default, Guaranteed, shape is the test below)."""
    c, worker, pod = running_job(k8s, sidecar=True)
    before = set(job_pods(k8s))
    c.backend.actuate([Resize(worker, Resources(5.0, 2048.0))], time.time())

    sent = k8s.requests("patch", PODS, kmock.subresource("resize"))
    assert [r.url.path for r in sent] == [pods(NS, pod, "resize")]
    assert sent[0].headers["Content-Type"] == "application/strategic-merge-patch+json"
    (ctr,) = sent[0].data["spec"]["containers"]
    assert ctr["name"] == "train" and ko.quantity(ctr["resources"]["limits"]["cpu"], "") == 5.0
    assert ctr["resources"]["limits"]["memory"] == "2048Mi"  # the other limits are kept, not dropped
    counts = c.backend.counts
    assert (counts["resizes"], counts["recreates"], counts["pods_deleted"], counts["api_errors"]) == (1, 0, 0, 0)
    assert not k8s.requests("delete", PODS) and len(k8s.requests("post", PODS)) == 2  # no new pod
    assert set(job_pods(k8s)) == before and ko.pod_cpu_limit(job_pods(k8s)[pod]) == 5.0
    rec = worker_record(k8s)
    assert (rec["cpu"], rec["pod"]) == (5.0, pod)  # same pod: no "-r1" incarnation

    c.round()  # converged: the pod's limit is the recorded one, nothing more to do
    assert len(k8s.requests("patch", PODS, kmock.subresource("resize"))) == 1
    assert (counts["resizes"], counts["recreates"]) == (1, 0) and set(job_pods(k8s)) == before


def test_a_failed_resize_is_retried_not_turned_into_a_restart(k8s):
    c, worker, pod = running_job(k8s, sidecar=True)
    k8s.emu.rejections.append(Rejection(lambda r: r.subresource == "resize", 500))
    c.backend.actuate([Resize(worker, Resources(5.0, 2048.0))], time.time())
    counts = c.backend.counts
    assert (counts["resizes"], counts["recreates"], counts["api_errors"]) == (0, 0, 1)
    assert (worker_record(k8s)["cpu"], worker_record(k8s)["pod"]) == (5.0, pod)  # recorded first
    assert ko.pod_cpu_limit(job_pods(k8s)[pod]) == 2.0

    c.round()  # the fault is gone: the recorded shape is converged in place
    assert (counts["resizes"], counts["recreates"], counts["pods_deleted"]) == (1, 0, 0)
    assert ko.pod_cpu_limit(job_pods(k8s)[pod]) == 5.0 and len(job_pods(k8s)) == 2


@pytest.mark.parametrize("sidecar,cores", [(False, 5.0), (True, 1.0)], ids=["guaranteed-grow", "shrink-below-request"])
def test_resize_keeps_the_pod_valid_for_kubernetes(k8s, sidecar, cores):
    """Kubernetes ≥ 1.33 refuses a resize that changes the QoS class or leaves a request above
    its limit: a Guaranteed pod moves its request with the limit, a shrink lowers the request."""
    c, worker, pod = running_job(k8s, sidecar=sidecar)
    c.backend.actuate([Resize(worker, Resources(cores, 2048.0))], time.time())
    assert (c.backend.counts["resizes"], c.backend.counts["recreates"]) == (1, 0)
    assert worker_record(k8s)["pod"] == pod and ko.pod_cpu_limit(job_pods(k8s)[pod]) == cores


# ----------------------------------------------------------------------------- reflector faults


def store_matches_server(k: KmockCluster, r: Reflector) -> bool:
    return {key(o): o for o in r.items()} == {key(o): o for o in k.kube.list(r.path)[0]}


@pytest.fixture
def reflector(k8s):
    def make(path: str, **kw) -> Reflector:
        r = Reflector(k8s.kube, path, backoff_s=0.05, **kw)
        k8s.closers.append(r.stop)
        return r.start()
    return make


def test_reflector_resumes_a_cut_watch_from_the_last_version_seen(k8s, reflector):
    k8s.kube.create(nodes(), node("n-a"))
    r = reflector(nodes())
    assert r.synced.wait(5) and wait_until(lambda: k8s.live_watches(NODES) == (1, 1))
    rv_b = ko.meta(k8s.kube.create(nodes(), node("n-b")))["resourceVersion"]
    assert wait_until(lambda: r.get("/n-b") is not None)

    assert k8s.cut_watches(NODES) == 1
    assert wait_until(lambda: len(k8s.requests(kmock.action.WATCH, NODES)) == 2
                      and k8s.live_watches(NODES) == (1, 1))
    assert k8s.requests(kmock.action.WATCH, NODES)[-1].params["resourceVersion"] == rv_b
    assert r.relists == 1  # resumed: no re-list for a cut connection

    k8s.kube.create(nodes(), node("n-c"))
    k8s.kube.delete(nodes("n-a"))
    assert wait_until(lambda: store_matches_server(k8s, r)), r.items()
    assert sorted(ko.meta(o)["name"] for o in r.items()) == ["n-b", "n-c"]


def test_reflector_relists_after_a_watch_error_event(k8s, reflector):
    k8s.kube.create(nodes(), node("n-a"))
    gate = threading.Event()
    k8s.closers.append(gate.set)

    async def expired(request):  # the first watch: held open, then 410 Gone in the stream
        await asyncio.to_thread(gate.wait, 5)
        yield {"type": "ERROR", "object": _status(410, "Expired", "too old resource version")}

    k8s.call(lambda: k8s.emu[kmock.action.WATCH, NODES][:1] << expired)
    r = reflector(nodes())
    assert r.synced.wait(5) and wait_until(lambda: len(k8s.requests(kmock.action.WATCH, NODES)) == 1)
    # changes while the reflector hears nothing: a watch replay would never report the deletion
    k8s.kube.delete(nodes("n-a"))
    k8s.kube.create(nodes(), node("n-b"))
    gate.set()
    assert wait_until(lambda: r.relists == 2)
    assert wait_until(lambda: store_matches_server(k8s, r)), r.items()
    assert [ko.meta(o)["name"] for o in r.items()] == ["n-b"]


def test_reflector_retries_a_failing_list_until_it_syncs(k8s, reflector):
    k8s.kube.create(nodes(), node("n-a"))
    failing = threading.Event()
    failing.set()
    k8s.call(lambda: k8s.emu[kmock.action.LIST, NODES, failing] << 500 << _status(500, "InternalError", "etcd down"))
    r = reflector(nodes())
    assert wait_until(lambda: len(k8s.requests(kmock.action.LIST, NODES)) >= 3)
    assert not r.synced.is_set() and r.relists == 0 and not r.items()

    failing.clear()
    assert r.synced.wait(5) and r.relists == 1
    assert store_matches_server(k8s, r)
    assert wait_until(lambda: k8s.live_watches(NODES) == (1, 1))
    k8s.kube.create(nodes(), node("n-b"))  # and it watches on from there
    assert wait_until(lambda: store_matches_server(k8s, r)) and len(r.items()) == 2


# ----------------------------------------------------------------------------- controller faults


@pytest.mark.parametrize("landed", [False, True], ids=["rejected", "answer-lost"])
def test_a_500_on_pod_create_fails_the_job_not_the_round(k8s, landed):
    """``rejected``: nothing was stored (answered before kmock); ``answer-lost``: kmock stored
    the pod and a reaction answered 500 anyway."""
    k8s.kube.create(nodes(), node("node-a"))
    k8s.kube.create(custom("trainingjobs", NS), training_job("cifar", ps=1, workers=1))
    if landed:
        k8s.call(lambda: k8s.emu["post", PODS][:1] << 500 << _status(500, "InternalError", "timeout"))
    else:
        k8s.emu.rejections.append(Rejection(lambda r: r.method == "POST" and r.resource == PODS, 500))
    c = Controller(k8s)
    rnd = c.round()  # returns: the error is the job's, counted, retried next round
    assert [type(d).__name__ for d in rnd.decisions] == ["StartJob"]
    counts = c.backend.counts
    assert (counts["api_errors"], counts["pods_created"]) == (1, 0)
    st = k8s.kube.get(custom("trainingjobs", NS, "cifar"))["status"]
    assert st["phase"] == "Running"
    want = sorted(x["pod"] for x in st["containers"])
    assert len(job_pods(k8s)) == (1 if landed else 0)

    rnd = c.round()
    assert rnd.decisions == () and counts["api_errors"] == 1
    assert sorted(job_pods(k8s)) == want  # every pod, none twice
    assert counts["pods_created"] == (1 if landed else 2)
    assert len(k8s.requests("post", PODS)) == (2 if landed else 3)
