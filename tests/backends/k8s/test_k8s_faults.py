"""Tier A: what clusters do daily, against a real kube-apiserver 1.20.2 — a write that
conflicts while other jobs share the node, a cordoned node, a job deleted and created again
under the same name, a failed pod, a replica migrated again before its first move finished —
and the pure pieces those paths rely on (the resize patch's QoS rules, the reflector's
ordering of writes and late events, a p99 beyond the last histogram bucket)."""

from __future__ import annotations

import time

import pytest

from conftest import Kubelet, container_waiting, make_node, publish_slack
from test_k8s_controller import job_pods, training_job
from test_k8s_scheduler import fresh, inference_service, replica_pods, serving
from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.agent import summarize
from reamer.backends.k8s.kube import Reflector, custom, nodes, pods, services
from reamer.backends.k8s.training import qos_class, resize_patch
from reamer.domain import Resize, Resources
from reamer.domain.inference import MigrateReplica


def test_a_conflict_on_one_job_leaves_its_pods_and_the_others_converge(kube, ns, controller):
    make_node(kube, "node-a", 32)
    for name in ("a", "b"):
        kube.create(custom("trainingjobs", ns), training_job(name, ps=1, workers=1))
    c = controller(policy="static")
    c.round()
    Kubelet(kube, ns).sync()
    c.inf.sync()
    c.backend.observe(time.time())
    wa = next(cid for cid in c.backend.view.state.owner if cid.startswith("a/worker"))
    wb = next(cid for cid in c.backend.view.state.owner if cid.startswith("b/worker"))
    kube.merge_patch(custom("trainingjobs", ns, "a"), {"metadata": {"labels": {"edited": "yes"}}})  # a new version
    c.backend.actuate([Resize(wa, Resources(3.0, 2048.0)), Resize(wb, Resources(3.0, 2048.0))], time.time())
    assert c.backend.counts["conflicts"] == 1
    assert len(job_pods(kube, ns, "a")) == 2, "the conflicting job's pods were taken for orphans"
    assert kube.get(custom("trainingjobs", ns, "b"))["status"]["epoch"] == 2  # b went on (1.20: restart at 3 cores)


def test_a_cordoned_node_keeps_its_job_and_takes_no_new_one(kube, ns, controller):
    make_node(kube, "node-a", 16)
    kube.create(custom("trainingjobs", ns), training_job("stay", ps=1, workers=1))
    c = controller(policy="static")
    c.round()
    kube.merge_patch(nodes("node-a"), {"spec": {"unschedulable": True}})
    kube.create(custom("trainingjobs", ns), training_job("new", ps=1, workers=1))
    c.round()
    assert len(job_pods(kube, ns, "stay")) == 2 and kube.get(custom("trainingjobs", ns, "stay"))["status"][
        "phase"] == "Running"
    assert not job_pods(kube, ns, "new") and kube.get(custom("trainingjobs", ns, "new"))["status"]["phase"] == "Queued"


def test_a_drained_node_is_left_empty_and_its_job_starts_elsewhere(kube, ns, controller):
    """``kubectl drain``: the node is cordoned, then its pods are evicted. An evicted pod is not
    re-created on the cordoned node (the drain would never end): its job is queued again, its
    other pods there go, and it starts on a node that takes pods."""
    c, kubelet = _running(kube, ns, controller, "drained", workers=1, cores=16)
    make_node(kube, "node-b", 16)
    kube.merge_patch(nodes("node-a"), {"spec": {"unschedulable": True}})
    c.round()  # cordoned only: the job keeps running where it is
    assert {p["spec"]["nodeName"] for p in job_pods(kube, ns, "drained")} == {"node-a"}
    w = next(p for p in job_pods(kube, ns, "drained") if ko.labels(p)[ko.ROLE] == "worker")
    kube.delete(pods(ns, ko.meta(w)["name"]), grace_s=0)  # the eviction
    for _ in range(3):
        c.round()
        kubelet.sync()
    live = job_pods(kube, ns, "drained")
    assert len(live) == 2 and {p["spec"]["nodeName"] for p in live} == {"node-b"}
    st = kube.get(custom("trainingjobs", ns, "drained"))["status"]
    assert st["phase"] == "Running" and st["epoch"] == 2


