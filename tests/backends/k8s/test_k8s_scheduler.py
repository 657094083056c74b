"""Tier A: the reamer scheduler (Cloud Reamer) and the joint order against a real
kube-apiserver 1.20.2: inference pods are bound only where an agent reports slack, and a
growing training job waits while inference moves make-before-break."""

from __future__ import annotations

import time

from conftest import Kubelet, container_waiting, make_node, publish_slack
from test_k8s_controller import job_pods, training_job

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.kube import custom, nodes, pods
from reamer.control import joint_round
from reamer.domain import Resize, Resources
from reamer.domain.inference import EvictReplica, PlaceReplica


def inference_service(name: str, rate: float = 20.0, slo_ms: float = 250.0, **spec) -> dict:
    return {"apiVersion": "reamer.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": name},
            "spec": {"model": "resnet50", "sloP99Ms": slo_ms, "memoryMiB": 1024, "ratePerSecond": rate,
                     "template": {"spec": {"containers": [{"name": "serve", "image": "reamer/inference"}]}}, **spec}}


def replica_pods(kube, ns, svc=None):
    sel = f"reamer.io/service={svc}" if svc else "reamer.io/service"
    return [p for p in kube.list(pods(ns), label_selector=sel)[0]]


def fresh(kube, *names, cores=16.0):
    for n in names:
        publish_slack(kube, n, reported_at=time.time(), cores=cores)


def serving(kube, ns, components, node_names, **spec):
    """Service ``vgg`` placed by a scheduler on fresh 16-core nodes, its replicas Ready: the
    scheduler and the stand-in kubelet."""
    for n in node_names:
        make_node(kube, n, 16)
    fresh(kube, *node_names)
    kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=20.0, **spec))
    s = components("scheduler")
    s.round()
    kubelet = Kubelet(kube, ns)
    kubelet.sync()
    return s, kubelet


def test_inference_pods_are_bound_only_where_an_agent_reports_slack(kube, ns, components):
    for n in ("gpu-fresh", "gpu-stale", "gpu-silent"):
        make_node(kube, n, 16)
    fresh(kube, "gpu-fresh")
    publish_slack(kube, "gpu-stale", reported_at=time.time() - 600, cores=16)  # its agent stopped 10 min ago
    kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=40.0))
    s = components("scheduler")
    rnd = s.round()
    placed = [d for d in rnd.decisions if isinstance(d, PlaceReplica)]
    assert placed and {d.node for d in placed} == {"gpu-fresh"}
    ps = replica_pods(kube, ns, "vgg")
    assert len(ps) == len(placed)
    for p in ps:
        assert p["spec"]["schedulerName"] == "reamer" and p["spec"]["nodeName"] == "gpu-fresh"
        assert p["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    # a decision for a stale node (a policy that ignores staleness) is refused at bind time
    s.inf.sync()
    s.backend.observe(time.time())
    s.backend.actuate([PlaceReplica("vgg", "gpu-stale", 2.0, 4, 0.01)], time.time())
    assert all(p["spec"].get("nodeName") != "gpu-stale" for p in replica_pods(kube, ns))
    assert s.backend.counts["bind_refused_stale"] == 1
    st = kube.get(custom("inferenceservices", ns, "vgg"))["status"]
    assert st["replicas"] == len(placed) and st["nextIndex"] >= len(placed) + 1
    # the fresh node's agent goes quiet: no new replica lands there
    publish_slack(kube, "gpu-fresh", reported_at=time.time() - 600, cores=16)
    kube.merge_patch(custom("inferenceservices", ns, "vgg"), {"spec": {"ratePerSecond": 400.0}})
    before = {ko.meta(p)["name"] for p in replica_pods(kube, ns)}
    s.round()
    assert {ko.meta(p)["name"] for p in replica_pods(kube, ns) if p["spec"].get("nodeName")} <= before


def _beside_a_replica(kube, ns, components, **controller):
    """Job ``grow`` (1 PS + 1 worker of 2 cores) and a ``vgg`` replica on 16-core ``gpu-a``: the
    controller, the scheduler, the stand-in kubelet and the replica's pod."""
    make_node(kube, "gpu-a", 16)
    fresh(kube, "gpu-a")
    kube.create(custom("trainingjobs", ns), training_job("grow", ps=1, workers=1, cpu="2"))
    ctl = components("controller", policy="static", **controller)
    kubelet = Kubelet(kube, ns)
    ctl.round()
    kubelet.sync()
    kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=20.0))
    sch = components("scheduler")
    sch.round()
    kubelet.sync()
    [rep] = replica_pods(kube, ns, "vgg")
    assert rep["spec"]["nodeName"] == "gpu-a"
    return ctl, sch, kubelet, rep


