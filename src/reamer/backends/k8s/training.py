"""The controller's backend: TrainingJobs run by NEARCHUS (or any training policy) on a cluster.

Every round, :meth:`K8sTraining.observe` rebuilds the shared
:class:`~reamer.backends.state.training.ClusterState` from the TrainingJobs' status (the
shape decided) and the agents' reports (:mod:`reamer.backends.k8s.telemetry`);
:meth:`K8sTraining.actuate` books the policy's decisions in that state, records each changed
job's new shape in its status *first* (a PUT carrying the resourceVersion read: 409 → the
decision is dropped, the next round re-reads and re-decides), then converges the pods to the
recorded shapes:

* a job's pods are named from its **epoch** (each start or PS/worker change is a restart
  from the checkpoint in a new epoch; pods of an older epoch are deleted first and the new
  ones created only once they are gone, so their checkpoint is written before it is read);
* a CPU change is ``PATCH pods/{name}/resize`` (Kubernetes ≥ 1.33); where the server has no
  such subresource (404) or the kubelet answers ``Infeasible``, the job's ``resizeFallback``
  says what happens: ``RestartJob`` (default: the whole job restarts from its checkpoint in a
  new epoch, as a PS job whose cluster spec is fixed needs) or ``RecreatePod`` (only that
  pod, under a new name recorded in the status before the old pod is deleted: for frameworks
  whose workers may restart alone);
* a pod is created on a node only when the node's recorded training shape plus the inference
  pods there fit its cores — inference moves first (the scheduler sees the new shape in the
  status and migrates); after ``yield_timeout_s`` training takes its cores anyway.

* a failed pod, a pod deleted once its epoch was complete (``status.createdEpoch``) and a pod
  made from an earlier template are replaced by the job's ``resizeFallback``; failures that are
  the job's own (not an eviction or a kubelet refusal) and container restarts count against
  ``spec.backoffLimit``, past which the job is ``Failed``; condition ``PodsReady`` says why a
  pod does not run (the kubelet's reason, or the API server's refusal).

Nothing lives only in memory: a restarted controller reads the same status and pods and
carries on (``fault`` names the points where tests kill it).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.cluster import (
    ClusterObjects,
    Informers,
    TrainingView,
    default_pod_name,
    training_state,
)
from reamer.backends.k8s.kube import ApiError, Kube, custom, pods, services
from reamer.backends.k8s.telemetry import banked, job_telemetry, newest_report, pod_reports
from reamer.backends.state.training import (
    Effect,
    JobRecord,
    Launch,
    Reshape,
    SetQuota,
    Stop,
)
from reamer.domain import (
    ClusterSnapshot,
    Decision,
    JobState,
    JobTelemetry,
    RemoveContainer,
    Resources,
    Role,
    TrainingJob,
)
from reamer.domain.decisions import InvalidDecision
from reamer.policies.diagnosis import Thresholds, diagnose

log = logging.getLogger(__name__)
BACKOFF_LIMIT = 6  # a TrainingJob's default spec.backoffLimit: a Kubernetes Job's (batch/v1 JobSpec)
Fault = Callable[[str], None]


def no_fault(point: str) -> None:
    return None


class K8sTraining:
    """The :class:`~reamer.control.Backend` of ``reamer k8s controller`` in ``namespace``."""

    def __init__(self, kube: Kube, informers: Informers, namespace: str, models: Mapping[str, object], *,
                 yield_timeout_s: float = 60.0, fault: Fault = no_fault, grace_s: int | None = None) -> None:
        self.kube, self.informers, self.ns, self.models = kube, informers, namespace, models
        self.yield_timeout_s, self.fault, self.grace_s = yield_timeout_s, fault, grace_s
        self.view: TrainingView | None = None
        self.objs: ClusterObjects | None = None
        self.telemetry: dict[str, JobTelemetry] = {}
        self.samples: dict[str, float] = {}  # this round: job -> samples done (banked)
        self.counters: dict[str, dict[str, float]] = {}  # this round: job -> its workers' counters
        self._seen: dict[str, float] = {}  # job uid -> newest report already turned into a policy sample
        self._stale: set[str] = set()  # this round: jobs whose status write failed (left alone until re-read)
        self._failed: dict[str, str] = {}  # this round: jobs past their backoffLimit -> why
        self._warned_crd = False
        self._services: set[str] = set()  # job uids whose own headless Service was seen (checked again on pod creation)
        self.counts = {"conflicts": 0, "invalid_decisions": 0, "pods_created": 0, "pods_deleted": 0,
                       "resizes": 0, "recreates": 0, "api_errors": 0, "inference_evicted": 0, "evictions_refused": 0}

    # ------------------------------------------------------------------ observe
    def observe(self, now: float) -> ClusterSnapshot:
        objs = self.objs = self.informers.objects()
        view = self.view = training_state(objs, self.models, replica_memory=True)
        for name, err in view.invalid.items():
            self._mark_invalid(name, err, now)
        reports = pod_reports(objs)
        self.telemetry, self.samples, self.counters, self._stale, self._failed = {}, {}, {}, set(), {}
        running, queue = [], []
        for jid in list(view.state.running):
            j = view.state.jobs[jid]
            cont = list(j.containers.values())
            st = view.crs[jid].get("status") or {}
            uid = ko.meta(view.crs[jid]).get("uid", jid)
            pod_uids = {ko.meta(p)["name"]: ko.meta(p).get("uid", "") for p in self._pods_of(view.crs[jid])}
            tel, counters = job_telemetry(cont, view.pod_names, self.ns, reports, self._seen.get(uid, -math.inf),
                                          pod_uids)
            before = st.get("counters") or {}
            # a worker whose report has no counter this round (a failed scrape) keeps its last one:
            # dropped, its next counter would be banked again from 0
            workers = {view.pod_names.get(c.id, "") for c in cont if c.role is Role.WORKER}
            counters = {**{pod: float(v) for pod, v in before.items() if pod in workers and v is not None},
                        **counters}
            samples = self.samples[jid] = banked(float(st.get("samplesDone", 0.0)), before, counters)
            self.counters[jid] = counters
            if tel is not None:
                self._seen[uid] = newest_report(cont, view.pod_names, self.ns, reports)
            done = samples >= j.spec.samples or self._workers_succeeded(jid, view)
            failed = "" if done else self._over_backoff(jid)
            if failed:
                self._failed[jid] = failed
            if done or failed:
                try:
                    self._commit({jid: [view.state.finish(jid, now)]}, now)
                except Exception:  # one job's trouble is not every job's
                    self.counts["api_errors"] += 1
                    log.exception("job %s: completion not recorded (retried next round)", jid)
                continue
            if tel is not None:
                self.telemetry[jid] = tel
            running.append(j.view(samples, now))
        for jid in view.state.queue:
            j = view.state.jobs[jid]
            queue.append(j.view(float((view.crs[jid].get("status") or {}).get("samplesDone", 0.0)), now))
        return view.state.snapshot(now, queue, running, self.telemetry)

    def _over_backoff(self, jid: str) -> str:
        """Why the job has failed more often than its ``spec.backoffLimit`` allows ("" if not): pods
        that failed (``status.failures``, counted when each was replaced) plus restarts of the
        containers of its pods now (a crash loop), as a Kubernetes Job counts them."""
        view = self.view
        assert view is not None
        tj = view.crs[jid]
        limit = int(tj["spec"].get("backoffLimit", BACKOFF_LIMIT))
        failures = int((tj.get("status") or {}).get("failures", 0))
        restarts, last = 0, ""
        for p in self._pods_of(tj):
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                n = int(cs.get("restartCount") or 0)
                if n:
                    restarts += n
                    term = (cs.get("lastState") or {}).get("terminated") or {}
                    last = f"; pod {ko.meta(p)['name']} container {cs.get('name')}: {term.get('reason', 'restarted')}" \
                           f"{' (exit code ' + str(term['exitCode']) + ')' if 'exitCode' in term else ''}"
        if failures + restarts <= limit:
            return ""
        return (f"{failures} failed pods and {restarts} container restarts, more than spec.backoffLimit {limit}"
                f"{last}")

    def _workers_succeeded(self, jid: str, view: TrainingView) -> bool:
        j = view.state.jobs[jid]
        names = {view.pod_names[c.id] for c in j.containers.values() if c.role is Role.WORKER}
        ps = [p for p in self._pods_of(view.crs[jid]) if ko.meta(p)["name"] in names]
        return bool(names) and len(ps) == len(names) and all((p.get("status") or {}).get("phase") == "Succeeded"
                                                             for p in ps)

    # ------------------------------------------------------------------ actuate
    def actuate(self, decisions: Sequence[Decision], now: float) -> None:
        assert self.view is not None, "observe before actuate"
        effects: dict[str, list[Effect]] = {}
        for d in decisions:
            try:
                if isinstance(d, RemoveContainer):
                    self._check_min(d.container)
                e = self.view.state.apply(d, now)
            except InvalidDecision as err:
                self.counts["invalid_decisions"] += 1
                log.warning("decision %s rejected: %s", d, err)
                continue
            effects.setdefault(e.job, []).append(e)
        self._commit(effects, now)
        self.converge(now)

    def _check_min(self, cid: str) -> None:
        """A job keeps the PS / workers its spec's ``min`` asks for (the shared state keeps one)."""
        view = self.view
        assert view is not None
        jid = view.state.owner.get(cid)
        if jid is None or jid not in view.crs:
            return
        c = view.state.container(cid)
        role = "ps" if c.role is Role.PS else "worker"
        lo = int(view.crs[jid]["spec"][role].get("min", 1))
        if view.state.jobs[jid].count(c.role) <= lo:
            raise InvalidDecision(f"remove {cid}: spec.{role}.min is {lo}")

    def _commit(self, effects: dict[str, list[Effect]], now: float) -> None:
        """Record each job's new shape in its status (optimistic concurrency)."""
        view = self.view
        assert view is not None
        for jid, effs in effects.items():
            epoch = view.epochs[jid]
            j = view.state.jobs[jid]
            if any(isinstance(e, Launch | Reshape) for e in effs):
                epoch += 1
                for c in j.containers.values():
                    view.pod_names[c.id] = default_pod_name(c, epoch)
            for e in effs:
                if isinstance(e, SetQuota) and e.container.id not in view.pod_names:
                    view.pod_names[e.container.id] = default_pod_name(e.container, epoch)
            stopped = next((e for e in effs if isinstance(e, Stop)), None)
            phase = ("Queued" if stopped.requeued else "Failed" if jid in self._failed else "Succeeded") \
                if stopped else ("Running" if j.state is JobState.RUNNING else "Queued")
            if not self._write_status(jid, j, epoch, phase, now):
                self._stale.add(jid)  # its pods are left as they are; the next round re-reads it
                continue
            view.epochs[jid] = epoch
            self.fault("after-status")

    def _status(self, jid: str, j: JobRecord, epoch: int, phase: str, now: float, failed: bool = False,
                renamed: bool = False) -> dict:
        view = self.view
        assert view is not None
        old = (view.crs[jid].get("status") or {})
        cont = list(j.containers.values())
        recs = [{**ko.container_status(c), "pod": view.pod_names.get(c.id, default_pod_name(c, epoch))} for c in cont]
        st = {**old, "phase": phase, "epoch": epoch, "nextIndex": j.next_id, "containers": recs,
              "ps": j.count(Role.PS), "workers": j.count(Role.WORKER), "cores": round(sum(c.res.cpu for c in cont), 3),
              "queuedAt": j.queued_since, "queueSeconds": j.queue_s, "reconfigurations": j.reconfigs,
              "samplesDone": self.samples.get(jid, float(old.get("samplesDone", 0.0))),
              **({"counters": self.counters[jid]} if jid in self.counters else {}),
              "observedGeneration": ko.meta(view.crs[jid]).get("generation", 0)}
        if failed:  # a failed pod is being replaced
            st["failures"] = int(old.get("failures", 0)) + 1
        if renamed:  # a pod of this epoch is to be created under a new name
            st["createdEpoch"] = epoch - 1
        for k, v in (("startedAt", j.started_s), ("lastChangeAt", j.last_change_s), ("finishedAt", j.finished_s)):
            if v is not None:
                st[k] = v
        if phase == "Running":
            st["conditions"] = ko.set_condition(old.get("conditions"), "Scheduled", True, "Placed",
                                                f"{len(cont)} containers on {len({c.node for c in cont})} nodes", now)
        elif phase == "Succeeded":
            st["conditions"] = ko.set_condition(old.get("conditions"), "Scheduled", False, "Completed",
                                                f"{st['samplesDone']:.0f} of {j.spec.samples:.0f} samples", now)
        elif phase == "Failed":
            why = self._failed.get(jid, "")
            st["conditions"] = ko.set_condition(ko.set_condition(old.get("conditions"), "Scheduled", False,
                                                                 "BackoffLimitExceeded", why, now),
                                                "Failed", True, "BackoffLimitExceeded", why, now)
        return st

    def _write_status(self, jid: str, j: JobRecord, epoch: int, phase: str, now: float, failed: bool = False,
                      renamed: bool = False) -> bool:
        view = self.view
        assert view is not None
        cr = dict(view.crs[jid])
        cr["status"] = self._status(jid, j, epoch, phase, now, failed, renamed)
        try:
            new = self.kube.replace(custom("trainingjobs", self.ns, jid, "status"), cr)
        except ApiError as e:
            if e.status == 409:
                self.counts["conflicts"] += 1
                log.info("job %s changed since it was read (409): re-deciding next round", jid)
            else:  # gone (404), refused (422), the server failing: the next round re-reads it
                self.counts["api_errors"] += 1
                log.warning("status of %s not written: %s", jid, e)
            return False
        view.crs[jid] = new
        self.informers.put("jobs", new)
        return True

    def _merge_status(self, jid: str, patch: dict) -> bool:
        try:
            new = self.kube.merge_patch(custom("trainingjobs", self.ns, jid, "status"), {"status": patch})
            self.informers.put("jobs", new)
            if self.view is not None and jid in self.view.crs:
                self.view.crs[jid] = new
            return True
        except ApiError as e:
            self.counts["api_errors"] += 1
            log.warning("status of %s: %s", jid, e)
            return False

    def _mark_invalid(self, name: str, err: ko.SpecError, now: float) -> None:
        tj = next(o for o in (self.objs.jobs if self.objs else []) if ko.meta(o)["name"] == name)
        st = tj.get("status") or {}
        conds = st.get("conditions") or []
        if st.get("phase") == "Invalid" and any(c.get("type") == "Invalid" and c.get("message") == str(err)
                                                for c in conds):
            return
        log.warning("TrainingJob %s cannot run: %s", name, err)
        self._merge_status(name, {"phase": "Invalid", "conditions": ko.set_condition(
            conds, "Invalid", True, err.reason, str(err), now)})

    # ------------------------------------------------------------------ converge
    def converge(self, now: float) -> None:
        """Make every job's pods match its recorded shape (idempotent; safe after a crash)."""
        view, objs = self.view, self.objs
        assert view is not None and objs is not None
        uids = {ko.meta(o).get("uid") for o in objs.jobs}
        done = {ko.meta(o).get("uid") for o in objs.jobs if ko.meta(o)["name"] in view.done}
        for p in objs.pods:  # pods of a TrainingJob that is gone (no garbage collector) or done
            if ko.JOB not in ko.labels(p) or ko.deleting(p):
                continue
            owner = ko.owner_uid(p, "TrainingJob")
            if owner not in uids or (owner in done and not ko.terminated(p)):
                self._guard(f"pod {ko.meta(p)['name']}", self._delete, p)
        inference = self._inference_cores(objs)
        for jid in list(view.crs):
            if jid in view.state.jobs and jid not in self._stale:
                self._guard(f"job {jid}", self._converge_job, jid, now, inference)

    def _guard(self, what: str, fn, *args) -> None:
        """Run one object's step: an error is counted and logged, the others go on."""
        try:
            fn(*args)
        except Exception as e:
            self.counts["api_errors"] += 1
            log.warning("%s: %s (retried next round)", what, e)

    def _pods_of(self, tj: dict) -> list[dict]:
        """The pods of this TrainingJob incarnation (:attr:`TrainingView.pods`)."""
        assert self.view is not None
        return list(self.view.pods.get(ko.meta(tj).get("uid"), {}).values())

    def _inference_cores(self, objs: ClusterObjects) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in objs.pods:
            if ko.SERVICE in ko.labels(p) and not ko.terminated(p) and (node := ko.pod_node(p)):
                out[node] = out.get(node, 0.0) + _cores(p)
        return out

    def _converge_job(self, jid: str, now: float, inference: dict[str, float]) -> None:
        view, objs = self.view, self.objs
        assert view is not None and objs is not None
        j, tj, epoch = view.state.jobs[jid], view.crs[jid], view.epochs[jid]
        existing = {ko.meta(p)["name"]: p for p in self._pods_of(tj)}
        desired = {view.pod_names[c.id]: c for c in j.containers.values()} if j.state is JobState.RUNNING else {}
        for name, p in existing.items():
            if name not in desired and not ko.deleting(p) and (desired or not ko.terminated(p)):
                self._delete(p)  # (a job stopped keeps its ended pods, for their logs)
        if not desired:
            return
        ensured = ko.meta(tj).get("uid") not in self._services
        if ensured:
            self._ensure_service(tj)  # each round until this job's own Service is there
        older = any(ko.labels(p).get(ko.EPOCH) != str(epoch) for p in existing.values())
        busy = {ko.labels(p).get(ko.CONTAINER) for n, p in existing.items() if n not in desired}
        since = j.last_change_s if j.last_change_s is not None else now
        complete = int((tj.get("status") or {}).get("createdEpoch", 0)) == epoch  # every pod of it was created
        waiting, created, refused = [], 0, None
        for name, c in desired.items():
            node = view.state.node_by_name[c.node]
            room = node.cores - view.state.cpu_limits(c.node) - inference.get(c.node, 0.0)
            p = existing.get(name)
            grows = p is None or (not ko.deleting(p) and ko.pod_cpu_limit(p) < c.res.cpu - 1e-6)
            if room < -1e-6 and grows:  # inference moves first; the pod keeps its old shape meanwhile
                if now - since >= self.yield_timeout_s and c.node not in waiting:
                    self._evict_inference(jid, c.node, -room)  # it has not: it is evicted
                waiting.append(c.node)
                continue
            if p is not None and (p.get("status") or {}).get("phase") == "Failed" and not ko.deleting(p):
                log.warning("pod %s failed (%s): replacing it", name, (p.get("status") or {}).get("reason", ""))
                if self._replace(jid, j, epoch, p, c, now, failed=not ko.platform_failure(p)):
                    return
                continue
            if p is not None:
                if not ko.deleting(p) and self._outdated(tj, p, c):
                    log.info("job %s: pod %s was made from an earlier %s template: replacing it", jid, name,
                             c.role.value)
                    if self._replace(jid, j, epoch, p, c, now):
                        return
                    continue
                if not ko.deleting(p) and self._resize_if_needed(jid, j, epoch, p, c, now):
                    return  # restarting in a new epoch: the next round converges to it
                continue
            if older or ko.short(c.id) in busy:
                continue  # the old incarnation checkpoints and goes first
            if complete:  # it was there: deleted since
                log.warning("job %s: pod %s is gone (deleted): replacing it", jid, name)
                if self._replace(jid, j, epoch, {"metadata": {"name": name}}, c, now):
                    return
                continue
            if not ensured:
                ensured = True
                self._ensure_service(tj)  # and in every round pods are created in: one deleted since comes back
            pod = ko.training_pod(tj, j.spec, c, list(j.containers.values()), epoch, name)
            try:
                new = self.kube.create(pods(self.ns), pod)
                self.informers.put("pods", new)
                self.counts["pods_created"] += 1
            except ApiError as e:
                if e.status in (400, 403, 422):  # a quota, an admission policy, the template: said, tried again
                    self.counts["api_errors"] += 1
                    log.warning("job %s: pod %s refused: %s", jid, name, e.message)
                    refused = refused or ("CreateRefused", f"pod {name}: {e.message}")
                    continue
                if e.status != 409:
                    raise
            created += 1
            if created == 1 and len(desired) > 1:
                self.fault("gang-start")
        if created:
            self.fault("after-pod-create")
        conds = (tj.get("status") or {}).get("conditions")
        want = ko.set_condition(conds, "WaitingForInference", bool(waiting),
                                "InferenceMoving" if waiting else "NodesFree",
                                f"inference has not yet left {', '.join(sorted(set(waiting)))}" if waiting else "", now)
        mine = [p for n, p in existing.items() if n in desired and not ko.deleting(p)]
        problem = refused or next((x for p in mine if (x := ko.stuck(p)) is not None), None)
        running = len(mine) == len(desired) and all((p.get("status") or {}).get("phase") == "Running" for p in mine)
        reason, msg = problem or (("Running", "") if running else ("Starting", "not every pod is running yet"))
        want = ko.set_condition(want, "PodsReady", problem is None and running, reason, msg, now)
        patch: dict = {}
        if [(c["type"], c["status"], c.get("reason")) for c in want] != \
                [(c.get("type"), c.get("status"), c.get("reason")) for c in conds or []]:
            patch["conditions"] = want
        renamed = any(view.pod_names[c.id] != name for name, c in desired.items())  # a pod recreated this round
        if len(mine) == len(desired) and not renamed and not complete:
            patch["createdEpoch"] = epoch  # every pod of the epoch was created: one missing later was deleted
        if patch and self._merge_status(jid, patch):
            if "createdEpoch" in patch and "createdEpoch" not in (view.crs[jid].get("status") or {}) \
                    and not self._warned_crd:
                self._warned_crd = True  # the server dropped it: its CRD is older than this controller
                log.warning("the TrainingJob CRD has no status.createdEpoch: run `reamer k8s install-crds` (a deleted "
                            "pod is not told from one never created until then)")

    @staticmethod
    def _outdated(tj: dict, pod: dict, c) -> bool:
        """The pod was made from another version of its role's template (an edit since: a new
        image, an env var); a pod without the annotation is left as it is."""
        made = ko.annotations(pod).get(ko.TEMPLATE_HASH)
        role = "ps" if c.role is Role.PS else "worker"
        return made is not None and made != ko.template_hash(tj["spec"][role].get("template"))

    def _evict_inference(self, jid: str, node: str, need: float) -> None:
        """Evict (the Eviction API: PodDisruptionBudgets hold) the inference pods on ``node`` that
        keep ``need`` cores from training past its yield time-out, largest first, but for those
        already going; the job's pods wait until they are gone (the kubelet would refuse them)."""
        objs = self.objs
        assert objs is not None
        here = [p for p in objs.pods if ko.SERVICE in ko.labels(p) and not ko.terminated(p) and ko.pod_node(p) == node]
        for p in here:
            if ko.deleting(p):
                need -= _cores(p)
        for p in sorted((p for p in here if not ko.deleting(p)), key=_cores, reverse=True):
            if need <= 1e-6:
                return
            name = ko.meta(p)["name"]
            try:
                self.kube.evict(self.ns, name)
                self.counts["inference_evicted"] += 1
                log.warning("job %s: inference pod %s still on %s after the yield time-out: evicted", jid, name, node)
            except ApiError as e:
                if e.status != 429:
                    raise
                self.counts["evictions_refused"] += 1
                log.info("job %s: eviction of %s refused by a PodDisruptionBudget: tried again next round", jid, name)
            need -= _cores(p)

    def _resize_if_needed(self, jid: str, j: JobRecord, epoch: int, pod: dict, c, now: float) -> bool:
        """Bring ``pod`` to ``c``'s CPU: in place, else by the job's ``resizeFallback``. True when
        the job was moved to a new epoch (its other pods are not touched this round)."""
        infeasible = any(x.get("type") == "PodResizePending" and x.get("reason") == "Infeasible"
                         for x in (pod.get("status") or {}).get("conditions") or [])
        if not infeasible and abs(ko.pod_cpu_limit(pod) - c.res.cpu) < 1e-6:
            return False
        name = ko.meta(pod)["name"]
        if not infeasible:
            try:
                new = self.kube.resize(self.ns, name, [resize_patch(pod, c.res.cpu)])
                self.informers.put("pods", new)
                self.counts["resizes"] += 1
                return False
            except ApiError as e:
                if e.status not in (404, 405, 422):
                    raise
                if e.status == 422:  # a server with /resize refused this one: say why, then restart it
                    log.warning("pod %s: in-place resize refused (%s): recreating it", name, e.message)
                else:
                    log.info("pod %s: no in-place resize on this server (%s): recreating it", name, e.status)
        self.counts["recreates"] += 1
        return self._replace(jid, j, epoch, pod, c, now)

    def _replace(self, jid: str, j: JobRecord, epoch: int, pod: dict, c, now: float, failed: bool = False) -> bool:
        """A pod that must be created anew (a resize that cannot be done in place, a ``failed``
        pod: counted in ``status.failures``): by the job's ``resizeFallback``. True when the whole
        job moved to a new epoch."""
        view = self.view
        assert view is not None
        name = ko.meta(pod)["name"]
        if view.crs[jid]["spec"].get("resizeFallback", "RestartJob") == "RecreatePod":
            # this pod alone, under a new name recorded first; the next converge deletes the old one
            m = re.search(r"-r(\d+)$", name)
            view.pod_names[c.id] = f"{default_pod_name(c, epoch)}-r{int(m.group(1)) + 1 if m else 1}"
            if self._write_status(jid, j, epoch, "Running", now, failed, renamed=True) and ko.meta(pod).get("uid"):
                self._delete(pod)  # (a pod already gone has none)
                self.fault("resize-recreate")
            return False
        # the whole job restarts from its checkpoint in a new epoch (a PS job's cluster spec is fixed)
        for x in j.containers.values():
            view.pod_names[x.id] = default_pod_name(x, epoch + 1)
        if self._write_status(jid, j, epoch + 1, "Running", now, failed):
            view.epochs[jid] = epoch + 1
            self.fault("resize-recreate")
        return True

    def _ensure_service(self, tj: dict) -> None:
        """Create the job's headless Service; remember (by job uid) that it is there, once it is
        this job's own. Never raises: the pods go on without it, and it is tried again."""
        uid = ko.meta(tj).get("uid", "")
        self._services.discard(uid)
        name = ko.meta(tj)["name"]
        try:
            self.kube.create(services(self.ns), ko.headless_service(tj))
        except ApiError as e:
            # one of that name exists (409; a quota is checked first: 403): this job's (a restarted
            # controller), an earlier job's of the same name not yet collected, someone else's
            try:
                svc = self.kube.get_or_none(services(self.ns, name)) or {}
            except ApiError:
                svc = {}
            owners = {r.get("uid") for r in ko.meta(svc).get("ownerReferences") or []}
            if uid not in owners:
                if e.status == 409:
                    log.info("job %s: Service %s belongs to another object (%s); tried again next round", name,
                             name, ", ".join(sorted(o for o in owners if o)) or "no owner")
                else:
                    self.counts["api_errors"] += 1
                    log.warning("job %s: its headless Service is not created (%s); tried again next round", name, e)
                return
        self._services.add(uid)

    def _delete(self, pod: dict) -> None:
        m = ko.meta(pod)
        if self.kube.delete(pods(self.ns, m["name"]), grace_s=self.grace_s, uid=m.get("uid")):
            self.counts["pods_deleted"] += 1

    # ------------------------------------------------------------------ reports
    def report(self, decisions: Sequence[Decision], thresholds: Thresholds | None, now: float) -> None:
        """Write why each queued job waits, and each measured job's diagnosis, its evidence and
        the round's decision for it."""
        view = self.view
        if view is None:
            return
        for jid in view.state.queue:
            j, tj = view.state.jobs[jid], view.crs.get(jid)
            if tj is None or jid in self._stale:
                continue
            reason, msg = _why_queued(j.spec, view.state.free)
            st = tj.get("status") or {}
            old = next((c for c in st.get("conditions") or [] if c.get("type") == "Scheduled"), None)
            if st.get("phase") != "Queued" or old is None or old.get("message") != msg:
                conds = ko.set_condition(st.get("conditions"), "Scheduled", False, reason, msg, now)
                if any(c.get("type") == "PodsReady" for c in conds):  # it ran before: its pods are gone
                    conds = ko.set_condition(conds, "PodsReady", False, "Queued", "no pods while it waits", now)
                self._merge_status(jid, {"phase": "Queued", "conditions": conds})
        for jid, counters in self.counters.items():  # progress, banked from the workers' counters
            j = view.state.jobs.get(jid)
            if j is None or j.state is not JobState.RUNNING or jid in self._stale:
                continue
            st = view.crs[jid].get("status") or {}
            patch: dict = {}
            before = st.get("counters") or {}
            if counters != before or jid in self.telemetry:  # (a merge patch removes a key set to null)
                patch.update(samplesDone=self.samples.get(jid, 0.0),
                             counters={**{k: None for k in before if k not in counters}, **counters})
            tel = self.telemetry.get(jid)
            if tel is not None and thresholds is not None:
                d = diagnose(j.view(self.samples.get(jid, 0.0), now), tel, thresholds.cpu, thresholds.net,
                             thresholds.side_margin)
                mine = [type(x).__name__ for x in decisions if _job_of(x) == jid]
                patch["diagnosis"] = {
                    "bottleneck": d.bottleneck, "at": now, "decision": ", ".join(mine) or "none",
                    "evidence": {"speed": round(tel.speed, 3), "workerCpuUtil": round(d.worker_cpu_util, 3),
                                 "psCpuUtil": round(d.ps_cpu_util, 3), "netUtil": round(d.net_util, 3),
                                 "workerNetUtil": round(d.worker_net_util, 3), "cpuUsed": round(d.cpu_used, 3)}}
            if patch:
                self._merge_status(jid, patch)


