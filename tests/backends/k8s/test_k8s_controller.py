"""Tier A: the TrainingJob controller (NEARCHUS) against a real kube-apiserver 1.20.2."""

from __future__ import annotations

import time

import pytest
from conftest import Kubelet, make_node, publish_slack

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.kube import ApiError, custom, nodes, pods, services
from reamer.domain import RemoveContainer, Resize, Resources


def training_job(name: str, ps: int = 1, workers: int = 2, cpu: str = "2", **spec) -> dict:
    role = lambda n: {"replicas": n, "resources": {"cpu": cpu, "memory": "2Gi"},
                      "template": {"metadata": {"labels": {"team": "vision"}},
                                   "spec": {"containers": [{"name": "train", "image": "reamer/ps-training"}]}}}
    return {"apiVersion": "reamer.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"model": "resnet50", "samples": 1e6, "ps": role(ps), "worker": role(workers), **spec}}


def job_pods(kube, ns, job):
    return [p for p in kube.list(pods(ns), label_selector=f"reamer.io/job={job}")[0] if not ko.deleting(p)]


def test_trainingjob_gets_pods_of_requested_shape(kube, ns, controller):
    make_node(kube, "node-a", 32)
    kube.create(custom("trainingjobs", ns), training_job("cifar", ps=1, workers=2, cpu="3"))
    c = controller()
    rnd = c.round()
    assert [type(d).__name__ for d in rnd.decisions] == ["StartJob"]
    ps = job_pods(kube, ns, "cifar")
    roles = sorted(ko.labels(p)[ko.ROLE] for p in ps)
    assert roles == ["ps", "worker", "worker"]
    tj = kube.get(custom("trainingjobs", ns, "cifar"))
    for p in ps:
        main = p["spec"]["containers"][0]
        assert main["resources"]["requests"]["cpu"] == "3" or ko.quantity(main["resources"]["requests"]["cpu"], "") == 3
        assert ko.pod_cpu_limit(p) == 3.0
        assert p["spec"]["nodeName"] == "node-a"
        assert p["metadata"]["ownerReferences"][0]["uid"] == tj["metadata"]["uid"]
        assert p["metadata"]["labels"]["team"] == "vision"
        env = {e["name"]: e["value"] for e in main["env"]}
        assert env["REAMER_PS_HOSTS"] == "ps0.cifar:7000" and env["REAMER_WORKER_HOSTS"].count(",") == 1
    st = tj["status"]
    assert (st["phase"], st["ps"], st["workers"], st["cores"], st["epoch"]) == ("Running", 1, 2, 9.0, 1)
    assert kube.get(services(ns, "cifar"))["spec"]["clusterIP"] == "None"
    c.round()  # idempotent: nothing new, nothing duplicated
    assert len(job_pods(kube, ns, "cifar")) == 3


def test_pods_of_other_namespaces_hold_what_they_request(kube, ns, controller):
    """Another team's pod (and another Reamer install's, labelled like Reamer's own) on a node
    holds its requests there, as kube-scheduler counts them (init containers, overhead): the
    gang goes where the rest fits, and a job that fits nowhere waits."""
    other = f"{ns}-other"
    kube.create("/api/v1/namespaces", {"metadata": {"name": other}})
    make_node(kube, "node-a", 16)
    make_node(kube, "node-b", 16)

    def bound(name, node, cpu, init_cpu=None, labels=None):
        spec = {"nodeName": node, "containers": [{"name": "c", "image": "x",
                                                  "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
        if init_cpu:
            spec["initContainers"] = [{"name": "i", "image": "x", "resources": {"requests": {"cpu": init_cpu}}}]
        kube.create(pods(other), {"metadata": {"name": name, "labels": labels or {}}, "spec": spec})

    bound("theirs", "node-a", "2", init_cpu="12")  # holds 12 cores: its init container's
    bound("another-install", "node-b", "10", labels={"reamer.io/job": "cifar"})
    kube.create(custom("trainingjobs", ns), training_job("cifar", ps=1, workers=2, cpu="3"))
    c = controller()
    c.round()
    where = sorted(p["spec"]["nodeName"] for p in job_pods(kube, ns, "cifar"))
    assert where == ["node-a", "node-b", "node-b"]  # 4 cores free on node-a, 6 on node-b: the one way 3 × 3 fit
    kube.create(custom("trainingjobs", ns), training_job("big", ps=1, workers=1, cpu="5"))
    c.round()
    assert job_pods(kube, ns, "big") == []
    assert kube.get(custom("trainingjobs", ns, "big"))["status"]["phase"] == "Queued"
    kube.delete(pods(other, "theirs"), grace_s=0)
    c.inf.sync()
    c.round()
    assert sorted(p["spec"]["nodeName"] for p in job_pods(kube, ns, "big")) == ["node-a", "node-a"]


def test_the_memory_inference_replicas_request_is_not_placed_on(kube, ns, controller):
    """Inference moves for training's cores, not its memory: a node whose replica holds most of
    its memory gets no gang that would not fit beside it (the kubelet would refuse it)."""
    make_node(kube, "node-a", 32, mem_gi=64)
    make_node(kube, "node-b", 32, mem_gi=64)
    kube.create(pods(ns), {"metadata": {"name": "vgg-r0", "labels": {ko.SERVICE: "vgg"},
                                        "annotations": {ko.CORES: "1.0"}},
                           "spec": {"nodeName": "node-a", "containers": [{"name": "serve", "image": "x", "resources": {
                               "requests": {"cpu": "1", "memory": "63Gi"}}}]}})
    kube.create(custom("trainingjobs", ns), training_job("cifar", ps=1, workers=2, cpu="2"))
    controller(policy="static").round()
    assert {p["spec"]["nodeName"] for p in job_pods(kube, ns, "cifar")} == {"node-b"}


def _report(kube, ns, node, job, t, *, ps_net, worker_net, samples, rate, cpu_used=1.0):
    entries = []
    for p in job_pods(kube, ns, job):
        if p["spec"]["nodeName"] != node:
            continue
        role = ko.labels(p)[ko.ROLE]
        e = {"namespace": ns, "name": p["metadata"]["name"], "cpuUsed": cpu_used, "cpuLimit": ko.pod_cpu_limit(p),
             "throttledRatio": 0.0, "netGbps": ps_net if role == "ps" else worker_net, "netCapacityGbps": 10.0}
        if role == "worker":
            e["metrics"] = {"reamer_train_samples_total": samples, "reamer_train_samples_total:rate": rate}
        entries.append(e)
    publish_slack(kube, node, reported_at=t, window_s=0.04, pods_=entries, cores=32)


def test_network_bound_job_gets_a_ps(kube, ns, controller):
    for n in ("node-a", "node-b"):
        make_node(kube, n, 32)
    kube.create(custom("trainingjobs", ns), training_job("netjob", ps=1, workers=2, cpu="2"))
    c = controller()
    kubelet = Kubelet(kube, ns)
    c.round()
    kubelet.sync()
    added = None
    for i in range(6):
        time.sleep(0.05)
        t = time.time()
        for n in ("node-a", "node-b"):
            _report(kube, ns, n, "netjob", t, ps_net=9.5, worker_net=2.0, samples=1000.0 * (i + 1), rate=100.0)
        rnd = c.round()
        added = next((d for d in rnd.decisions if type(d).__name__ == "AddContainer"), None)
        if added:
            break
    assert added is not None and added.placement.role.value == "ps", "NEARCHUS did not add a PS"
    st = kube.get(custom("trainingjobs", ns, "netjob"))["status"]
    assert st["ps"] == 2 and st["epoch"] == 2
    assert st["diagnosis"]["bottleneck"] == "network" and st["diagnosis"]["evidence"]["netUtil"] >= 0.9
    # the old epoch goes first (its pods checkpoint); the new shape's pods come once they are gone
    assert {ko.labels(p)[ko.EPOCH] for p in job_pods(kube, ns, "netjob")} <= {"1"}
    kubelet.sync()
    c.round()
    new = job_pods(kube, ns, "netjob")
    assert sorted(ko.labels(p)[ko.ROLE] for p in new) == ["ps", "ps", "worker", "worker"]
    assert {ko.labels(p)[ko.EPOCH] for p in new} == {"2"}
    env = {e["name"]: e["value"] for e in new[0]["spec"]["containers"][0]["env"]}
    assert env["REAMER_PS_HOSTS"].count(",") == 1


@pytest.mark.parametrize("fallback", ["RestartJob", "RecreatePod"])
def test_resize_falls_back_to_recreate_on_1_20(kube, ns, controller, fallback):
    make_node(kube, "node-a", 32)
    kube.create(custom("trainingjobs", ns), training_job("grow", ps=1, workers=1, cpu="2", resizeFallback=fallback))
    c = controller(policy="static")
    c.round()
    Kubelet(kube, ns).sync()
    c.inf.sync()
    c.backend.observe(time.time())
    worker = next(cid for cid in c.backend.view.state.owner if "/worker" in cid)
    c.backend.actuate([Resize(worker, Resources(5.0, 2048.0))], time.time())
    st = kube.get(custom("trainingjobs", ns, "grow"))["status"]
    rec = next(x for x in st["containers"] if x["role"] == "worker")
    assert c.backend.counts["recreates"] == 1 and c.backend.counts["resizes"] == 0  # 1.20: no pods/resize
    if fallback == "RestartJob":  # the whole job restarts from its checkpoint in a new epoch
        assert st["epoch"] == 2 and all(x["pod"].endswith("-e2") for x in st["containers"])
    else:  # only that pod, under a new name
        assert st["epoch"] == 1 and rec["pod"].endswith("-e1-r1")
    assert rec["cpu"] == 5.0
    for _ in range(2):
        Kubelet(kube, ns).sync()
        c.round()
    live = job_pods(kube, ns, "grow")
    assert sorted(ko.meta(p)["name"] for p in live) == sorted(x["pod"] for x in st["containers"])
    [w] = [p for p in live if ko.labels(p)[ko.ROLE] == "worker"]
    assert ko.pod_cpu_limit(w) == 5.0


def test_schema_violations_are_rejected_by_the_api_server(kube, ns):
    bad = training_job("bad")
    bad["spec"]["worker"]["replicas"] = 0
    bad["spec"]["samples"] = -5
    with pytest.raises(ApiError) as e:
        kube.create(custom("trainingjobs", ns), bad)
    assert e.value.status == 422
    assert "spec.worker.replicas" in e.value.message and "spec.samples" in e.value.message


def test_semantically_invalid_jobs_get_a_condition_and_the_controller_keeps_running(kube, ns, controller):
    make_node(kube, "node-a", 32)
    minmax = training_job("minmax")
    minmax["spec"]["ps"].update(min=3, max=2)
    unknown = training_job("unknown")
    unknown["spec"]["model"] = "alexnet-9000"
    dotted = training_job("bert.v2")  # a valid custom-resource name, but no Service name
    half = training_job("half")
    half["spec"]["worker"]["resources"]["nvidia.com/gpu"] = 0.5  # a pod would ask (and hold) a whole one
    for tj in (minmax, unknown, dotted, half, training_job("fine")):
        kube.create(custom("trainingjobs", ns), tj)
    c = controller()
    c.round()
    for name, reason, field in (("minmax", "MinAboveMax", "spec.ps"), ("unknown", "UnknownModel", "spec.model"),
                                ("bert.v2", "InvalidName", "metadata.name"),
                                ("half", "InvalidResources", "spec.worker.resources.nvidia.com/gpu")):
        st = kube.get(custom("trainingjobs", ns, name))["status"]
        cond = next(x for x in st["conditions"] if x["type"] == "Invalid")
        assert st["phase"] == "Invalid" and cond["reason"] == reason and field in cond["message"]
    assert kube.get(custom("trainingjobs", ns, "fine"))["status"]["phase"] == "Running"
    assert not job_pods(kube, ns, "minmax") and not job_pods(kube, ns, "unknown") and not job_pods(kube, ns, "bert.v2")


def test_progress_is_banked_from_the_workers_counters_and_the_job_completes(kube, ns, controller):
    make_node(kube, "node-a", 32)
    tj = training_job("short", ps=1, workers=2, cpu="2")
    tj["spec"]["samples"] = 1000
    kube.create(custom("trainingjobs", ns), tj)
    c = controller(policy="static")
    c.round()
    Kubelet(kube, ns).sync()
    pods_ = job_pods(kube, ns, "short")

    def report(t, totals):  # totals: each worker's reamer_train_samples_total, in pod order (None: no scrape)
        workers = iter(totals)
        entries = [{"namespace": ns, "name": ko.meta(p)["name"], "cpuUsed": 1.0, "netGbps": 0.1,
                    "netCapacityGbps": 10.0, **({"metrics": {"reamer_train_samples_total": total,
                                                             "reamer_train_samples_total:rate": 100.0}}
                                               if ko.labels(p)[ko.ROLE] == "worker"
                                               and (total := next(workers)) is not None else {})} for p in pods_]
        publish_slack(kube, "node-a", reported_at=t, window_s=2.0, pods_=entries, cores=32)

    done = lambda: kube.get(custom("trainingjobs", ns, "short"))["status"]  # noqa: E731
    t = time.time()
    report(t, [100, 150])
    c.round()
    c.round()  # the same report is banked once
    assert done()["samplesDone"] == pytest.approx(250.0)
    report(t + 1, [200, 300])  # never seen by the controller (its round came later) ...
    report(t + 2, [300, 400])  # ... yet nothing of it is lost: banking reads the counters
    c.round()
    assert done()["samplesDone"] == pytest.approx(700.0) and done()["phase"] == "Running"
    report(t + 2.5, [None, 450])  # the first worker's scrape failed: its last counter stands
    c.round()
    assert done()["samplesDone"] == pytest.approx(750.0)
    assert done()["counters"] == {ko.meta(p)["name"]: v for p, v in zip(
        [p for p in pods_ if ko.labels(p)[ko.ROLE] == "worker"], (300.0, 450.0), strict=True)}
    report(t + 3, [50, 500])  # the first worker restarted: its counter began again at 0
    c.round()
    st = done()
    assert st["samplesDone"] == pytest.approx(850.0) and st["phase"] == "Running"
    report(t + 4, [150, 600])
    c.round()
    st = done()
    assert st["phase"] == "Succeeded" and st["samplesDone"] == pytest.approx(1050.0)
    assert not job_pods(kube, ns, "short")


def test_a_queued_job_says_why_it_waits(kube, ns, controller):
    make_node(kube, "node-a", 8)
    kube.create(custom("trainingjobs", ns), training_job("huge", ps=1, workers=4, cpu="4"))
    c = controller(policy="static")
    c.round()
    st = kube.get(custom("trainingjobs", ns, "huge"))["status"]
    cond = next(x for x in st["conditions"] if x["type"] == "Scheduled")
    assert st["phase"] == "Queued" and cond["status"] == "False" and cond["reason"] == "WaitingForResources"
    assert "needs 20 cores" in cond["message"] and "8 cores" in cond["message"]
    assert not job_pods(kube, ns, "huge")


def _constrained(name, workers, worker_spec, ps_spec=None, cpu="2"):
    tj = training_job(name, ps=1, workers=workers, cpu=cpu)
    tj["spec"]["worker"]["template"]["spec"].update(worker_spec)
    tj["spec"]["ps"]["template"]["spec"].update(ps_spec or {})
    return tj


def test_pods_go_only_to_the_nodes_their_template_selects_and_whose_taints_they_tolerate(kube, ns, controller):
    make_node(kube, "node-big", 64)  # spread alone would put every pod here
    for n in ("node-b", "node-c"):
        make_node(kube, n, 16)
    kube.merge_patch(nodes("node-b"), {"metadata": {"labels": {"team": "vision"}}})
    kube.merge_patch(nodes("node-c"), {"metadata": {"labels": {"team": "vision"}},
                                       "spec": {"taints": [{"key": "dedicated", "value": "infer",
                                                            "effect": "NoSchedule"}]}})
    kube.create(custom("trainingjobs", ns), _constrained("pinned", 2, {"nodeSelector": {"team": "vision"}}))
    by_name = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-c"]}]}]}}
    kube.create(custom("trainingjobs", ns), _constrained(
        "tolerant", 1, {"affinity": {"nodeAffinity": by_name},
                        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}))
    kube.create(custom("trainingjobs", ns), _constrained("untolerated", 1, {"affinity": {"nodeAffinity": by_name}}))
    c = controller(policy="static")
    c.round()
    where = lambda job: sorted((ko.labels(p)[ko.ROLE], p["spec"]["nodeName"]) for p in job_pods(kube, ns, job))
    # the PS template has no constraint: it goes where spread puts it; workers only to node-b
    # (node-c has the team label but a taint they do not tolerate)
    assert where("pinned") == [("ps", "node-big"), ("worker", "node-b"), ("worker", "node-b")]
    assert where("tolerant") == [("ps", "node-big"), ("worker", "node-c")]
    assert where("untolerated") == []
    st = kube.get(custom("trainingjobs", ns, "untolerated"))["status"]
    cond = next(x for x in st["conditions"] if x["type"] == "Scheduled")
    assert (st["phase"], cond["reason"]) == ("Queued", "NoMatchingNode")
    assert cond["message"].startswith("no node matches spec.worker.template")
    # the pod template is kept as written (a kubelet that checks the node selector admits it)
    pinned = next(p for p in job_pods(kube, ns, "pinned") if ko.labels(p)[ko.ROLE] == "worker")
    assert pinned["spec"]["nodeSelector"] == {"team": "vision"}


def test_a_noexecute_taint_moves_a_job_off_its_node_and_a_noschedule_one_does_not(kube, ns, controller):
    """A NoExecute taint evicts the pods that do not tolerate it (Kubernetes' taint manager):
    the job starts again elsewhere rather than having its pods re-created there."""
    make_node(kube, "node-x", 32)
    kube.create(custom("trainingjobs", ns), training_job("moved", ps=1, workers=1))
    c = controller(policy="static")
    c.round()
    Kubelet(kube, ns).sync()
    assert {p["spec"]["nodeName"] for p in job_pods(kube, ns, "moved")} == {"node-x"}
    make_node(kube, "node-y", 32)
    kube.merge_patch(nodes("node-x"), {"spec": {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}})
    c.round()
    assert {p["spec"]["nodeName"] for p in job_pods(kube, ns, "moved")} == {"node-x"}  # it stays
    kube.merge_patch(nodes("node-x"), {"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}})
    for _ in range(3):  # queued again (its pods deleted), then placed on node-y
        c.round()
        Kubelet(kube, ns).sync()
    assert {p["spec"]["nodeName"] for p in job_pods(kube, ns, "moved")} == {"node-y"}
    assert kube.get(custom("trainingjobs", ns, "moved"))["status"]["phase"] == "Running"


def test_a_job_queued_again_says_its_pods_are_gone(kube, ns, controller):
    make_node(kube, "node-x", 32)
    kube.create(custom("trainingjobs", ns), training_job("waits", ps=1, workers=1))
    c = controller(policy="static")
    c.round()
    Kubelet(kube, ns).sync()
    c.round()
    cond = lambda: next(x for x in kube.get(custom("trainingjobs", ns, "waits"))["status"]["conditions"]
                        if x["type"] == "PodsReady")
    assert (cond()["status"], cond()["reason"]) == ("True", "Running")
    kube.merge_patch(nodes("node-x"), {"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}})
    c.round()  # no other node: it waits
    assert kube.get(custom("trainingjobs", ns, "waits"))["status"]["phase"] == "Queued"
    assert (cond()["status"], cond()["reason"]) == ("False", "Queued")


def test_a_queued_pinned_job_is_measured_against_the_nodes_it_may_use(kube, ns, controller):
    make_node(kube, "node-big", 64)
    make_node(kube, "node-small", 4)
    kube.merge_patch(nodes("node-small"), {"metadata": {"labels": {"size": "small"}}})
    kube.create(custom("trainingjobs", ns), _constrained("wide", 2, {"nodeSelector": {"size": "small"}}, cpu="3"))
    c = controller(policy="static")
    c.round()
    assert not job_pods(kube, ns, "wide")
    cond = next(x for x in kube.get(custom("trainingjobs", ns, "wide"))["status"]["conditions"]
                if x["type"] == "Scheduled")
    assert cond["reason"] == "WaitingForResources"
    assert cond["message"].endswith("the freest node its workers may use has 4 cores, 0 GPUs free")


def test_a_node_constraint_kubernetes_would_refuse_makes_the_job_invalid(kube, ns, controller):
    make_node(kube, "node-a", 32)
    bad = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "team", "operator": "Near", "values": ["vision"]}]}]}}
    kube.create(custom("trainingjobs", ns), _constrained("odd", 1, {"affinity": {"nodeAffinity": bad}}))
    kube.create(custom("trainingjobs", ns), training_job("fine", ps=1, workers=1))
    c = controller()
    c.round()
    st = kube.get(custom("trainingjobs", ns, "odd"))["status"]
    cond = next(x for x in st["conditions"] if x["type"] == "Invalid")
    assert (st["phase"], cond["reason"]) == ("Invalid", "InvalidNodeConstraint")
    assert "spec.worker.template.spec.affinity.nodeAffinity" in cond["message"] and "'Near'" in cond["message"]
    assert not job_pods(kube, ns, "odd") and len(job_pods(kube, ns, "fine")) == 2


def test_a_conflicting_write_drops_the_decision_and_the_next_round_redecides(kube, ns, controller):
    make_node(kube, "node-a", 32)
    kube.create(custom("trainingjobs", ns), training_job("race", ps=1, workers=1))
    c = controller(policy="static")
    c.inf.sync()
    snap = c.backend.observe(time.time())
    decisions = c.policy.decide(snap)
    # someone else writes the job between our read and our write (a new resourceVersion)
    kube.merge_patch(custom("trainingjobs", ns, "race"), {"metadata": {"labels": {"edited": "yes"}}})
    c.backend.actuate(decisions, time.time())
    assert c.backend.counts["conflicts"] == 1 and not job_pods(kube, ns, "race")
    c.round()
    assert len(job_pods(kube, ns, "race")) == 2
    assert kube.get(custom("trainingjobs", ns, "race"))["status"]["phase"] == "Running"


def test_a_job_keeps_its_spec_minimum(kube, ns, controller):
    make_node(kube, "node-a", 32)
    tj = training_job("floor", ps=2, workers=2)
    tj["spec"]["ps"]["min"] = 2
    kube.create(custom("trainingjobs", ns), tj)
    c = controller(policy="static")
    c.round()
    c.inf.sync()
    c.backend.observe(time.time())
    ps = [cid for cid in c.backend.view.state.owner if "/ps" in cid]
    c.backend.actuate([RemoveContainer(ps[0])], time.time())
    assert c.backend.counts["invalid_decisions"] == 1
    assert kube.get(custom("trainingjobs", ns, "floor"))["status"]["ps"] == 2
