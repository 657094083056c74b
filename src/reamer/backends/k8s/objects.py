"""Kubernetes objects ↔ Reamer's domain: Nodes, TrainingJobs, InferenceServices and the pods
the controller and the scheduler make. Pure functions of plain dicts (no API calls).

Labels (``reamer.io/…``) carry what a component needs to rebuild its state from the cluster:
``job`` / ``role`` / ``container`` / ``epoch`` on training pods, ``service`` / ``replica``
on inference pods; the ``replaces`` annotation marks a make-before-break replacement.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import InvalidOperation
from typing import Any

from kubernetes.utils import parse_quantity

from reamer.domain import Container, Node, Resources, Role, TrainingJob
from reamer.domain.inference import Replica

Obj = dict[str, Any]

P = "reamer.io/"
JOB, ROLE, CONTAINER, EPOCH = P + "job", P + "role", P + "container", P + "epoch"
SERVICE, REPLICA = P + "service", P + "replica"
CORES, MAX_BATCH, MAX_WAIT_MS, REPLACES, TARGET = (P + "cores", P + "max-batch", P + "max-wait-ms", P + "replaces",
                                                   P + "target-node")
TEMPLATE_HASH = P + "template-hash"  # of the pod template a pod was made from (a template edit rolls it)
SCHEDULER = "reamer"
PS_PORT = 7000  # the port of a PS (and worker) in the training pods' host lists

DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # RFC 1035, as a Service name must be

log = logging.getLogger(__name__)


class SpecError(ValueError):
    """A custom resource the API server accepted but Reamer cannot run: ``reason`` is a
    CamelCase condition reason, ``str()`` says which field and what was expected."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def meta(o: Obj) -> Obj:
    return o.get("metadata") or {}


def labels(o: Obj) -> dict[str, str]:
    return meta(o).get("labels") or {}


def annotations(o: Obj) -> dict[str, str]:
    return meta(o).get("annotations") or {}


def epoch_s(ts: str | None) -> float:
    """An RFC 3339 timestamp (``2026-12-01T17:20:39Z``) as Unix seconds; 0 when absent."""
    if not ts:
        return 0.0
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def quantity(v: Any, where: str) -> float:
    try:
        q = float(parse_quantity(v))
    except (ValueError, TypeError, InvalidOperation) as e:
        raise SpecError("InvalidQuantity", f"{where}: expected a Kubernetes quantity, got {v!r}") from e
    if not math.isfinite(q) or q < 0:
        raise SpecError("InvalidQuantity", f"{where}: expected a quantity ≥ 0, got {v!r}")
    return q


def cpu_str(cores: float) -> str:
    return f"{round(cores * 1000)}m"


def mem_str(mib: float) -> str:
    return f"{round(mib)}Mi"


# ----------------------------------------------------------------------------- nodes


def is_reamer_pod(pod: Obj) -> bool:
    lb = labels(pod)
    return JOB in lb or SERVICE in lb


