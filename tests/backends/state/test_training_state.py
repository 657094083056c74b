"""The shared cluster state: the one place that books and validates training decisions, and
what every backend gets back from it (typed effects)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reamer.backends.local.cluster import LocalCluster, LocalNode
from reamer.backends.sim import SimCluster
from reamer.backends.state import ClusterState, Growth, Launch, Reshape, SetQuota, Stop
from reamer.domain import (
    AddContainer,
    Container,
    JobState,
    Node,
    Preempt,
    RemoveContainer,
    Resize,
    Resources,
    Role,
    StartJob,
    TrainingJob,
)
from reamer.domain.decisions import InvalidDecision, Placement
from reamer.models.profiles import shipped_profiles

NODES = (Node("a", 8, 8192), Node("b", 8, 8192))
SPEC = TrainingJob("j", "resnet50", 0.0, 1e5, 1, 1, Resources(1, 512), Resources(2, 512))
START = StartJob("j", (Placement(Role.PS, "a", Resources(1, 512)), Placement(Role.WORKER, "b", Resources(2, 512))))


def _state() -> ClusterState:
    st = ClusterState(NODES)
    st.submit(SPEC, 0.0)
    return st


def test_start_books_the_gang_and_returns_what_to_launch():
    st = _state()
    e = st.apply(START, 5.0)
    assert isinstance(e, Launch) and [c.id for c in e.containers] == ["j/ps0", "j/worker1"]
    assert st.free["a"] == Resources(7, 7680) and st.free["b"] == Resources(6, 7680)
    j = st.jobs["j"]
    assert (j.state, j.queue_s, j.started_s, j.last_change_s) == (JobState.RUNNING, 5.0, 5.0, 5.0)
    assert "j" in st.running and "j" not in st.queue
    assert [c.id for c in st.containers_on("b")] == ["j/worker1"] and st.requested_cpu(e.containers[1]) == 2
    assert st.cpu_alloc == 3


def test_resize_add_remove_and_ids_are_never_reused():
    st = _state()
    st.apply(START, 0.0)
    e = st.apply(Resize("j/worker1", Resources(4, 512)), 10.0)
    assert isinstance(e, SetQuota) and e.before == Resources(2, 512) and e.container.res.cpu == 4
    add = st.apply(AddContainer("j", Placement(Role.PS, "b", Resources(1, 512))), 20.0)
    assert isinstance(add, Reshape) and [c.id for c in add.added] == ["j/ps2"]
    rm = st.apply(RemoveContainer("j/ps0"), 30.0)
    assert isinstance(rm, Reshape) and [c.id for c in rm.removed] == ["j/ps0"]
    again = st.apply(AddContainer("j", Placement(Role.PS, "a", Resources(1, 512))), 40.0)
    assert again.added[0].id == "j/ps3"
    assert st.jobs["j"].reconfigs == 4 and st.jobs["j"].last_change_s == 40.0


def test_preempt_requeues_behind_the_queue_and_finish_releases():
    st = _state()
    st.submit(TrainingJob("k", "resnet50", 1.0, 1e5, 1, 1, Resources(1, 512), Resources(1, 512)), 1.0)
    st.apply(START, 0.0)
    stop = st.apply(Preempt("j"), 50.0)
    assert isinstance(stop, Stop) and stop.requeued and len(stop.containers) == 2
    assert list(st.queue) == ["k", "j"] and st.free == {n.name: n.capacity for n in NODES}
    st.apply(START, 60.0)
    assert st.jobs["j"].queue_s == 60.0 - 50.0 and st.jobs["j"].started_s == 0.0
    done = st.finish("j", 100.0)
    assert not done.requeued and st.jobs["j"].state is JobState.DONE and st.jobs["j"].finished_s == 100.0
    assert st.owner == {} and st.cpu_alloc == 0


BAD = {
    "does not fit": StartJob("j", (Placement(Role.PS, "a", Resources(1, 512)),
                                   Placement(Role.WORKER, "a", Resources(8, 512)))),
    "no CPU": StartJob("j", (Placement(Role.PS, "a", Resources(0, 512)), Placement(Role.WORKER, "b", Resources(2, 512)))),
    "no worker": StartJob("j", (Placement(Role.PS, "a", Resources(1, 512)),)),
    "unknown node": StartJob("j", (Placement(Role.PS, "x", Resources(1, 512)),
                                   Placement(Role.WORKER, "b", Resources(2, 512)))),
    "not queued": Preempt("nope"),
}
RUNNING_BAD = {
    "last PS": RemoveContainer("j/ps0"),
    "resize to 0": Resize("j/worker1", Resources(0, 512)),
    "resize too big": Resize("j/worker1", Resources(9, 512)),
    "add with no CPU": AddContainer("j", Placement(Role.WORKER, "a", Resources(0, 512))),
    "unknown container": Resize("j/worker9", Resources(1, 512)),
}


def _sim() -> SimCluster:
    return SimCluster(NODES, shipped_profiles().calibration, np.random.default_rng(0), lambda *a: None)


def _local(tmp_path: Path) -> LocalCluster:
    # invalid decisions are refused by the shared state before anything is started: no
    # cgroups, testbed or processes are touched (hence the stand-ins)
    c = LocalCluster([LocalNode(n, i) for i, n in enumerate(NODES)], [], executor=object(), testbed=object(),
                     workdir=tmp_path)
    c.state.submit(SPEC, 0.0)
    return c


@pytest.mark.parametrize("backend", ["sim", "local"])
@pytest.mark.parametrize("why", list(BAD) + list(RUNNING_BAD))
def test_every_backend_refuses_the_same_decisions_and_keeps_its_state(backend, why, tmp_path):
    b = _sim() if backend == "sim" else _local(tmp_path)
    if backend == "sim":
        b.arrive(SPEC, 0.0)
    if why in RUNNING_BAD:
        b.state.apply(START, 0.0)  # booked only: nothing runs, the decision below is refused first
    before = (dict(b.state.free), list(b.state.queue), list(b.state.running),
              {k: dict(v.containers) for k, v in b.state.jobs.items()})
    with pytest.raises(InvalidDecision):
        b.actuate([BAD.get(why) or RUNNING_BAD[why]], 1.0)
    after = (dict(b.state.free), list(b.state.queue), list(b.state.running),
             {k: dict(v.containers) for k, v in b.state.jobs.items()})
    assert after == before


def test_a_job_that_is_one_pod_is_refused_a_second_node():
    st = ClusterState(NODES)
    st.submit(TrainingJob("p", "resnet50", 0.0, 1e5, 1, 1, Resources(1, 512), Resources(2, 512), one_node=True), 0.0)
    with pytest.raises(InvalidDecision, match="one-node job placed on 2 nodes"):
        st.apply(StartJob("p", START.placements), 0.0)
    st.apply(StartJob("p", (Placement(Role.PS, "a", Resources(1, 512)), Placement(Role.WORKER, "a", Resources(2, 512)))),
             0.0)
    with pytest.raises(InvalidDecision, match="stay on a, not b"):
        st.apply(AddContainer("p", Placement(Role.WORKER, "b", Resources(2, 512))), 1.0)
    assert [c.node for c in st.apply(AddContainer("p", Placement(Role.WORKER, "a", Resources(2, 512))), 1.0).added] == ["a"]


def test_a_container_is_refused_a_node_its_job_does_not_allow_its_role_but_restored_there():
    pinned = TrainingJob("p", "resnet50", 0.0, 1e5, 1, 1, Resources(1, 512), Resources(2, 512),
                         ps_nodes=frozenset({"a"}), worker_nodes=frozenset({"a"}))
    st = ClusterState(NODES)
    st.submit(pinned, 0.0)
    before = dict(st.free)
    with pytest.raises(InvalidDecision, match="job p: a worker may not run on b \\(its nodes: a\\)"):
        st.apply(StartJob("p", START.placements), 0.0)
    assert st.free == before and "p" in st.queue
    on_a = (Placement(Role.PS, "a", Resources(1, 512)), Placement(Role.WORKER, "a", Resources(2, 512)))
    st.apply(StartJob("p", on_a), 0.0)
    with pytest.raises(InvalidDecision, match="may not run on b"):
        st.apply(AddContainer("p", Placement(Role.WORKER, "b", Resources(2, 512))), 1.0)
    # a controller rebuilding its state books what runs, even where the job no longer allows it
    # (a node's labels changed since: Kubernetes' IgnoredDuringExecution)
    again = ClusterState(NODES)
    again.restore(pinned, [Container("p/ps0", "p", Role.PS, "b", Resources(1, 512)),
                           Container("p/worker1", "p", Role.WORKER, "b", Resources(2, 512))], next_id=2, queued_since=0)
    assert "p" in again.running


def test_growth_is_what_decisions_are_about_to_take():
    st = _state()
    st.submit(TrainingJob("k", "resnet50", 0.0, 1e5, 1, 1, Resources(0.5, 256), Resources(1, 256)), 0.0)
    st.apply(START, 0.0)
    grow = st.growth([Resize("j/worker1", Resources(3, 512)), Resize("j/ps0", Resources(0.5, 512)),
                      AddContainer("j", Placement(Role.WORKER, "a", Resources(3, 512))),
                      StartJob("k", (Placement(Role.WORKER, "b", Resources(1, 256)),))])
    # limits grow by what is added (a shrink frees nothing until it happened); requests by
    # the user's request of each new container's role, whatever its placement's size
    assert grow == {"b": Growth(2.0, 1.0, 256.0), "a": Growth(3.0, 2.0, 512.0)}


def test_a_snapshots_free_capacity_is_the_states_as_it_was():
    """``snap.free`` reads the snapshot's own rows: the state's free capacity by node, in node
    order, as of the snapshot, whatever is booked later."""
    st = _state()
    st.apply(START, 0.0)
    st.apply(Resize("j/worker1", Resources(3.5, 700)), 1.0)
    snap = st.snapshot(1.0, (), (), {})
    assert list(snap.free) == ["a", "b"] and dict(snap.free) == st.free and snap.free.get("z") is None
    want = dict(st.free)
    st.apply(Resize("j/worker1", Resources(1, 512)), 2.0)
    assert dict(snap.free) == want != st.free and snap.free["b"] == Resources(4.5, 7492)
    assert snap.free_rows.tolist() == [[7, 7680, 0], [4.5, 7492, 0]]