def test_a_pod_evicted_from_a_node_under_pressure_is_not_recreated_there(kube, ns, controller):
    """The kubelet evicts a pod under memory pressure (Failed, reason Evicted) and the node is
    tainted so that no new pod goes there: the job starts again on another node, not on it."""
    c, kubelet = _running(kube, ns, controller, "pressed", workers=1, cores=16)
    make_node(kube, "node-b", 16)
    kube.merge_patch(nodes("node-a"), {"spec": {"taints": [
        {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}]}})
    w = next(p for p in job_pods(kube, ns, "pressed") if ko.labels(p)[ko.ROLE] == "worker")
    kube.merge_patch(pods(ns, ko.meta(w)["name"], "status"), {"status": {"phase": "Failed", "reason": "Evicted"}})
    for _ in range(3):
        c.round()
        kubelet.sync()
    live = [p for p in job_pods(kube, ns, "pressed") if not ko.terminated(p)]
    assert len(live) == 2 and {p["spec"]["nodeName"] for p in live} == {"node-b"}


def test_a_node_label_that_is_not_a_number_does_not_stop_the_rounds(kube, ns, controller):
    """``reamer.io/nic-gbps=25G`` is a valid label value: that node gets the default NIC (and a
    warning), and the controller still places jobs."""
    make_node(kube, "node-a", 16)
    kube.merge_patch(nodes("node-a"), {"metadata": {"labels": {"reamer.io/nic-gbps": "25G"}}})
    kube.create(custom("trainingjobs", ns), training_job("runs", ps=1, workers=1))
    c = controller(policy="static")
    c.round()
    assert len(job_pods(kube, ns, "runs")) == 2
    assert kube.get(custom("trainingjobs", ns, "runs"))["status"]["phase"] == "Running"