def terminated(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _container_requests(c: Obj) -> Resources:
    r = (c.get("resources") or {})
    req = {**(r.get("limits") or {}), **(r.get("requests") or {})}  # requests default to limits
    return Resources(quantity(req.get("cpu", 0), "pod cpu request"),
                     quantity(req.get("memory", 0), "pod memory request") / 2**20,
                     quantity(req.get("nvidia.com/gpu", 0), "pod gpu request"))


def pod_requests(pod: Obj) -> Resources:
    """What a pod holds on its node, as kube-scheduler counts it: its containers' requests plus
    its sidecars' (init containers with ``restartPolicy: Always``), or, where larger (per
    resource), what an init container needs beside the sidecars started before it; plus its
    ``overhead``."""
    spec = pod.get("spec") or {}

    def most(a: Resources, b: Resources) -> Resources:
        return Resources(max(a.cpu, b.cpu), max(a.mem_mib, b.mem_mib), max(a.gpu, b.gpu))

    total = sum((_container_requests(c) for c in spec.get("containers") or []), Resources())
    sidecars = init = Resources()
    for c in spec.get("initContainers") or []:
        r = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            total, sidecars = total + r, sidecars + r
            init = most(init, sidecars)
        else:
            init = most(init, r + sidecars)
    over = spec.get("overhead") or {}
    return most(total, init) + Resources(quantity(over.get("cpu", 0), "pod cpu overhead"),
                                         quantity(over.get("memory", 0), "pod memory overhead") / 2**20, 0.0)


def slim_pod(pod: Obj) -> Obj:
    """What Reamer keeps of a pod it does not run: where it is, what it requests there
    (:func:`pod_requests`) and whether it still holds it — a cache of every namespace's pods
    stays small."""
    m, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")

    def res(cs):
        return [{"resources": c.get("resources") or {}, **({"restartPolicy": c["restartPolicy"]}
                                                           if "restartPolicy" in c else {})} for c in cs or []]

    return {"metadata": {k: m[k] for k in keep if k in m},
            "spec": {"nodeName": spec.get("nodeName"), "containers": res(spec.get("containers")),
                     "initContainers": res(spec.get("initContainers")), "overhead": spec.get("overhead") or {}},
            "status": {"phase": (pod.get("status") or {}).get("phase")}}


def node_of(obj: Obj, foreign_pods: Iterable[Obj] = ()) -> Node:
    """A Node as Reamer sees it: allocatable CPU, memory and GPUs less what pods Reamer does not
    manage request there; NIC, GPU model and pool from ``reamer.io/`` labels."""
    st = obj.get("status") or {}
    alloc = st.get("allocatable") or st.get("capacity") or {}
    lb = labels(obj)
    name = meta(obj)["name"]
    cap = Resources(quantity(alloc.get("cpu", 0), f"node {name} cpu"),
                    quantity(alloc.get("memory", 0), f"node {name} memory") / 2**20,
                    quantity(alloc.get("nvidia.com/gpu", 0), f"node {name} gpu"))
    for p in foreign_pods:
        cap = cap - pod_requests(p)
    return Node(name, max(0.0, cap.cpu), max(0.0, cap.mem_mib), max(0.0, cap.gpu), lb.get(P + "gpu-model", ""),
                _nic_gbps(lb.get(P + "nic-gbps"), name), lb.get(P + "pool", "default"))


def _nic_gbps(label: str | None, node: str) -> float:
    """The ``reamer.io/nic-gbps`` label (default 10): a value that is not a positive number is
    logged and ignored, so one node's label cannot stop every round."""
    if label is None:
        return 10.0
    try:
        v = float(label)
    except ValueError:
        v = -1.0
    if not (v > 0 and math.isfinite(v)):
        log.warning("node %s: label %snic-gbps=%r is not a positive number of Gbit/s; 10 is used", node, P, label)
        return 10.0
    return v


def schedulable(obj: Obj) -> bool:
    """Takes new pods: not cordoned, and not reported NotReady or unreachable by its kubelet
    (``Ready`` False or Unknown; a node without that condition counts as ready). Pods already
    there stay booked, as on a cordoned node."""
    if (obj.get("spec") or {}).get("unschedulable", False):
        return False
    ready = next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    return ready is None or ready.get("status") == "True"


# ----------------------------------------------------------------------------- training jobs


def _role_res(spec: Obj, role: str) -> Resources:
    r = (spec[role].get("resources") or {})
    gpu = float(r.get("nvidia.com/gpu", 0))
    if gpu != int(gpu):  # an extended resource is counted in whole units: a pod asking 0.5 would get 1
        raise SpecError("InvalidResources", f"spec.{role}.resources.nvidia.com/gpu: expected a whole number of GPUs, "
                                            f"got {gpu:g}")
    return Resources(quantity(r["cpu"], f"spec.{role}.resources.cpu"),
                     quantity(r.get("memory", "1Gi"), f"spec.{role}.resources.memory") / 2**20, gpu)


def training_job(obj: Obj, models: Mapping[str, object]) -> TrainingJob:
    """The domain job of a TrainingJob resource; :class:`SpecError` when it cannot run."""
    spec = obj.get("spec") or {}
    name = meta(obj)["name"]
    if not DNS_LABEL.fullmatch(name):  # it names the job's headless Service and its pods' subdomain
        raise SpecError("InvalidName", f"metadata.name: expected a DNS label (lower-case letters, digits and '-', "
                                       f"starting with a letter, at most 63 characters), got {name!r}")
    model = spec.get("model", "")
    if model not in models:
        raise SpecError("UnknownModel", f"spec.model: expected one of {', '.join(sorted(models))}, got {model!r}")
    counts = {}
    for role, max_default in (("ps", 8), ("worker", 16)):
        rs = spec[role]
        lo, hi, n = int(rs.get("min", 1)), int(rs.get("max", max(max_default, rs["replicas"]))), int(rs["replicas"])
        if lo > hi:
            raise SpecError("MinAboveMax", f"spec.{role}: min ({lo}) must not exceed max ({hi})")
        if not lo <= n <= hi:
            raise SpecError("ReplicasOutOfRange", f"spec.{role}.replicas: expected {lo}..{hi}, got {n}")
        counts[role] = (n, hi)
    ps_res, worker_res = _role_res(spec, "ps"), _role_res(spec, "worker")
    for role, r in (("ps", ps_res), ("worker", worker_res)):
        if r.cpu <= 0:
            raise SpecError("InvalidQuantity", f"spec.{role}.resources.cpu: expected > 0, got {r.cpu}")
    max_cores = float(spec.get("maxCoresPerContainer", 16))
    if max(ps_res.cpu, worker_res.cpu) > max_cores:
        raise SpecError("RequestAboveMax", f"spec.maxCoresPerContainer ({max_cores}) is below a requested cpu")
    return TrainingJob(meta(obj)["name"], model, epoch_s(meta(obj).get("creationTimestamp")),
                       float(spec["samples"]), counts["ps"][0], counts["worker"][0], ps_res, worker_res,
                       batch=int(spec.get("batch", 32)), max_ps=counts["ps"][1], max_workers=counts["worker"][1],
                       max_cores_per_container=max_cores)


def status_containers(job: str, status: Obj) -> list[Container]:
    """The shape a TrainingJob's status records (what the controller decided)."""
    out = []
    for c in status.get("containers") or []:
        out.append(Container(f"{job}/{c['name']}", job, Role(c["role"]), c["node"],
                             Resources(float(c["cpu"]), float(c.get("memoryMiB", 0)), float(c.get("gpu", 0)))))
    return out


def container_status(c: Container) -> Obj:
    return {"name": c.id.split("/", 1)[1], "role": c.role.value, "node": c.node, "cpu": c.res.cpu,
            "memoryMiB": c.res.mem_mib, "gpu": c.res.gpu}


def short(cid: str) -> str:
    """``job/ps0`` → ``ps0``."""
    return cid.split("/", 1)[1]


def template_hash(template: Obj | None) -> str:
    """A short digest of a pod template (its JSON with sorted keys): equal templates, equal hashes."""
    return hashlib.sha256(json.dumps(template or {}, sort_keys=True).encode()).hexdigest()[:12]


def training_pod(tj: Obj, spec: TrainingJob, c: Container, containers: list[Container], epoch: int,
                 name: str) -> Obj:
    """The pod of container ``c`` from its role's template: requests are the user's request,
    the CPU limit is the allocation, bound to its node (the controller places gangs itself)."""
    m = meta(tj)
    role = "ps" if c.role is Role.PS else "worker"
    tmpl = copy.deepcopy(tj["spec"][role].get("template") or {})
    pm = tmpl.get("metadata") or {}
    ps = tmpl.get("spec") or {}
    ctrs = ps.get("containers") or [{"name": "train", "image": "reamer/ps-training:latest"}]
    requested = spec.ps_res if c.role is Role.PS else spec.worker_res
    main = ctrs[0]
    res = main.setdefault("resources", {})
    res["requests"] = {**(res.get("requests") or {}), "cpu": cpu_str(min(requested.cpu, c.res.cpu)),
                       "memory": mem_str(requested.mem_mib)}
    res["limits"] = {**(res.get("limits") or {}), "cpu": cpu_str(c.res.cpu), "memory": mem_str(c.res.mem_mib)}
    if c.res.gpu > 0:
        res["limits"]["nvidia.com/gpu"] = res["requests"]["nvidia.com/gpu"] = str(math.ceil(c.res.gpu))
    hosts = {r: ",".join(f"{short(x.id)}.{spec.id}:{PS_PORT}" for x in containers if x.role is r)
             for r in (Role.PS, Role.WORKER)}
    index = [x.id for x in containers if x.role is c.role].index(c.id)
    env = [{"name": k, "value": str(v)} for k, v in (
        ("REAMER_JOB", spec.id), ("REAMER_ROLE", c.role.value), ("REAMER_INDEX", index),
        ("REAMER_PS_HOSTS", hosts[Role.PS]), ("REAMER_WORKER_HOSTS", hosts[Role.WORKER]),
        ("REAMER_CPU", c.res.cpu), ("REAMER_EPOCH", epoch), ("REAMER_MODEL", spec.model),
        ("REAMER_BATCH", spec.batch), ("REAMER_SAMPLES", spec.samples))]
    main["env"] = [e for e in main.get("env") or [] if not e.get("name", "").startswith("REAMER_")] + env
    ps["containers"] = ctrs
    ps.update(nodeName=c.node, hostname=short(c.id), subdomain=spec.id)
    ps.setdefault("restartPolicy", "OnFailure")
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": m["namespace"],
            "labels": {**(pm.get("labels") or {}), JOB: spec.id, ROLE: c.role.value, CONTAINER: short(c.id),
                       EPOCH: str(epoch)},
            "annotations": {**(pm.get("annotations") or {}),
                            TEMPLATE_HASH: template_hash(tj["spec"][role].get("template"))},
            "ownerReferences": [owner_ref(tj)],
        },
        "spec": ps,
    }