def qos_class(containers: list[dict]) -> str:
    """The pod's QoS class as Kubernetes computes it from its containers' CPU and memory
    (a request defaults to its limit)."""
    any_set, guaranteed = False, True
    for c in containers:
        r = c.get("resources") or {}
        lim, req = r.get("limits") or {}, {**(r.get("limits") or {}), **(r.get("requests") or {})}
        for k in ("cpu", "memory"):
            if k in req or k in lim:
                any_set = True
            if k not in lim or k not in req or _q(req[k]) != _q(lim[k]):
                guaranteed = False
    return "Guaranteed" if guaranteed and any_set else "Burstable" if any_set else "BestEffort"


def _q(v) -> float:
    try:
        return ko.quantity(v, "resource")
    except ko.SpecError:
        return -1.0


def resize_patch(pod: dict, cores: float) -> dict:
    """The ``pods/resize`` patch of the training container to ``cores`` that Kubernetes
    accepts: the pod's QoS class must not change and no request may exceed its limit. A
    Guaranteed pod moves its CPU request with the limit; a Burstable one keeps its request,
    lowered to the new limit when above it, and by a millicore more if that alone would make
    the pod Guaranteed."""
    ctrs = [dict(c) for c in (pod.get("spec") or {}).get("containers") or [{}]]
    main = ctrs[0]
    res = main.get("resources") or {}
    req, lim = dict(res.get("requests") or {}), dict(res.get("limits") or {})
    before = (pod.get("status") or {}).get("qosClass") or qos_class(ctrs)
    lim["cpu"] = ko.cpu_str(cores)
    if before == "Guaranteed":
        req["cpu"] = lim["cpu"]
    elif "cpu" in req:
        req["cpu"] = ko.cpu_str(min(_q(req["cpu"]), cores))
        main["resources"] = {"requests": req, "limits": lim}
        if qos_class(ctrs) == "Guaranteed":
            req["cpu"] = ko.cpu_str(max(0.001, cores - 0.001))
    return {"name": main.get("name"), "resources": {"requests": req, "limits": lim}}