def _grow_worker(ctl, cores):
    """The controller's policy grows the job's worker (the status records it first)."""
    ctl.inf.sync()
    ctl.backend.observe(time.time())
    worker = next(cid for cid in ctl.backend.view.state.owner if "/worker" in cid)
    ctl.backend.actuate([Resize(worker, Resources(cores, 2048.0))], time.time())


def test_growing_training_moves_inference_first_make_before_break(kube, ns, components):
    ctl, sch, kubelet, old = _beside_a_replica(kube, ns, components)
    make_node(kube, "gpu-b", 16)
    fresh(kube, "gpu-a", "gpu-b")

    # training decides to grow its worker to 13 cores: the status records it first
    _grow_worker(ctl, 13.0)
    tj = kube.get(custom("trainingjobs", ns, "grow"))
    [wpod] = [p for p in job_pods(kube, ns, "grow") if ko.labels(p)[ko.ROLE] == "worker"]
    assert ko.pod_cpu_limit(wpod) == 2.0, "training took the cores before inference moved"
    assert any(c["type"] == "WaitingForInference" and c["status"] == "True" for c in tj["status"]["conditions"])

    # the scheduler sees the recorded shape and moves the replica: the new pod first
    rnd = sch.round()
    assert [type(d).__name__ for d in rnd.decisions] == ["MigrateReplica"], rnd.decisions
    reps = replica_pods(kube, ns, "vgg")
    new = [p for p in reps if ko.annotations(p).get(ko.REPLACES) == ko.meta(old)["name"]]
    assert new and new[0]["spec"]["nodeName"] == "gpu-b"
    assert not ko.deleting(kube.get(pods(ns, ko.meta(old)["name"]))), "old replica went before the new one served"
    ctl.round()
    [wpod] = [p for p in job_pods(kube, ns, "grow") if ko.labels(p)[ko.ROLE] == "worker"]
    assert ko.pod_cpu_limit(wpod) == 2.0

    kubelet.sync()  # the new replica is Ready
    fresh(kube, "gpu-a", "gpu-b")
    sch.round()  # ... so the old one goes
    assert ko.deleting(kube.get(pods(ns, ko.meta(old)["name"])))
    kubelet.sync()
    for _ in range(3):  # the controller recreates the worker at 13 cores (1.20: no in-place resize)
        ctl.round()
        kubelet.sync()
    [wpod] = [p for p in job_pods(kube, ns, "grow") if ko.labels(p)[ko.ROLE] == "worker"]
    assert ko.pod_cpu_limit(wpod) == 13.0 and wpod["spec"]["nodeName"] == "gpu-a"
    st = kube.get(custom("trainingjobs", ns, "grow"))["status"]
    assert any(c["type"] == "WaitingForInference" and c["status"] == "False" for c in st["conditions"])


def test_inference_that_has_not_moved_by_the_yield_timeout_is_evicted(kube, ns, components):
    """The scheduler is down: training grows where a replica runs, waits its yield time-out, then
    evicts the replica (a PodDisruptionBudget holds it until it is gone) and takes its cores once
    the pod has gone; it never creates a pod the kubelet would refuse beside it."""
    ctl, _, kubelet, rep = _beside_a_replica(kube, ns, components, yield_timeout_s=0.0)
    pdbs = f"/apis/policy/v1beta1/namespaces/{ns}/poddisruptionbudgets"
    kube.create(pdbs, {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "vgg"},
                       "spec": {"minAvailable": 1, "selector": {"matchLabels": {"reamer.io/service": "vgg"}}}})
    _grow_worker(ctl, 13.0)  # the scheduler never runs again
    assert ctl.backend.counts["evictions_refused"] == 1 and not ko.deleting(kube.get(pods(ns, ko.meta(rep)["name"])))
    [wpod] = [p for p in job_pods(kube, ns, "grow") if ko.labels(p)[ko.ROLE] == "worker"]
    assert ko.pod_cpu_limit(wpod) == 2.0  # it waits: a 13-core pod beside the replica would be refused
    kube.delete(f"{pdbs}/vgg")
    ctl.round()
    assert ctl.backend.counts["inference_evicted"] == 1 and ko.deleting(kube.get(pods(ns, ko.meta(rep)["name"])))
    for _ in range(3):
        kubelet.sync()
        ctl.round()
    [wpod] = [p for p in job_pods(kube, ns, "grow") if ko.labels(p)[ko.ROLE] == "worker"]
    assert ko.pod_cpu_limit(wpod) == 13.0 and wpod["spec"]["nodeName"] == "gpu-a"
    assert ctl.backend.counts["inference_evicted"] == 1