def test_a_node_that_is_not_ready_takes_no_new_job(kube, ns, controller):
    """Its kubelet stopped reporting (Ready Unknown): like a cordoned node, what runs there stays
    booked and nothing new is placed there."""
    make_node(kube, "node-a", 16)
    kube.create(custom("trainingjobs", ns), training_job("stay", ps=1, workers=1))
    c = controller(policy="static")
    c.round()
    kube.merge_patch(nodes("node-a", "status"), {"status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}})
    kube.create(custom("trainingjobs", ns), training_job("new", ps=1, workers=1))
    for _ in range(20):  # until the controller's node cache holds the condition
        c.round()
        if kube.get(custom("trainingjobs", ns, "new")).get("status", {}).get("phase") == "Queued":
            break
        time.sleep(0.1)
    assert len(job_pods(kube, ns, "stay")) == 2 and not job_pods(kube, ns, "new")
    assert kube.get(custom("trainingjobs", ns, "new"))["status"]["phase"] == "Queued"


def test_a_job_being_deleted_gets_no_pods_again(kube, ns, controller):
    """A finalizer (or a foreground deletion) holds a deleted TrainingJob while its pods go: the
    controller does not start them again, and their room goes to the next job."""
    make_node(kube, "node-a", 4)
    kube.create(custom("trainingjobs", ns), training_job("going", ps=1, workers=1))
    c = controller(policy="static")
    c.round()
    assert len(job_pods(kube, ns, "going")) == 2
    kube.merge_patch(custom("trainingjobs", ns, "going"), {"metadata": {"finalizers": ["example.com/hold"]}})
    try:
        kube.delete(custom("trainingjobs", ns, "going"))
        kube.create(custom("trainingjobs", ns), training_job("next", ps=1, workers=1))
        for p in job_pods(kube, ns, "going"):  # as the garbage collector would
            kube.delete(pods(ns, ko.meta(p)["name"]), grace_s=0)
        for _ in range(20):
            c.round()
            if len(job_pods(kube, ns, "next")) == 2:
                break
            time.sleep(0.1)
        assert not job_pods(kube, ns, "going") and len(job_pods(kube, ns, "next")) == 2
    finally:
        kube.merge_patch(custom("trainingjobs", ns, "going"), {"metadata": {"finalizers": None}})


def test_a_job_created_again_under_the_same_name_starts_afresh(kube, ns, controller):
    make_node(kube, "node-a", 32)
    tj = training_job("again", ps=1, workers=1)
    tj["spec"]["samples"] = 100
    first = kube.create(custom("trainingjobs", ns), tj)
    c = controller(policy="static")
    c.round()
    Kubelet(kube, ns).sync()
    w = next(p for p in job_pods(kube, ns, "again") if ko.labels(p)[ko.ROLE] == "worker")
    publish_slack(kube, "node-a", reported_at=time.time(), cores=32, pods_=[
        {"namespace": ns, "name": ko.meta(w)["name"], "uid": ko.meta(w)["uid"],
         "metrics": {"reamer_train_samples_total": 500.0}}])
    c.round()
    assert kube.get(custom("trainingjobs", ns, "again"))["status"]["phase"] == "Succeeded"
    kube.delete(custom("trainingjobs", ns, "again"))  # no garbage collector runs for the test's pods:
    second = kube.create(custom("trainingjobs", ns), tj)  # the old pods, if any, are not the new job's
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    c.round()
    st = kube.get(custom("trainingjobs", ns, "again"))["status"]
    assert st["phase"] == "Running" and st.get("samplesDone", 0.0) == 0.0
    for p in job_pods(kube, ns, "again"):
        assert p["metadata"]["ownerReferences"][0]["uid"] == second["metadata"]["uid"]
    # while the first job's headless Service is still there (the garbage collector, where one
    # runs, removes it in its own time) it is not taken for the new job's; once it goes, the
    # new job gets its own
    svc = lambda: kube.get(services(ns, "again"))["metadata"]["ownerReferences"][0]["uid"]  # noqa: E731
    if svc() == first["metadata"]["uid"]:
        kube.delete(services(ns, "again"))  # as the garbage collector would
    for _ in range(20):  # the rounds after it (the controller's caches catch up with its own writes)
        c.round()
        if kube.get_or_none(services(ns, "again")) is not None:
            break
        time.sleep(0.1)
    assert svc() == second["metadata"]["uid"]
    st = kube.get(custom("trainingjobs", ns, "again"))["status"]  # the first job's report is not the second's
    assert st["phase"] == "Running" and st.get("samplesDone", 0.0) == 0.0


def _running(kube, ns, controller, job: str, workers: int, cores: float):
    """A job of one PS and ``workers`` workers started by a ``static`` controller on node-a
    (``cores``), its pods Ready; the controller and the stand-in kubelet."""
    make_node(kube, "node-a", cores)
    kube.create(custom("trainingjobs", ns), training_job(job, ps=1, workers=workers))
    c = controller(policy="static")
    c.round()
    kubelet = Kubelet(kube, ns)
    kubelet.sync()
    return c, kubelet


def test_a_failed_pod_restarts_the_job_from_its_checkpoint(kube, ns, controller):
    c, kubelet = _running(kube, ns, controller, "crash", workers=2, cores=32)
    w = next(p for p in job_pods(kube, ns, "crash") if ko.labels(p)[ko.ROLE] == "worker")
    kube.merge_patch(pods(ns, ko.meta(w)["name"], "status"), {"status": {"phase": "Failed", "reason": "OutOfcpu"}})
    c.round()
    assert kube.get(custom("trainingjobs", ns, "crash"))["status"]["epoch"] == 2
    for _ in range(2):
        kubelet.sync()
        c.round()
    live = job_pods(kube, ns, "crash")
    assert len(live) == 3 and {ko.labels(p)[ko.EPOCH] for p in live} == {"2"}


def _fail(kube, ns, job, reason=None):
    """A worker pod Failed: for ``reason`` (the kubelet's), or (None) its container exited in error
    under ``restartPolicy: Never``, where a pod has no reason of its own."""
    w = next(p for p in job_pods(kube, ns, job) if ko.labels(p)[ko.ROLE] == "worker")
    kube.merge_patch(pods(ns, ko.meta(w)["name"], "status"), {"status": {"phase": "Failed", "reason": reason}})


def _condition(kube, ns, job, type_):
    st = kube.get(custom("trainingjobs", ns, job))["status"]
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), None)