def headless_service(tj: Obj) -> Obj:
    """The job's headless Service: pods resolve as ``ps0.JOB`` (hostname.subdomain)."""
    m = meta(tj)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": m["name"], "namespace": m["namespace"], "labels": {JOB: m["name"]},
                         "ownerReferences": [owner_ref(tj)]},
            "spec": {"clusterIP": "None", "selector": {JOB: m["name"]},
                     "ports": [{"name": "reamer", "port": PS_PORT}], "publishNotReadyAddresses": True}}


def owner_ref(o: Obj) -> Obj:
    m = meta(o)
    return {"apiVersion": o["apiVersion"], "kind": o["kind"], "name": m["name"], "uid": m["uid"],
            "controller": True, "blockOwnerDeletion": True}


def pod_cpu_limit(pod: Obj) -> float:
    ctrs = (pod.get("spec") or {}).get("containers") or [{}]
    lim = ((ctrs[0].get("resources") or {}).get("limits") or {}).get("cpu", 0)
    return quantity(lim, "pod cpu limit")


def ready(pod: Obj) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


# waiting reasons of a container that will not start without someone's help (the kubelet's)
STUCK = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
                   "CreateContainerError", "RunContainerError", "CrashLoopBackOff"})


# of those, the ones the kubelet has already retried (a first failed pull or create may clear by itself)
LASTING = frozenset({"ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CrashLoopBackOff"})


