"""The scheduler's backend: InferenceServices harvested by Cloud Reamer (or any harvesting
policy) on a cluster; pods with ``schedulerName: reamer``.

:meth:`K8sInference.observe` rebuilds the training state with the controller's own
function (:func:`~reamer.backends.k8s.cluster.training_state`: the shapes the TrainingJobs
record, growth the controller decided but has not applied yet included — what inference
must leave room for) and the replica state from the pods; each node's usage is its agent's
last NodeSlack (none, or older than the policy's ``stale_s``: no slack).
:meth:`K8sInference.actuate` books the policy's decisions and carries them out:

* place: create the replica's pod (named from the service's never-reused index, target node
  in an annotation) and bind it (``pods/binding``) — only to a node whose agent is fresh;
* resize: ``PATCH pods/{name}/resize``; without it (404) a make-before-break replacement;
* migrate (make-before-break): the new pod carries ``reamer.io/replaces: OLD``; OLD is
  deleted only once the new pod is Ready;
* evict: the Eviction API, so PodDisruptionBudgets hold (429: kept, tried next round).

At most ``max_moves_per_round`` migrations and evictions are carried out per round; the
policy decides the rest again next round (a rate limit on disruption; the policy's own
cooldown and hysteresis keep it from flapping).

Run alone (``reamer k8s scheduler``), it sees training's growth in the TrainingJobs' status;
beside the controller in one process (``reamer k8s controller --harvest reamer``) it is the
:class:`~reamer.control.JointHarvestBackend` of :func:`reamer.control.joint_round` and sees
the round's training decisions before they are recorded (:meth:`expect`).

A restarted scheduler finds half-done work in the pods (unbound targets, ``replaces``
annotations) and finishes it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.affinity import Eligibility
from reamer.backends.k8s.cluster import (
    ClusterObjects,
    Informers,
    training_state,
)
from reamer.backends.k8s.kube import ApiError, Kube, custom, pods
from reamer.backends.k8s.telemetry import pod_reports, service_window
from reamer.backends.k8s.training import Fault, no_fault
from reamer.backends.state.inference import (
    MoveReplica,
    ReplicaState,
    ServiceRecord,
    SetReplicaQuota,
    StartReplica,
    StopReplica,
)
from reamer.domain.decisions import InvalidDecision
from reamer.domain.inference import (
    EvictReplica,
    HarvestDecision,
    HarvestSnapshot,
    MigrateReplica,
    Replica,
)

log = logging.getLogger(__name__)


class K8sInference:
    """The :class:`~reamer.control.HarvestBackend` of ``reamer k8s scheduler`` in ``namespace``.
    ``stale_s``: a NodeSlack older than this is no evidence of slack (bind refuses the node)."""

    def __init__(self, kube: Kube, informers: Informers, namespace: str, training_models: Mapping[str, object],
                 inference_models: Sequence[str], *, stale_s: float = 30.0, clock: Callable[[], float] = time.time,
                 fault: Fault = no_fault, pool: str = "inference", max_moves_per_round: int = 5) -> None:
        self.kube, self.informers, self.ns = kube, informers, namespace
        self.training_models, self.inference_models = training_models, tuple(inference_models)
        self.stale_s, self.clock, self.fault, self.pool = stale_s, clock, fault, pool
        self.max_moves = max_moves_per_round  # migrations + evictions carried out per round (the rest wait a round)
        self.state: ReplicaState | None = None
        self.objs: ClusterObjects | None = None
        self.crs: dict[str, dict] = {}
        self.pod_of: dict[str, str] = {}  # replica id -> pod name
        self._status: dict[str, dict] = {}  # service -> status patch to write this round
        self._expect: tuple = ()  # the joint round: training decisions about to be applied
        self._paused: dict[str, str] = {}  # service -> the template hash its rollout paused at (soft state)
        self._mine: dict[str, list[dict]] = {}  # this round: service -> its live replica pods
        self.counts = {"binds": 0, "bind_refused_stale": 0, "evictions": 0, "evictions_refused": 0, "migrations": 0,
                       "resizes": 0, "invalid_decisions": 0, "api_errors": 0, "moves_deferred": 0,
                       "replicas_failed": 0, "rollouts": 0, "moves_given_up": 0}

    # ------------------------------------------------------------------ observe
    def observe(self, now: float) -> HarvestSnapshot:
        objs = self.objs = self.informers.objects()
        tview = training_state(objs, self.training_models)
        nodes = tview.state.nodes  # the same nodes training sees (a cordoned one holds no slack)
        reports = pod_reports(objs)
        alive = [p for p in objs.pods if ko.SERVICE in ko.labels(p) and not ko.deleting(p) and not ko.terminated(p)]
        # a successor that cannot start (an image that does not pull) while its predecessor still serves:
        # the move is given up (converge), the predecessor keeps its place
        names = {ko.meta(p)["name"] for p in alive}
        given_up = {ko.meta(p)["name"] for p in alive
                    if ko.annotations(p).get(ko.REPLACES) in names and ko.stuck(p, lasting=True)}
        replaced = {ko.annotations(p)[ko.REPLACES] for p in alive
                    if ko.REPLACES in ko.annotations(p) and ko.meta(p)["name"] not in given_up}
        records, first, self.crs, self.pod_of, self._status, self._mine = [], {}, {}, {}, {}, {}
        eligible = Eligibility(objs.nodes)  # the nodes each service's pod template allows
        for isvc in objs.services:
            name = ko.meta(isvc)["name"]
            st = isvc.get("status") or {}
            try:
                spec = ko.inference_service(isvc, self.inference_models)
                allowed = eligible.of(isvc["spec"].get("template"), "spec.template")
            except (ko.SpecError, KeyError, ValueError) as e:
                self._invalid(isvc, e if isinstance(e, ko.SpecError) else ko.SpecError("InvalidSpec", str(e)), now)
                continue
            try:
                rec = self._record(isvc, spec, st, alive, replaced | given_up, objs, reports, now)
                rec.nodes = allowed
            except (KeyError, ValueError, TypeError) as e:  # a replica pod someone edited: skip the service
                self.counts["api_errors"] += 1
                log.warning("InferenceService %s: its replica pods cannot be read (%s): left alone", name, e)
                continue
            records.append(rec)
            first[name] = spec.rate_per_s
            self.crs[name] = isvc
        self.state = ReplicaState(tview.state, records, nodes, self.pool)
        if self._expect:
            self.state.expect(self._expect)
            self._expect = ()
        usage = {}
        for n in nodes:
            st = (objs.slacks.get(n.name) or {}).get("status") or {}
            at = float(st["reportedAt"]) if "reportedAt" in st else -math.inf
            reserve = max(float(st.get("systemReserved", 0.0)), float(st.get("systemUsed", 0.0)))
            usage[n.name] = self.state.node_usage(n, at, reserve=reserve, need=None,
                                                  used=float(st.get("trainingUsed", 0.0)))
        return self.state.snapshot(now, usage, first)

    def _record(self, isvc: dict, spec: ko.ServiceSpec, st: dict, alive: list[dict], skip: set[str],
                objs: ClusterObjects, reports, now: float) -> ServiceRecord:
        """One service as its status and its replica pods record it (but the pods in ``skip``)."""
        name, uid = spec.name, ko.meta(isvc).get("uid")
        mine = self._mine[name] = [p for p in alive if ko.labels(p)[ko.SERVICE] == name
                                   and ko.owner_uid(p, "InferenceService") == uid]
        rec = ServiceRecord(name, spec.model, spec.slo_p99_s, spec.mem_mib,
                            min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                            observed_rates=[float(x) for x in st.get("rates") or []],
                            last_p99_s=(float(st["p99Ms"]) / 1e3 if st.get("p99Ms") is not None else None))
        idx = [ko.replica_index(p) for p in objs.pods if ko.labels(p).get(ko.SERVICE) == name]
        rec.next_id = max([int(st.get("nextIndex", 0)), *(i + 1 for i in idx)])
        pod_of = {}
        for p in mine:
            if ko.meta(p)["name"] in skip:
                continue  # being replaced (its successor holds the booking), or a successor given up
            r = ko.replica_of(p)
            if r.node:
                rec.replicas[r.id] = r
                pod_of[r.id] = ko.meta(p)["name"]
        self.pod_of.update(pod_of)
        self._observe_window(rec, st, mine, reports, now)
        self._readiness(name, st, mine, now)
        return rec

    def _readiness(self, name: str, st: dict, mine: list[dict], now: float) -> None:
        """Condition ``ReplicasReady``: False with the kubelet's reason and message while a
        replica cannot start (:data:`ko.STUCK`: an image that does not pull, a crash loop),
        False ``Starting`` while one is not Ready yet, True when all are (written when its status
        or reason changes)."""
        problem = next((x for p in mine if (x := ko.stuck(p)) is not None), None)
        ready = all(ko.ready(p) for p in mine)
        reason, msg = problem or (("AllReady", f"{len(mine)} replicas ready") if ready else
                                  ("Starting", "not every replica is ready yet"))
        conds = st.get("conditions")
        want = ko.set_condition(conds, "ReplicasReady", problem is None and ready, reason, msg, now)
        if [(c["type"], c["status"], c.get("reason")) for c in want] != \
                [(c.get("type"), c.get("status"), c.get("reason")) for c in conds or []]:
            self._status.setdefault(name, {})["conditions"] = want
            if problem is not None:  # said when the condition changes, not every round
                log.warning("InferenceService %s: %s (%s)", name, msg, reason)

    def _observe_window(self, rec: ServiceRecord, st: dict, mine: list[dict], reports, now: float) -> None:
        w = service_window([ko.meta(p)["name"] for p in mine], self.ns, reports,
                           {ko.meta(p)["name"] for p in mine if ko.ready(p)})
        if w is None or w.at <= float(st.get("lastWindowAt", -math.inf)):
            return
        rec.observed_rates = (rec.observed_rates + [w.rate_per_s])[-2:]
        rec.last_p99_s = w.p99_s
        windows, met = int(st.get("windows", 0)), int(st.get("windowsMet", 0))
        if w.rate_per_s > 0:  # a window with traffic counts, served or not
            windows += 1
            met += int(w.p99_s is not None and w.p99_s <= rec.slo_p99_s)
        self._status[rec.id] = {"rates": rec.observed_rates, "ratePerSecond": w.rate_per_s, "lastWindowAt": w.at,
                                "p99Ms": None if w.p99_s is None else round(w.p99_s * 1e3, 3), "windows": windows,
                                "windowsMet": met, "sloAttainment": round(met / windows, 4) if windows else None}

    def _invalid(self, isvc: dict, err: ko.SpecError, now: float) -> None:
        st = isvc.get("status") or {}
        if any(c.get("type") == "Invalid" and c.get("message") == str(err) for c in st.get("conditions") or []):
            return
        log.warning("InferenceService %s cannot run: %s", ko.meta(isvc)["name"], err)
        self._patch_status(ko.meta(isvc)["name"], {"conditions": ko.set_condition(
            st.get("conditions"), "Invalid", True, err.reason, str(err), now)})

    def expect(self, decisions: Sequence) -> None:
        """The joint round in one process (:func:`reamer.control.joint_round`): training is
        about to apply ``decisions``; the next :meth:`observe` counts what they take."""
        self._expect = tuple(decisions)

    # ------------------------------------------------------------------ actuate
    def actuate(self, decisions: Sequence[HarvestDecision], now: float) -> None:
        assert self.state is not None, "observe before actuate"
        moves, touched = 0, set()
        for d in decisions:
            if isinstance(d, MigrateReplica | EvictReplica):
                if moves >= self.max_moves:
                    self.counts["moves_deferred"] += 1
                    log.info("%s deferred: %d moves this round already (rate limit)", d, moves)
                    continue
                moves += 1
            try:
                e = self.state.apply(d)
            except InvalidDecision as err:
                self.counts["invalid_decisions"] += 1
                log.warning("decision %s rejected: %s", d, err)
                continue
            touched.add(e.service)
            try:
                self._carry(e, now)
            except ApiError as err:
                self.counts["api_errors"] += 1
                log.warning("%s: %s (the next round sees what happened)", d, err)
        for sid in self.state.services:
            if sid not in touched:
                try:
                    self._roll(sid)
                except (ApiError, KeyError, ValueError) as err:  # a refused create, a replica pod someone edited
                    self.counts["api_errors"] += 1
                    log.warning("service %s: rolling to its template: %s", sid, err)
        for sid, s in self.state.services.items():
            patch = self._status.get(sid, {})
            patch.update(replicas=len(s.replicas), nextIndex=s.next_id)
            old = self.crs[sid].get("status") or {}
            if any(old.get(k) != v for k, v in patch.items()):
                self._patch_status(sid, patch)
        self.converge(now)

    def _carry(self, e, now: float) -> None:
        if isinstance(e, StartReplica | MoveReplica):
            new, old = (e.replica, None) if isinstance(e, StartReplica) else (e.new, self.pod_of[e.old.id])
            if self._create(new, old):
                self.counts["migrations"] += isinstance(e, MoveReplica)
            else:
                self.state.undo(e)  # refused at bind: the state is again what runs
        elif isinstance(e, SetReplicaQuota):
            name = self.pod_of[e.replica.id]
            try:
                self.kube.resize(self.ns, name, [{"name": self._main(name), "resources": {
                    "limits": {"cpu": ko.cpu_str(e.replica.cores)}, "requests": {"cpu": ko.cpu_str(e.replica.cores)}}}])
                self.kube.merge_patch(pods(self.ns, name), {"metadata": {"annotations": {ko.CORES: str(e.replica.cores)}}})
                self.counts["resizes"] += 1
            except ApiError as err:
                if err.status not in (404, 405, 422):
                    raise
                s = self.state.services[e.service]  # no in-place resize: a replacement, make-before-break
                new = Replica(f"{s.id}/r{s.next_id}", e.replica.node, e.replica.cores, e.replica.max_batch,
                              e.replica.max_wait_s)
                s.next_id += 1
                self._create(new, name)
        elif isinstance(e, StopReplica):
            name = self.pod_of[e.replica.id]
            try:
                self.kube.evict(self.ns, name)
                self.counts["evictions"] += 1
            except ApiError as err:
                if err.status != 429:
                    raise
                self.counts["evictions_refused"] += 1
                log.info("eviction of %s refused by a PodDisruptionBudget: tried again next round", name)

    def _no_roll(self, sid: str, pod: dict) -> None:
        """A successor made from the service's template could not start or failed: rolling the
        service to that template pauses until the template changes (or the scheduler restarts),
        instead of making one such pod after another."""
        made = ko.annotations(pod).get(ko.TEMPLATE_HASH)
        if made is not None and self._paused.get(sid) != made:
            self._paused[sid] = made
            log.warning("InferenceService %s: rolling its replicas to template %s paused: pod %s made from it "
                        "could not start", sid, made, ko.meta(pod)["name"])

    def _roll(self, sid: str) -> None:
        """A replica made from an earlier version of its service's template (an edit since: a new
        image) is replaced make-before-break on its node, one per service per round, while every
        other replica of the service is Ready and no move of it is under way."""
        assert self.state is not None
        want = ko.template_hash(self.crs[sid]["spec"].get("template"))
        if self._paused.get(sid) == want:
            return
        mine = self._mine.get(sid, [])
        names = {ko.meta(p)["name"] for p in mine}
        if any(ko.annotations(p).get(ko.REPLACES) in names or not ko.ready(p) for p in mine):
            return  # a move under way (its predecessor still there), or a replica not Ready
        s = self.state.services[sid]
        for p in mine:
            made = ko.annotations(p).get(ko.TEMPLATE_HASH)
            r = ko.replica_of(p)
            if made is None or made == want or s.replicas.get(r.id) is None:
                continue
            r = s.replicas[r.id]
            new = Replica(f"{sid}/r{s.next_id}", r.node, r.cores, r.max_batch, r.max_wait_s)
            s.next_id += 1
            log.info("replica pod %s was made from an earlier template of %s: replacing it", ko.meta(p)["name"], sid)
            if self._create(new, ko.meta(p)["name"]):
                self.counts["rollouts"] += 1
            return

    def _main(self, pod_name: str) -> str:
        p = self.informers.reflectors["pods"].get(f"{self.ns}/{pod_name}") or {}
        return (((p.get("spec") or {}).get("containers") or [{}])[0]).get("name", "serve")

    def _create(self, r: Replica, replaces: str | None) -> bool:
        """Create and bind the replica's pod; False when the bind was refused (pod dropped)."""
        pod = ko.inference_pod(self.crs[r.id.split("/", 1)[0]], r, replaces)
        try:
            new = self.kube.create(pods(self.ns), pod)
            self.informers.put("pods", new)
        except ApiError as err:
            if err.status != 409:
                raise
            new = self.kube.get(pods(self.ns, pod["metadata"]["name"]))
        self.fault("after-create")
        if not self._bind(new):
            return False
        if replaces:
            self.fault("mid-migration")
        return True

    # ------------------------------------------------------------------ converge
    def fresh(self, node: str, now: float) -> bool:
        st = ((self.objs.slacks.get(node) if self.objs else None) or {}).get("status") or {}
        return "reportedAt" in st and now - float(st["reportedAt"]) <= self.stale_s

    def _bind(self, pod: dict) -> bool:
        """Bind a targeted pod to its node unless that node's agent is stale (then the pod,
        which never served, is deleted). True when the pod is bound."""
        m = ko.meta(pod)
        node = ko.annotations(pod).get(ko.TARGET)
        if (pod.get("spec") or {}).get("nodeName"):
            return True
        if not node:
            return False
        if not self.fresh(node, self.clock()):
            self.counts["bind_refused_stale"] += 1
            log.warning("not binding %s: the agent of %s is stale; the pod is dropped", m["name"], node)
            self.kube.delete(pods(self.ns, m["name"]), grace_s=0, uid=m.get("uid"))
            return False
        try:
            self.kube.bind(self.ns, m["name"], node, uid=m.get("uid"))
            self.counts["binds"] += 1
        except ApiError as err:
            if err.status != 409:
                raise
        return True

    def converge(self, now: float) -> None:
        """Finish what the pods say is half done: bind targeted pods, delete a replaced pod
        once its successor is Ready."""
        objs = self.informers.objects()
        by_name = {ko.meta(p)["name"]: p for p in objs.pods}
        services = {ko.meta(s)["name"]: ko.meta(s).get("uid") for s in objs.services}
        for p in objs.pods:
            if ko.SERVICE not in ko.labels(p) or ko.deleting(p):
                continue
            try:
                svc = ko.labels(p)[ko.SERVICE]
                if (p.get("status") or {}).get("phase") == "Failed":  # no longer a replica: the policy starts another
                    st = p.get("status") or {}
                    log.warning("replica pod %s failed on %s (%s: %s): removed", ko.meta(p)["name"],
                                (p.get("spec") or {}).get("nodeName"), st.get("reason", ""), st.get("message", ""))
                    self.counts["replicas_failed"] += 1
                    if ko.REPLACES in ko.annotations(p) and not ko.platform_failure(p):  # (an OutOfcpu is the node's)
                        self._no_roll(svc, p)
                    self._delete(p)
                    continue
                if ko.terminated(p):
                    continue
                if svc not in services or ko.owner_uid(p, "InferenceService") != services[svc]:
                    # its service is gone, or was deleted and created again (no garbage collector, or not yet)
                    self._delete(p)
                    continue
                self._bind(p)
                why = ko.stuck(p, lasting=True)
                pred = by_name.get(ko.annotations(p).get(ko.REPLACES, ""))
                if why and pred is not None and not ko.deleting(pred) and not ko.terminated(pred):
                    log.warning("move of %s given up: its successor %s cannot start (%s)",
                                ko.annotations(p)[ko.REPLACES], ko.meta(p)["name"], why[1])
                    self.counts["moves_given_up"] += 1
                    self._no_roll(svc, p)
                    self._delete(p)
                    continue
                if not ko.ready(p):
                    continue
                old, seen = ko.annotations(p).get(ko.REPLACES), set()
                while old and old in by_name and old not in seen:  # the predecessor, and what it replaced
                    seen.add(old)
                    o = by_name[old]
                    if not ko.deleting(o):
                        self._delete(o)
                    old = ko.annotations(o).get(ko.REPLACES)
            except Exception as err:  # one pod's trouble is not every pod's
                self.counts["api_errors"] += 1
                log.warning("pod %s: %s", ko.meta(p)["name"], err)

    def _delete(self, p: dict) -> None:
        self.kube.delete(pods(self.ns, ko.meta(p)["name"]), uid=ko.meta(p).get("uid"))

    def _patch_status(self, name: str, patch: dict) -> None:
        try:
            new = self.kube.merge_patch(custom("inferenceservices", self.ns, name, "status"), {"status": patch})
            self.informers.put("services", new)
        except ApiError as err:
            self.counts["api_errors"] += 1
            log.warning("status of %s: %s", name, err)