def test_a_job_failing_more_than_its_backoff_limit_fails_and_gives_its_nodes_back(kube, ns, controller):
    """Each failed pod is counted as it is replaced, but for the platform's failures (an
    eviction, a kubelet admission refusal); past ``spec.backoffLimit`` the job is Failed, its
    running pods go (the failed one stays, for its logs), and its cores are free for the next
    job."""
    make_node(kube, "node-a", 8)
    kube.create(custom("trainingjobs", ns), training_job("flaky", ps=1, workers=2, cpu="2", backoffLimit=1))
    c = controller(policy="static")
    c.round()
    kubelet = Kubelet(kube, ns)
    kubelet.sync()
    for epoch, (reason, failures) in enumerate((("Evicted", 0), ("OutOfmemory", 0), (None, 1), (None, 2)), 2):
        _fail(kube, ns, "flaky", reason)
        c.round()
        st = kube.get(custom("trainingjobs", ns, "flaky"))["status"]
        assert (st["phase"], st.get("failures", 0), st["epoch"]) == ("Running", failures, epoch)
        for _ in range(2):
            kubelet.sync()
            c.round()
    st = kube.get(custom("trainingjobs", ns, "flaky"))["status"]
    assert st["phase"] == "Failed", st
    cond = _condition(kube, ns, "flaky", "Failed")
    assert cond["status"] == "True" and cond["reason"] == "BackoffLimitExceeded"
    assert "2 failed pods" in cond["message"] and "spec.backoffLimit 1" in cond["message"]
    kubelet.sync()
    c.round()
    assert [p for p in job_pods(kube, ns, "flaky") if not ko.terminated(p)] == []
    kube.create(custom("trainingjobs", ns), training_job("next", ps=1, workers=2, cpu="2"))
    c.round()
    assert len(job_pods(kube, ns, "next")) == 3  # the whole node was free again


def test_an_edited_template_reaches_the_pods(kube, ns, controller):
    """A new image in the worker template (the fix of a pod that cannot pull its image): the job
    restarts from its checkpoint in a new epoch, every pod from the templates as they are now."""
    c, kubelet = _running(kube, ns, controller, "edit", workers=2, cores=32)
    c.round()
    assert kube.get(custom("trainingjobs", ns, "edit"))["status"]["epoch"] == 1
    tj = kube.get(custom("trainingjobs", ns, "edit"))
    tj["spec"]["worker"]["template"]["spec"]["containers"][0]["image"] = "reamer/ps-training:fixed"
    kube.replace(custom("trainingjobs", ns, "edit"), tj)
    for _ in range(3):
        c.round()
        kubelet.sync()
    live = job_pods(kube, ns, "edit")
    assert {ko.labels(p)[ko.EPOCH] for p in live} == {"2"} and len(live) == 3
    images = {ko.labels(p)[ko.ROLE]: p["spec"]["containers"][0]["image"] for p in live}
    assert images == {"ps": "reamer/ps-training", "worker": "reamer/ps-training:fixed"}
    c.round()
    assert kube.get(custom("trainingjobs", ns, "edit"))["status"]["epoch"] == 2  # and it stays there


@pytest.mark.parametrize("fallback", ["RestartJob", "RecreatePod"])
def test_a_pod_deleted_by_hand_is_replaced_by_the_jobs_fallback(kube, ns, controller, fallback):
    """``kubectl delete pod`` on a worker: a PS job's cluster spec is fixed, so by default the whole
    job restarts from its checkpoint in a new epoch (not the one pod alone, whose PS shards would be
    at another step); with RecreatePod that pod alone comes back under a new name."""
    make_node(kube, "node-a", 32)
    kube.create(custom("trainingjobs", ns), training_job("gone", ps=1, workers=2, resizeFallback=fallback))
    c = controller(policy="static")
    kubelet = Kubelet(kube, ns)
    for _ in range(2):
        c.round()
        kubelet.sync()
    assert kube.get(custom("trainingjobs", ns, "gone"))["status"]["createdEpoch"] == 1
    w = next(p for p in job_pods(kube, ns, "gone") if ko.labels(p)[ko.ROLE] == "worker")
    kube.delete(pods(ns, ko.meta(w)["name"]), grace_s=0)
    for _ in range(3):
        c.round()
        kubelet.sync()
    st = kube.get(custom("trainingjobs", ns, "gone"))["status"]
    live = sorted(ko.meta(p)["name"] for p in job_pods(kube, ns, "gone"))
    assert live == sorted(x["pod"] for x in st["containers"]) and len(live) == 3
    if fallback == "RestartJob":
        assert st["epoch"] == 2 and all(n.endswith("-e2") for n in live)
    else:
        assert st["epoch"] == 1 and f"{ko.meta(w)['name']}-r1" in live
    assert st.get("failures", 0) == 0  # someone's deletion is not the job's failure