def _job_of(d: Decision) -> str | None:
    job = getattr(d, "job", None)
    if job is not None:
        return job
    cid = getattr(d, "container", None)
    return cid.split("/", 1)[0] if cid else None


def _why_queued(spec: TrainingJob, free: Mapping[str, Resources]) -> tuple[str, str]:
    """A queued job's ``Scheduled`` condition: no node its pod templates allow (reason
    ``NoMatchingNode``), or what it needs against the freest node its workers may use."""
    for role in (Role.PS, Role.WORKER):
        if spec.nodes_for(role) == frozenset():
            return "NoMatchingNode", (f"no node matches spec.{role.value}.template (its nodeSelector, required "
                                      f"node affinity and tolerations of the nodes' taints)")
    allowed = spec.worker_nodes
    need = spec.request
    most = max((r for n, r in free.items() if allowed is None or n in allowed), key=lambda r: (r.cpu, r.gpu),
               default=None)
    where = "the freest node" if allowed is None else "the freest node its workers may use"
    return "WaitingForResources", (f"needs {need.cpu:g} cores, {need.gpu:g} GPUs, {need.mem_mib:.0f} MiB in all; "
                                   f"{where} has {most.cpu:g} cores, {most.gpu:g} GPUs free" if most
                                   else "no schedulable node")


def _cores(pod: dict) -> float:
    """An inference pod's cores (its annotation; 0 when someone edited it into no number: that pod
    is the scheduler's to leave alone)."""
    try:
        return float(ko.annotations(pod).get(ko.CORES, 0))
    except ValueError:
        log.warning("pod %s: annotation %s is not a number", ko.meta(pod).get("name"), ko.CORES)
        return 0.0