def stuck(pod: Obj, lasting: bool = False) -> tuple[str, str] | None:
    """(reason, message) of the first container of ``pod`` (init containers first) waiting for a
    reason in :data:`STUCK` (``lasting``: in :data:`LASTING`); None when none is."""
    st = pod.get("status") or {}
    reasons = LASTING if lasting else STUCK
    for cs in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        w = (cs.get("state") or {}).get("waiting") or {}
        if w.get("reason") in reasons:
            why = w.get("message") or w["reason"]
            return w["reason"], f"pod {meta(pod).get('name')} container {cs.get('name')}: {why}"
    return None


# reasons of a Failed pod that the platform, not the job, caused: kubelet admission (OutOf<resource>,
# NodeAffinity, ...), eviction, preemption, node shutdown; Kubernetes >= 1.26 also marks them with
# condition DisruptionTarget
PLATFORM_FAILURES = frozenset({"Evicted", "Preempting", "NodeAffinity", "NodeName", "UnexpectedAdmissionError",
                               "Shutdown", "Terminated", "NodeLost"})


def platform_failure(pod: Obj) -> bool:
    """The pod failed for the platform's reasons (:data:`PLATFORM_FAILURES`), not its own."""
    st = pod.get("status") or {}
    reason = st.get("reason") or ""
    return reason.startswith("OutOf") or reason in PLATFORM_FAILURES or any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in st.get("conditions") or [])


def owner_uid(pod: Obj, kind: str) -> str | None:
    """The uid of the ``kind`` object (TrainingJob, InferenceService) that owns ``pod`` (None: none
    does): one deleted and created again under the same name does not inherit the old one's pods."""
    return next((r.get("uid") for r in meta(pod).get("ownerReferences") or [] if r.get("kind") == kind), None)


def pod_node(pod: Obj) -> str:
    """The node a pod is on, or ("") will be: a replica pod created but not yet bound names it in
    its target annotation."""
    return (pod.get("spec") or {}).get("nodeName") or annotations(pod).get(TARGET, "")


def deleting(pod: Obj) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