def test_a_deleted_headless_service_comes_back_with_the_next_pods(kube, ns, controller):
    c, kubelet = _running(kube, ns, controller, "dns", workers=1, cores=32)
    kube.delete(services(ns, "dns"))
    _fail(kube, ns, "dns")  # the job restarts in a new epoch: its new pods need ps0.dns to resolve
    for _ in range(3):
        c.round()
        kubelet.sync()
    assert {ko.labels(p)[ko.EPOCH] for p in job_pods(kube, ns, "dns")} == {"2"}
    svc = kube.get(services(ns, "dns"))
    assert svc["metadata"]["ownerReferences"][0]["name"] == "dns"


def test_a_full_service_quota_does_not_stop_a_restarted_controller(kube, ns, controller):
    """The namespace's Service quota is used up (the job's own Service among them): a restarted
    controller's create of that Service is refused (403: the quota is checked before the name),
    and it still replaces the job's failed pod."""
    c, kubelet = _running(kube, ns, controller, "quota", workers=1, cores=32)
    _quota(kube, ns, {"services": "1"})
    c.stop()
    c = controller(policy="static")  # a restart: it does not know the Service is there
    _fail(kube, ns, "quota")
    c.round()
    assert kube.get(custom("trainingjobs", ns, "quota"))["status"]["epoch"] == 2


def test_a_crash_looping_or_unpullable_pod_is_said_and_a_crash_loop_counts_against_the_limit(kube, ns, controller):
    c, kubelet = _running(kube, ns, controller, "loop", workers=1, cores=32)
    c.round()
    cond = _condition(kube, ns, "loop", "PodsReady")
    assert (cond["status"], cond["reason"]) == ("True", "Running")
    ps, w = sorted(job_pods(kube, ns, "loop"), key=lambda p: ko.labels(p)[ko.ROLE])

    def container(pod, restarts, waiting):
        container_waiting(kube, ns, ko.meta(pod)["name"], "train", waiting, f"the kubelet says {waiting}", restarts,
                          {"exitCode": 137, "reason": "OOMKilled"} if restarts else None)

    container(ps, 0, "ImagePullBackOff")
    c.round()
    cond = _condition(kube, ns, "loop", "PodsReady")
    assert (cond["status"], cond["reason"]) == ("False", "ImagePullBackOff")
    assert f"pod {ko.meta(ps)['name']} container train: the kubelet says ImagePullBackOff" == cond["message"]
    assert kube.get(custom("trainingjobs", ns, "loop"))["status"]["phase"] == "Running"
    container(ps, 0, "ContainerCreating")  # pulled at last; the worker now crash-loops, within the limit
    container(w, 6, "CrashLoopBackOff")
    c.round()
    cond = _condition(kube, ns, "loop", "PodsReady")
    assert (cond["status"], cond["reason"]) == ("False", "CrashLoopBackOff")
    assert kube.get(custom("trainingjobs", ns, "loop"))["status"]["phase"] == "Running"
    container(w, 7, "CrashLoopBackOff")  # one restart more than the default backoffLimit (6)
    c.round()
    assert kube.get(custom("trainingjobs", ns, "loop"))["status"]["phase"] == "Failed"
    msg = _condition(kube, ns, "loop", "Failed")["message"]
    assert "7 container restarts" in msg and "OOMKilled (exit code 137)" in msg, msg


