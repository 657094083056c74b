"""What every Reamer component reads of the cluster, and the one rebuild of the shared state.

:class:`Informers` keeps a :class:`~reamer.backends.k8s.kube.Reflector` per kind (Nodes,
Pods, TrainingJobs, InferenceServices, NodeSlacks). :func:`training_state` rebuilds the
shared :class:`~reamer.backends.state.training.ClusterState` from those objects — the
controller and the scheduler call the same function, so neither keeps a copy of the other's
bookkeeping and both start from the cluster after a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.affinity import Eligibility
from reamer.backends.k8s.kube import Kube, Obj, Reflector, custom, nodes, pods
from reamer.backends.state.training import ClusterState
from reamer.domain import Container, Node, Resources, Role, TrainingJob
from reamer.domain.decisions import InvalidDecision

log = logging.getLogger(__name__)


@dataclass
class ClusterObjects:
    """One consistent-enough read of the cluster (each kind as its reflector last saw it)."""

    nodes: list[Obj]
    pods: list[Obj]  # the component's namespace's
    jobs: list[Obj]
    services: list[Obj]
    slacks: dict[str, Obj]  # node name -> NodeSlack
    others: list[Obj] = field(default_factory=list)  # other namespaces' pods on a node (ko.slim_pod)


class Informers:
    """List + watch of every kind a component reads, in ``namespace`` (nodes and NodeSlacks
    are cluster-scoped). Pods are watched in every namespace: other namespaces' pods hold
    their requests on the nodes Reamer places on (kept slim, :func:`ko.slim_pod`)."""

    def __init__(self, kube: Kube, namespace: str, *, resync_s: float = 30.0, watch_s: int = 30,
                 kinds: tuple[str, ...] = ("nodes", "pods", "jobs", "services", "slacks")) -> None:
        self.namespace = namespace
        paths = {"nodes": nodes(), "pods": pods(None), "jobs": custom("trainingjobs", namespace),
                 "services": custom("inferenceservices", namespace), "slacks": custom("nodeslacks")}

        def slim(o: Obj) -> Obj:
            return o if ko.meta(o).get("namespace") == namespace else ko.slim_pod(o)

        self.reflectors = {k: Reflector(kube, paths[k], resync_s=resync_s, watch_s=watch_s,
                                        transform=slim if k == "pods" else None) for k in kinds}

    def start(self, timeout_s: float = 30.0) -> Informers:
        for r in self.reflectors.values():
            r.start()
        for k, r in self.reflectors.items():
            if not r.synced.wait(timeout_s):
                raise TimeoutError(f"listing {k} took more than {timeout_s} s")
        return self

    def sync(self) -> None:
        """Re-list every kind now (tests and the first round after a restart)."""
        for r in self.reflectors.values():
            r.relist()

    def stop(self) -> None:
        for r in self.reflectors.values():
            r.stop()

    def objects(self) -> ClusterObjects:
        """What the caches hold now (a kind not watched is empty)."""
        get = {k: r.items() for k, r in self.reflectors.items()}
        mine, others = [], []
        for p in get.get("pods", []):
            if ko.meta(p).get("namespace") == self.namespace:
                mine.append(p)
            elif (p.get("spec") or {}).get("nodeName") and not ko.terminated(p):
                others.append(p)
        return ClusterObjects(get.get("nodes", []), mine, get.get("jobs", []), get.get("services", []),
                              {ko.meta(s)["name"]: s for s in get.get("slacks", [])}, others)

    def put(self, kind: str, obj: Obj) -> None:
        self.reflectors[kind].put(obj)



@dataclass
class TrainingView:
    """The shared training state as the cluster records it, with what the controller needs
    beside it: each job's resource, its pods' names, its epoch, and the jobs Reamer cannot run."""

    state: ClusterState
    crs: dict[str, Obj] = field(default_factory=dict)  # job -> TrainingJob (runnable ones)
    pod_names: dict[str, str] = field(default_factory=dict)  # container id -> its pod's name
    epochs: dict[str, int] = field(default_factory=dict)
    invalid: dict[str, ko.SpecError] = field(default_factory=dict)  # job -> why it cannot run
    done: set[str] = field(default_factory=set)
    pods: dict[str, dict[str, Obj]] = field(default_factory=dict)  # TrainingJob uid -> its pods by name


def _nodes(objs: ClusterObjects, foreign_jobs: set[str], cordoned_use: dict[str, Resources],
           replica_memory: bool) -> list[Node]:
    """Every Node less what pods Reamer does not run (other namespaces' included, and pods of jobs
    it cannot run) request there, and (``replica_memory``) less the memory its inference replicas
    request; a cordoned node keeps only what its recorded training containers hold, so nothing
    new is placed on it."""
    foreign: dict[str, list[Obj]] = {}
    replica_mem: dict[str, float] = {}
    for p in objs.others:
        foreign.setdefault(p["spec"]["nodeName"], []).append(p)
    for p in objs.pods:
        lb = ko.labels(p)
        node = ko.pod_node(p)
        if not node or ko.terminated(p):
            continue
        if not ko.is_reamer_pod(p) or lb.get(ko.JOB) in foreign_jobs:
            foreign.setdefault(node, []).append(p)
        elif replica_memory and ko.SERVICE in lb:  # its cores move for training (inference moves first), not its memory
            replica_mem[node] = replica_mem.get(node, 0.0) + ko.pod_requests(p).mem_mib
    out = []
    for n in objs.nodes:
        node = ko.node_of(n, foreign.get(ko.meta(n)["name"], ()))
        if node.name in replica_mem:
            node = replace(node, mem_mib=max(0.0, node.mem_mib - replica_mem[node.name]))
        if not ko.schedulable(n):
            use = cordoned_use.get(node.name, Resources())
            node = replace(node, cores=min(node.cores, use.cpu), mem_mib=min(node.mem_mib, use.mem_mib),
                           gpus=min(node.gpus, use.gpu))
        out.append(node)
    return out


def training_state(objs: ClusterObjects, models: Mapping[str, object],
                   on_invalid: Callable[[str, ko.SpecError], None] | None = None,
                   replica_memory: bool = False) -> TrainingView:
    """Rebuild the shared training state from the TrainingJobs' status (the shape the
    controller decided) in arrival order. What runs is booked even where a node is now
    overcommitted; a job is queued again only when a node its shape names is gone, has a
    NoExecute taint a pod there does not tolerate (it would be evicted), or takes no new pod of
    the role whose pod there is gone or Failed (a drain, a kubelet eviction). Each role may be placed
    only on the nodes its pod template allows (:mod:`reamer.backends.k8s.affinity`). A job
    whose spec cannot run keeps its pods, counted as foreign (nothing double-books them), and
    so does a job being deleted (a foreground deletion or a finalizer holds it while the garbage
    collector removes its pods: it is not run, reshaped or given pods again). ``replica_memory``:
    the controller's view, where the memory inference replicas request is taken (their cores
    move for training, their memory does not; the scheduler books its replicas itself)."""
    order = sorted(objs.jobs, key=lambda o: (ko.epoch_s(ko.meta(o).get("creationTimestamp")), ko.meta(o)["name"]))
    specs, invalid, done, going = [], {}, set(), set()
    eligible = Eligibility(objs.nodes)  # the nodes each role's pod template allows
    for tj in order:
        name = ko.meta(tj)["name"]
        if ko.deleting(tj):
            going.add(name)
            continue
        if (tj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            done.add(name)
            continue
        try:
            spec = ko.training_job(tj, models)
            tmpl = {r: (tj["spec"][r.value].get("template"), f"spec.{r.value}.template")
                    for r in (Role.PS, Role.WORKER)}
            spec = replace(spec, ps_nodes=eligible.of(*tmpl[Role.PS]), worker_nodes=eligible.of(*tmpl[Role.WORKER]))
            evicting = {r: eligible.evicting(*t) for r, t in tmpl.items()}
            specs.append((tj, spec, ko.status_containers(name, tj.get("status") or {}), evicting))
        except (ko.SpecError, KeyError, ValueError, TypeError) as e:
            invalid[name] = e if isinstance(e, ko.SpecError) else ko.SpecError("InvalidSpec", str(e))
            if on_invalid:
                on_invalid(name, invalid[name])
    cordoned = {ko.meta(n)["name"] for n in objs.nodes if not ko.schedulable(n)}
    held: dict[str, Resources] = {}
    for _, _, containers, _ in specs:
        for c in containers:
            if c.node in cordoned:
                held[c.node] = held.get(c.node, Resources()) + c.res
    view = TrainingView(ClusterState(_nodes(objs, set(invalid) | going, held, replica_memory)), invalid=invalid,
                        done=done, pods=_pods_by_owner(objs))
    for tj, spec, containers, evicting in specs:
        name, st = spec.id, tj.get("status") or {}
        epoch = int(st.get("epoch", 0))
        if any(c.node not in view.state.free for c in containers):
            log.warning("job %s: a node of its recorded shape is gone: queued again", name)
            containers = []
        elif (c := next((c for c in containers if c.node in evicting[c.role]), None)) is not None:
            log.warning("job %s: node %s has a NoExecute taint its %s pods do not tolerate: queued again", name,
                        c.node, c.role.value)
            containers = []
        elif (c := _evicted(spec, containers, st, epoch, cordoned, view.pods.get(ko.meta(tj).get("uid"), {}))):
            log.warning("job %s: its %s pod on node %s, which takes no new pods of it (cordoned, not ready, a taint or "
                        "labels), is gone or failed: queued again", name, c.role.value, c.node)
            containers = []
        kw = dict(next_id=int(st.get("nextIndex", 0)), queued_since=float(st.get("queuedAt", spec.arrival_s)),
                  queue_s=float(st.get("queueSeconds", 0.0)), started_s=st.get("startedAt"),
                  last_change_s=st.get("lastChangeAt"), reconfigs=int(st.get("reconfigurations", 0)))
        try:
            view.state.restore(spec, containers, force=True, **kw)
        except InvalidDecision as e:  # a recorded shape no backend could run (edited by hand)
            log.warning("job %s: recorded shape is not valid (%s): queued again", name, e)
            containers = []
            view.state.restore(spec, containers, **kw)
        view.crs[name] = tj
        view.epochs[name] = epoch
        for c, rec in zip(containers, st.get("containers") or [], strict=False):
            view.pod_names[c.id] = rec.get("pod") or default_pod_name(c, epoch)
    return view


def _pods_by_owner(objs: ClusterObjects) -> dict[str, dict[str, Obj]]:
    """Training pods by their TrainingJob's uid (a job deleted and created again under the same
    name does not inherit the old one's pods), then by name."""
    out: dict[str, dict[str, Obj]] = {}
    for p in objs.pods:
        if ko.JOB in ko.labels(p) and (uid := ko.owner_uid(p, "TrainingJob")) is not None:
            out.setdefault(uid, {})[ko.meta(p)["name"]] = p
    return out


def _evicted(spec: TrainingJob, containers: list[Container], status: Obj, epoch: int, cordoned: set[str],
             pods: dict[str, Obj]) -> Container | None:
    """The first container whose pod is gone, going or Failed (``kubectl drain`` evicts it, the
    taint manager deletes it, the kubelet evicts it under pressure) on a node that takes no new
    pod of its role (cordoned, not ready, a taint or labels its template does not allow): a pod
    re-created there would undo the drain or be refused, so its job is queued again instead."""
    for c, rec in zip(containers, status.get("containers") or [], strict=False):
        allowed = spec.nodes_for(c.role)
        if c.node in cordoned or (allowed is not None and c.node not in allowed):
            p = pods.get(rec.get("pod") or default_pod_name(c, epoch))
            if p is None or ko.deleting(p) or (p.get("status") or {}).get("phase") == "Failed":
                return c
    return None


def default_pod_name(c: Container, epoch: int) -> str:
    return f"{c.owner}-{ko.short(c.id)}-e{epoch}"