def test_a_job_at_its_shape_evicts_nothing_on_a_cordoned_node(kube, ns, components):
    """A cordoned node holds only what its jobs hold, so inference there is over its room; a job
    whose pods are at their shape takes nothing, and evicts nothing, past its yield time-out."""
    ctl, _, kubelet, rep = _beside_a_replica(kube, ns, components, yield_timeout_s=0.0)
    kube.merge_patch(nodes("gpu-a"), {"spec": {"unschedulable": True}})
    for _ in range(2):
        ctl.round()
        kubelet.sync()
    assert ctl.backend.counts["inference_evicted"] == 0 and not ko.deleting(kube.get(pods(ns, ko.meta(rep)["name"])))


def test_invalid_services_get_a_condition_and_the_scheduler_keeps_serving(kube, ns, components):
    make_node(kube, "gpu-a", 16)
    fresh(kube, "gpu-a")
    kube.create(custom("inferenceservices", ns), inference_service("bad-model", model="alexnet-9000"))
    kube.create(custom("inferenceservices", ns), inference_service("bad-range", minReplicas=4, maxReplicas=2))
    kube.create(custom("inferenceservices", ns), inference_service("good"))
    s = components("scheduler")
    s.round()
    for name, reason in (("bad-model", "UnknownModel"), ("bad-range", "MinAboveMax")):
        cond = next(c for c in kube.get(custom("inferenceservices", ns, name))["status"]["conditions"]
                    if c["type"] == "Invalid")
        assert cond["status"] == "True" and cond["reason"] == reason
        assert not replica_pods(kube, ns, name)
    assert replica_pods(kube, ns, "good")


def test_replicas_go_only_to_the_nodes_their_template_selects_and_whose_taints_they_tolerate(kube, ns, components):
    for n in ("gpu-a", "gpu-b", "gpu-c"):
        make_node(kube, n, 16)
    fresh(kube, "gpu-a", "gpu-b", "gpu-c")
    kube.merge_patch(nodes("gpu-b"), {"metadata": {"labels": {"serve": "yes"}}})
    kube.merge_patch(nodes("gpu-c"), {"metadata": {"labels": {"serve": "yes"}}, "spec": {"taints": [
        {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]}})
    tmpl = lambda **extra: {"spec": {"containers": [{"name": "serve", "image": "reamer/inference"}], **extra}}
    kube.create(custom("inferenceservices", ns), inference_service(
        "selected", rate=200.0, template=tmpl(nodeSelector={"serve": "yes"})))
    kube.create(custom("inferenceservices", ns), inference_service(
        "tolerant", rate=200.0, template=tmpl(tolerations=[{"key": "dedicated", "operator": "Exists"}], affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-c"]}]}]}}})))
    kube.create(custom("inferenceservices", ns), inference_service("odd", template=tmpl(nodeSelector=["serve"])))
    s = components("scheduler")
    s.round()
    on = lambda svc: {p["spec"]["nodeName"] for p in replica_pods(kube, ns, svc)}
    assert on("selected") == {"gpu-b"}  # gpu-c has the label, but a taint it does not tolerate
    assert on("tolerant") == {"gpu-c"}
    cond = next(c for c in kube.get(custom("inferenceservices", ns, "odd"))["status"]["conditions"]
                if c["type"] == "Invalid")
    assert cond["reason"] == "InvalidNodeConstraint" and "spec.template.spec.nodeSelector" in cond["message"]
    assert not replica_pods(kube, ns, "odd")
    # a decision for a node the service does not allow (a policy that ignores it) is refused
    s.inf.sync()
    s.backend.observe(time.time())
    s.backend.actuate([PlaceReplica("selected", "gpu-a", 2.0, 4, 0.01)], time.time())
    assert on("selected") == {"gpu-b"} and s.backend.counts["invalid_decisions"] == 1


def test_eviction_honours_a_pod_disruption_budget(kube, ns, components):
    make_node(kube, "gpu-a", 16)
    fresh(kube, "gpu-a")
    kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=20.0))
    s = components("scheduler")
    s.round()
    Kubelet(kube, ns).sync()
    [pod] = replica_pods(kube, ns, "vgg")
    pdbs = f"/apis/policy/v1beta1/namespaces/{ns}/poddisruptionbudgets"
    kube.create(pdbs, {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "vgg"},
                       "spec": {"minAvailable": 1, "selector": {"matchLabels": {"reamer.io/service": "vgg"}}}})
    s.inf.sync()
    s.backend.observe(time.time())
    rid = next(iter(s.backend.pod_of))
    s.backend.actuate([EvictReplica(rid)], time.time())
    assert s.backend.counts["evictions_refused"] == 1 and s.backend.counts["evictions"] == 0
    assert not ko.deleting(kube.get(pods(ns, ko.meta(pod)["name"])))
    kube.delete(f"{pdbs}/vgg")
    s.inf.sync()
    s.backend.observe(time.time())
    s.backend.actuate([EvictReplica(rid)], time.time())
    assert s.backend.counts["evictions"] == 1
    p = kube.get_or_none(pods(ns, ko.meta(pod)["name"]))
    assert p is None or ko.deleting(p)


def test_moves_are_rate_limited_per_round(kube, ns, components):
    make_node(kube, "gpu-a", 16)
    fresh(kube, "gpu-a")
    kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=60.0))
    s = components("scheduler")
    s.round()
    s.inf.sync()
    s.backend.observe(time.time())
    rids = list(s.backend.pod_of)
    assert len(rids) >= 2
    s.backend.max_moves = 1
    s.backend.actuate([EvictReplica(r) for r in rids], time.time())
    assert s.backend.counts["evictions"] == 1 and s.backend.counts["moves_deferred"] == len(rids) - 1