def _quota(kube, ns, hard, name="quota"):
    """A ResourceQuota, once the quota controller has counted what it covers."""
    kube.create(f"/api/v1/namespaces/{ns}/resourcequotas", {"metadata": {"name": name}, "spec": {"hard": hard}})
    deadline = time.time() + 30
    while set((kube.get(f"/api/v1/namespaces/{ns}/resourcequotas/{name}").get("status") or {}).get("used") or {}) \
            != set(hard):
        assert time.time() < deadline, "the quota controller never counted the quota"
        time.sleep(0.2)


def test_a_pod_the_api_server_refuses_is_said_on_the_job(kube, ns, controller):
    """A ResourceQuota of one pod: the gang's other pods are refused (403); the job says so and
    the pods are created once the quota allows them."""
    _quota(kube, ns, {"pods": "1"}, "one-pod")
    make_node(kube, "node-a", 32)
    kube.create(custom("trainingjobs", ns), training_job("quota", ps=1, workers=2))
    c = controller(policy="static")
    c.round()
    assert len(job_pods(kube, ns, "quota")) == 1
    cond = _condition(kube, ns, "quota", "PodsReady")
    assert (cond["status"], cond["reason"]) == ("False", "CreateRefused") and "exceeded quota" in cond["message"]
    kube.delete(f"/api/v1/namespaces/{ns}/resourcequotas/one-pod")
    c.round()
    assert len(job_pods(kube, ns, "quota")) == 3


def test_a_move_whose_new_replica_cannot_start_is_given_up(kube, ns, components):
    """The new replica of a migration does not pull its image: the move is given up (the new pod
    removed), and the old replica, still serving, counts again."""
    s, kubelet = serving(kube, ns, components, ("gpu-a", "gpu-b"))
    [a] = replica_pods(kube, ns, "vgg")
    to = "gpu-b" if a["spec"]["nodeName"] == "gpu-a" else "gpu-a"
    s.inf.sync()
    s.backend.observe(time.time())
    [rid] = s.backend.pod_of
    s.backend.actuate([MigrateReplica(rid, to)], time.time())
    [b] = [p for p in replica_pods(kube, ns, "vgg") if ko.meta(p)["name"] != ko.meta(a)["name"]]

    def waiting(reason):
        container_waiting(kube, ns, ko.meta(b)["name"], "serve", reason, "pull access denied", phase="Pending")

    waiting("ErrImagePull")  # a first failed pull may clear by itself: the move goes on
    s.inf.sync()
    snap = s.backend.observe(time.time())
    assert [r.node for r in snap.services[0].replicas] == [to]
    s.backend.converge(time.time())
    assert s.backend.counts["moves_given_up"] == 0
    waiting("ImagePullBackOff")
    s.inf.sync()
    snap = s.backend.observe(time.time())
    assert [r.node for r in snap.services[0].replicas] == [a["spec"]["nodeName"]]  # the old one counts again
    s.backend.converge(time.time())
    kubelet.sync()
    live = [p for p in replica_pods(kube, ns, "vgg") if not ko.deleting(p)]
    assert [ko.meta(p)["name"] for p in live] == [ko.meta(a)["name"]]
    assert s.backend.counts["moves_given_up"] == 1


def test_a_replica_moved_again_before_its_first_move_finished_does_not_come_back(kube, ns, components):
    for n in ("gpu-b", "gpu-c"):
        make_node(kube, n, 16)
    s, kubelet = serving(kube, ns, components, ("gpu-a",))
    [a] = replica_pods(kube, ns, "vgg")
    fresh(kube, "gpu-a", "gpu-b", "gpu-c")
    for to in ("gpu-b", "gpu-c"):  # A → B, then B → C while B is not yet Ready
        s.inf.sync()
        s.backend.observe(time.time())
        [rid] = s.backend.pod_of
        s.backend.actuate([MigrateReplica(rid, to)], time.time())
    kubelet.sync()  # C is Ready (and B)
    s.inf.sync()
    s.backend.converge(time.time())
    kubelet.sync()
    live = [p for p in replica_pods(kube, ns, "vgg") if not ko.deleting(p)]
    assert [p["spec"]["nodeName"] for p in live] == ["gpu-c"], [ko.meta(p)["name"] for p in live]
    assert kube.get_or_none(pods(ns, ko.meta(a)["name"])) is None