# ----------------------------------------------------------------------------- inference


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    model: str
    slo_p99_s: float
    mem_mib: float
    min_replicas: int
    max_replicas: int
    rate_per_s: float


def inference_service(obj: Obj, models: Iterable[str]) -> ServiceSpec:
    spec = obj.get("spec") or {}
    names = set(models)
    if spec.get("model") not in names:
        raise SpecError("UnknownModel", f"spec.model: expected one of {', '.join(sorted(names))}, "
                                        f"got {spec.get('model')!r}")
    lo, hi = int(spec.get("minReplicas", 1)), int(spec.get("maxReplicas", 8))
    if lo > hi:
        raise SpecError("MinAboveMax", f"spec.minReplicas ({lo}) must not exceed spec.maxReplicas ({hi})")
    return ServiceSpec(meta(obj)["name"], spec["model"], float(spec["sloP99Ms"]) / 1e3,
                       float(spec.get("memoryMiB", 2048)), lo, hi, float(spec.get("ratePerSecond", 0.0)))


def replica_index(pod: Obj) -> int:
    return int(labels(pod)[REPLICA].lstrip("r"))


def replica_of(pod: Obj) -> Replica:
    a, lb = annotations(pod), labels(pod)
    node = pod_node(pod)
    return Replica(f"{lb[SERVICE]}/{lb[REPLICA]}", node, float(a[CORES]), int(a.get(MAX_BATCH, 1)),
                   float(a.get(MAX_WAIT_MS, 0)) / 1e3)


def inference_pod(isvc: Obj, r: Replica, replaces: str | None = None) -> Obj:
    """A replica's pod from the service's template, for the reamer scheduler to bind on
    ``r.node`` (the target annotation)."""
    m = meta(isvc)
    svc, rep = r.id.split("/", 1)
    tmpl = copy.deepcopy(isvc["spec"].get("template") or {})
    pm, ps = tmpl.get("metadata") or {}, tmpl.get("spec") or {}
    ctrs = ps.get("containers") or [{"name": "serve", "image": "reamer/inference:latest"}]
    main = ctrs[0]
    mem = float(isvc["spec"].get("memoryMiB", 2048))
    main["resources"] = {"requests": {"cpu": cpu_str(r.cores), "memory": mem_str(mem)},
                         "limits": {"cpu": cpu_str(r.cores), "memory": mem_str(mem)}}
    env = [{"name": "REAMER_MODEL", "value": isvc["spec"]["model"]}, {"name": "REAMER_CPU", "value": str(r.cores)},
           {"name": "REAMER_MAX_BATCH", "value": str(r.max_batch)},
           {"name": "REAMER_MAX_WAIT_MS", "value": str(r.max_wait_s * 1e3)}]
    main["env"] = [e for e in main.get("env") or [] if not e.get("name", "").startswith("REAMER_")] + env
    ps["containers"] = ctrs
    ps["schedulerName"] = SCHEDULER
    ps.pop("nodeName", None)
    ann = {**(pm.get("annotations") or {}), CORES: str(r.cores), MAX_BATCH: str(r.max_batch),
           MAX_WAIT_MS: str(r.max_wait_s * 1e3), TARGET: r.node,
           TEMPLATE_HASH: template_hash(isvc["spec"].get("template"))}
    if replaces:
        ann[REPLACES] = replaces
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{svc}-{rep}", "namespace": m["namespace"],
                         "labels": {**(pm.get("labels") or {}), SERVICE: svc, REPLICA: rep},
                         "annotations": ann, "ownerReferences": [owner_ref(isvc)]},
            "spec": ps}


# ----------------------------------------------------------------------------- conditions


def set_condition(conds: list[Obj] | None, type_: str, status: bool, reason: str, message: str, now: float) -> list[Obj]:
    """``conds`` with ``type_`` set; its transition time changes only when its status does.
    (An empty message would be stored as null by a 1.20 API server: the reason stands in.)"""
    out, s = [], "True" if status else "False"
    message = message or reason
    found = False
    for c in conds or []:
        if c.get("type") == type_:
            found = True
            t = c.get("lastTransitionTime") if c.get("status") == s else rfc3339(now)
            c = {"type": type_, "status": s, "reason": reason, "message": message[:1000], "lastTransitionTime": t}
        out.append(c)
    if not found:
        out.append({"type": type_, "status": s, "reason": reason, "message": message[:1000],
                    "lastTransitionTime": rfc3339(now)})
    return out