def test_one_process_joint_round_moves_inference_in_the_round_training_grows(kube, ns, components):
    """``reamer k8s controller --harvest reamer``: control.joint_round over both backends."""
    make_node(kube, "gpu-a", 16)
    fresh(kube, "gpu-a")
    kube.create(custom("trainingjobs", ns), training_job("grow", ps=1, workers=1, cpu="2"))
    ctl, sch = components("controller", policy="static"), components("scheduler")
    kubelet = Kubelet(kube, ns)
    ctl.round()
    kubelet.sync()
    kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=20.0))
    sch.round()
    kubelet.sync()
    [old] = replica_pods(kube, ns, "vgg")
    make_node(kube, "gpu-b", 16)
    fresh(kube, "gpu-a", "gpu-b")

    class Grow:  # a training policy that grows the worker once: the decision joint_round orders
        name, interval_s = "grow", 5.0

        def decide(self, snap):
            [job] = snap.running
            w = next(c for c in job.containers if c.role.value == "worker")
            return [Resize(w.id, Resources(13.0, 2048.0))] if w.res.cpu < 13 else []

    ctl.inf.sync()
    sch.inf.sync()
    rnd, hrnd = joint_round(ctl.backend, Grow(), sch.backend, sch.policy, time.time())
    assert [type(d).__name__ for d in rnd.decisions] == ["Resize"]
    assert [type(d).__name__ for d in hrnd.decisions] == ["MigrateReplica"]  # decided in the same round
    new = [p for p in replica_pods(kube, ns, "vgg") if ko.annotations(p).get(ko.REPLACES) == ko.meta(old)["name"]]
    assert new and new[0]["spec"]["nodeName"] == "gpu-b"
    [w] = [p for p in job_pods(kube, ns, "grow") if ko.labels(p)[ko.ROLE] == "worker"]
    assert ko.pod_cpu_limit(w) == 2.0  # training waits until the old replica is gone


def test_a_replica_that_cannot_start_is_said_and_a_failed_one_is_replaced(kube, ns, components):
    """A replica whose image does not pull sets ``ReplicasReady`` False with the kubelet's
    reason; one the kubelet rejected (phase Failed) is removed and another takes its place."""
    s, kubelet = serving(kube, ns, components, ("gpu-a",))
    s.round()

    def cond():
        st = kube.get(custom("inferenceservices", ns, "vgg"))["status"]
        c = next(x for x in st["conditions"] if x["type"] == "ReplicasReady")
        return c["status"], c["reason"], c["message"]

    assert cond()[:2] == ("True", "AllReady")
    first, *_ = replica_pods(kube, ns, "vgg")
    name = ko.meta(first)["name"]
    container_waiting(kube, ns, name, "serve", "ImagePullBackOff", "Back-off pulling image x")
    s.round()
    assert cond() == ("False", "ImagePullBackOff", f"pod {name} container serve: Back-off pulling image x")
    before = len(replica_pods(kube, ns, "vgg"))
    kube.merge_patch(pods(ns, name, "status"), {"status": {"phase": "Failed", "reason": "OutOfcpu"}})
    s.round()  # counted gone: replaced
    s.round()  # and removed
    live = [p for p in replica_pods(kube, ns, "vgg") if not ko.deleting(p)]
    assert name not in {ko.meta(p)["name"] for p in live} and len(live) == before
    assert s.backend.counts["replicas_failed"] >= 1