# ----------------------------------------------------------------------------- pure pieces


def _pod(*containers, qos=None):
    return {"spec": {"containers": list(containers)}, "status": {"qosClass": qos} if qos else {}}


def _ctr(name, req=None, lim=None):
    return {"name": name, "resources": {k: v for k, v in (("requests", req), ("limits", lim)) if v}}


@pytest.mark.parametrize("pod,cores,want_req", [
    (_pod(_ctr("t", {"cpu": "2", "memory": "1Gi"}, {"cpu": "2", "memory": "1Gi"})), 5.0, "5000m"),  # Guaranteed
    (_pod(_ctr("t", {"cpu": "2", "memory": "1Gi"}, {"cpu": "4", "memory": "1Gi"})), 1.0, "999m"),  # below request
    (_pod(_ctr("t", {"cpu": "2", "memory": "1Gi"}, {"cpu": "4", "memory": "2Gi"})), 1.0, "1000m"),  # memory differs
    (_pod(_ctr("t", {"cpu": "2", "memory": "1Gi"}, {"cpu": "4", "memory": "1Gi"})), 2.0, "1999m"),  # would guarantee
    (_pod(_ctr("t", {"cpu": "2", "memory": "1Gi"}, {"cpu": "4", "memory": "1Gi"}),
          _ctr("side", {"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})), 2.0, "1999m"),
    (_pod(_ctr("t", {"cpu": "2"}), _ctr("side")), 1.0, "1000m"),  # a request without a limit
])
def test_resize_patch_keeps_the_qos_class(pod, cores, want_req):
    before = qos_class(pod["spec"]["containers"])
    patch = resize_patch(pod, cores)
    assert patch["resources"]["requests"]["cpu"] == want_req
    after = [dict(c) for c in pod["spec"]["containers"]]
    after[0] = {**after[0], "resources": patch["resources"]}
    assert qos_class(after) == before
    r = patch["resources"]
    assert ko.quantity(r["requests"]["cpu"], "") <= ko.quantity(r["limits"]["cpu"], "")


class _NoKube:
    pass


def test_a_late_watch_event_does_not_undo_our_own_write():
    r = Reflector(_NoKube(), "/x")
    ours = {"metadata": {"namespace": "n", "name": "o", "resourceVersion": "12"}, "v": "new"}
    late = {"metadata": {"namespace": "n", "name": "o", "resourceVersion": "11"}, "v": "old"}
    r.put(ours)
    r._event("MODIFIED", late)
    assert r.get("n/o")["v"] == "new"
    r._event("MODIFIED", {**late, "metadata": {**late["metadata"], "resourceVersion": "13"}})
    assert r.get("n/o")["v"] == "old"


def test_a_watch_that_ends_at_once_is_not_reopened_in_a_tight_loop():
    """A proxy that closes every watch stream cleanly and at once: the reflector waits its
    back-off before the next watch instead of sending requests as fast as they return."""
    import threading

    class Closing:
        def __init__(self):
            self.watches = 0

        def list(self, path, label_selector=None):
            return [], "1"

        def watch(self, path, rv, timeout_s, selector):
            self.watches += 1
            return iter(())

    kube = Closing()
    r = Reflector(kube, "/x", backoff_s=0.1).start()
    try:
        threading.Event().wait(0.5)
    finally:
        r.stop()
    assert 1 <= kube.watches <= 8  # about one per back-off, not thousands


def test_a_p99_beyond_the_last_bucket_is_published_as_a_miss():
    def fam(inf):
        return {"reamer_x": {"type": "histogram", "samples": [
            ("reamer_x_bucket", {"le": "0.1"}, 0.0), ("reamer_x_bucket", {"le": "1.0"}, 0.0),
            ("reamer_x_bucket", {"le": "+Inf"}, inf)]}}
    out = summarize(fam(10.0), fam(0.0), 1.0)
    assert out["reamer_x:p99"] == 1.0 and out["reamer_x:p99_beyond_buckets"] == 1.0
