"""What every Reamer component reads of the cluster, and the one rebuild of the shared state.

:class:`Informers` keeps a :class:`~reamer.backends.k8s.kube.Reflector` per kind (Nodes,
Pods, TrainingJobs, InferenceServices, NodeSlacks). :func:`training_state` rebuilds the
shared :class:`~reamer.backends.state.training.ClusterState` from those objects — the
controller and the scheduler call the same function, so neither keeps a copy of the other's
bookkeeping and both start from the cluster after a restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.kube import Kube, Obj, Reflector, custom, nodes, pods
from reamer.backends.state.training import ClusterState
from reamer.domain import Container, Node
from reamer.domain.decisions import InvalidDecision

log = logging.getLogger(__name__)


@dataclass
class ClusterObjects:
    """One consistent-enough read of the cluster (each kind as its reflector last saw it)."""

    nodes: list[Obj]
    pods: list[Obj]
    jobs: list[Obj]
    services: list[Obj]
    slacks: dict[str, Obj]  # node name -> NodeSlack

    def pods_of(self, label: str, value: str) -> list[Obj]:
        return [p for p in self.pods if ko.labels(p).get(label) == value]


class Informers:
    """List + watch of every kind a component reads, in ``namespace`` (nodes and NodeSlacks
    are cluster-scoped). ``changed`` is set on every change (a round may start early)."""

    def __init__(self, kube: Kube, namespace: str, *, resync_s: float = 30.0, watch_s: int = 30,
                 kinds: tuple[str, ...] = ("nodes", "pods", "jobs", "services", "slacks")) -> None:
        self.changed = threading.Event()
        paths = {"nodes": nodes(), "pods": pods(namespace), "jobs": custom("trainingjobs", namespace),
                 "services": custom("inferenceservices", namespace), "slacks": custom("nodeslacks")}
        self.reflectors = {k: Reflector(kube, paths[k], resync_s=resync_s, watch_s=watch_s,
                                        on_change=self.changed.set) for k in kinds}

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
        return ClusterObjects(get.get("nodes", []), get.get("pods", []), get.get("jobs", []), get.get("services", []),
                              {ko.meta(s)["name"]: s for s in get.get("slacks", [])})

    def put(self, kind: str, obj: Obj) -> None:
        self.reflectors[kind].put(obj)

    def forget(self, kind: str, key: str) -> None:
        self.reflectors[kind].forget(key)


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


def cluster_nodes(objs: ClusterObjects) -> list[Node]:
    foreign: dict[str, list[Obj]] = {}
    for p in objs.pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node and not ko.is_reamer_pod(p) and not ko.terminated(p):
            foreign.setdefault(node, []).append(p)
    return [ko.node_of(n, foreign.get(ko.meta(n)["name"], ())) for n in objs.nodes if ko.schedulable(n)]


def training_state(objs: ClusterObjects, models: Mapping[str, object],
                   on_invalid: Callable[[str, ko.SpecError], None] | None = None) -> TrainingView:
    """Rebuild the shared training state from the TrainingJobs' status (the shape the
    controller decided) in arrival order. A job whose recorded shape no longer fits (a node
    went away) is put back in the queue."""
    view = TrainingView(ClusterState(cluster_nodes(objs)))
    for tj in sorted(objs.jobs, key=lambda o: (ko.epoch_s(ko.meta(o).get("creationTimestamp")), ko.meta(o)["name"])):
        name = ko.meta(tj)["name"]
        st = tj.get("status") or {}
        if st.get("phase") == "Succeeded":
            view.done.add(name)
            continue
        try:
            spec = ko.training_job(tj, models)
        except (ko.SpecError, KeyError, ValueError) as e:
            err = e if isinstance(e, ko.SpecError) else ko.SpecError("InvalidSpec", str(e))
            view.invalid[name] = err
            if on_invalid:
                on_invalid(name, err)
            continue
        containers = ko.status_containers(name, st)
        if any(c.node not in view.state.free for c in containers):
            containers = []
        kw = dict(next_id=int(st.get("nextIndex", 0)), queued_since=float(st.get("queuedAt", spec.arrival_s)),
                  queue_s=float(st.get("queueSeconds", 0.0)), started_s=st.get("startedAt"),
                  last_change_s=st.get("lastChangeAt"), reconfigs=int(st.get("reconfigurations", 0)))
        try:
            view.state.restore(spec, containers, **kw)
        except InvalidDecision as e:
            log.warning("job %s: recorded shape does not fit any more (%s): queued again", name, e)
            view.state.restore(spec, [], **kw)
            containers = []
        view.crs[name] = tj
        view.epochs[name] = int(st.get("epoch", 0))
        for c, rec in zip(containers, st.get("containers") or [], strict=False):
            view.pod_names[c.id] = rec.get("pod") or default_pod_name(c, view.epochs[name])
    return view


def default_pod_name(c: Container, epoch: int) -> str:
    return f"{c.owner}-{ko.short(c.id)}-e{epoch}"