def test_an_edited_template_rolls_the_replicas_one_at_a_time(kube, ns, components):
    """A new image in the service's template: each replica is replaced make-before-break on its
    node, one at a time (the next once the first's successor is Ready), until all run it."""
    make_node(kube, "gpu-a", 32)
    fresh(kube, "gpu-a", cores=32.0)
    kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=20.0, minReplicas=2))
    s = components("scheduler")
    kubelet = Kubelet(kube, ns)
    for _ in range(2):
        s.round()
        kubelet.sync()
    first = {ko.meta(p)["name"] for p in replica_pods(kube, ns, "vgg")}
    assert len(first) == 2
    svc = kube.get(custom("inferenceservices", ns, "vgg"))
    svc["spec"]["template"]["spec"]["containers"][0]["image"] = "reamer/inference:fixed"
    kube.replace(custom("inferenceservices", ns, "vgg"), svc)
    s.round()
    moving = [p for p in replica_pods(kube, ns, "vgg") if ko.REPLACES in ko.annotations(p)]
    assert len(moving) == 1 and moving[0]["spec"]["nodeName"] == "gpu-a"
    assert moving[0]["spec"]["containers"][0]["image"] == "reamer/inference:fixed"
    s.round()  # the successor is not Ready yet: no second replacement
    assert len([p for p in replica_pods(kube, ns, "vgg") if ko.REPLACES in ko.annotations(p)]) == 1
    assert len(replica_pods(kube, ns, "vgg")) == 3
    for _ in range(6):
        kubelet.sync()
        s.round()
    kubelet.sync()
    live = [p for p in replica_pods(kube, ns, "vgg") if not ko.deleting(p)]
    assert len(live) == 2 and not first & {ko.meta(p)["name"] for p in live}
    assert {p["spec"]["containers"][0]["image"] for p in live} == {"reamer/inference:fixed"}
    assert s.backend.counts["rollouts"] == 2
    # an image that does not pull: its first successor is given up, and the rollout pauses there
    svc = kube.get(custom("inferenceservices", ns, "vgg"))
    svc["spec"]["template"]["spec"]["containers"][0]["image"] = "reamer/inference:typo"
    kube.replace(custom("inferenceservices", ns, "vgg"), svc)
    s.round()
    [bad] = [p for p in replica_pods(kube, ns, "vgg") if p["spec"]["containers"][0]["image"].endswith("typo")]
    container_waiting(kube, ns, ko.meta(bad)["name"], "serve", "ImagePullBackOff", "not found", phase="Pending")
    for _ in range(4):
        s.round()
        kubelet.sync()
    live = [p for p in replica_pods(kube, ns, "vgg") if not ko.deleting(p)]
    assert {p["spec"]["containers"][0]["image"] for p in live} == {"reamer/inference:fixed"} and len(live) == 2
    assert (s.backend.counts["rollouts"], s.backend.counts["moves_given_up"]) == (3, 1)


def test_a_service_created_again_under_its_name_does_not_adopt_the_old_ones_replicas(kube, ns, components):
    make_node(kube, "gpu-a", 32)
    fresh(kube, "gpu-a", cores=32.0)
    kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=20.0))
    s = components("scheduler")
    kubelet = Kubelet(kube, ns)
    s.round()
    kubelet.sync()
    old = {ko.meta(p)["name"] for p in replica_pods(kube, ns, "vgg")}
    assert old
    kube.delete(custom("inferenceservices", ns, "vgg"))
    uid = kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=20.0))["metadata"]["uid"]
    s.round()
    kubelet.sync()
    s.round()
    kubelet.sync()
    live = [p for p in replica_pods(kube, ns, "vgg") if not ko.deleting(p)]
    assert live and not old & {ko.meta(p)["name"] for p in live}
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in live} == {uid}
    assert kube.get(custom("inferenceservices", ns, "vgg"))["status"]["replicas"] == len(live)
