"""The shared replica state: booking and validation of harvesting decisions, the rate forecast,
and what a harvesting policy sees of a training node (once for every backend)."""

from __future__ import annotations

import pytest

from reamer.backends.state import ClusterState, MoveReplica, ReplicaState, ServiceRecord, SetReplicaQuota, StartReplica
from reamer.backends.state import StopReplica
from reamer.domain import Node, Resize, Resources, Role, StartJob, TrainingJob
from reamer.domain.decisions import InvalidDecision, Placement
from reamer.domain.inference import EvictReplica, MigrateReplica, PlaceReplica, ResizeReplica

NODES = (Node("g", 16, 65536, gpus=1), Node("pool-0", 8, 32768, pool="inference"))


def _state() -> ReplicaState:
    training = ClusterState(NODES[:1])
    training.submit(TrainingJob("j", "resnet50", 0, 1e5, 1, 1, Resources(1, 512), Resources(2, 1024)), 0.0)
    training.apply(StartJob("j", (Placement(Role.PS, "g", Resources(1, 512)),
                                  Placement(Role.WORKER, "g", Resources(4, 1024)))), 0.0)
    return ReplicaState(training, [ServiceRecord("s", "resnet50", 0.3, 2048.0)], NODES)


def test_place_resize_migrate_evict_book_and_return_effects():
    st = _state()
    e = st.apply(PlaceReplica("s", "g", 2.0, 4, 0.0))
    assert isinstance(e, StartReplica) and e.replica.id == "s/r0" and st.cores_on() == {"g": 2.0}
    assert isinstance(st.apply(ResizeReplica("s/r0", 3.0)), SetReplicaQuota)
    m = st.apply(MigrateReplica("s/r0", "pool-0"))
    assert isinstance(m, MoveReplica) and (m.old.id, m.new.id, m.new.node, m.new.cores) == ("s/r0", "s/r1", "pool-0", 3.0)
    assert list(st.services["s"].replicas) == ["s/r1"]  # make-before-break: a new replica, as a new pod
    assert isinstance(st.apply(EvictReplica("s/r1")), StopReplica) and st.cores_on() == {}


@pytest.mark.parametrize("bad", [PlaceReplica("nope", "g", 1.0, 1, 0.0), PlaceReplica("s", "x", 1.0, 1, 0.0),
                                 PlaceReplica("s", "g", 0.0, 1, 0.0), ResizeReplica("s/r0", 0.0),
                                 ResizeReplica("s/r9", 1.0), MigrateReplica("s/r0", "x"), EvictReplica("s/r9")])
def test_invalid_decisions_are_refused_and_change_nothing(bad):
    st = _state()
    st.apply(PlaceReplica("s", "g", 2.0, 4, 0.0))
    before = dict(st.services["s"].replicas), dict(st.owner)
    with pytest.raises(InvalidDecision):
        st.apply(bad)
    assert (dict(st.services["s"].replicas), dict(st.owner)) == before


def test_a_replica_is_refused_a_node_its_service_does_not_allow_and_the_snapshot_says_which():
    st = _state()
    st.services["s"].nodes = frozenset({"pool-0"})
    with pytest.raises(InvalidDecision, match="service s: a replica may not run on g \\(its nodes: pool-0\\)"):
        st.apply(PlaceReplica("s", "g", 2.0, 4, 0.0))
    assert st.services["s"].replicas == {}
    st.services["s"].nodes = None
    st.apply(PlaceReplica("s", "g", 2.0, 4, 0.0))  # placed before the pin: it stays (IgnoredDuringExecution)
    st.services["s"].nodes = frozenset({"g"})
    with pytest.raises(InvalidDecision, match="may not run on pool-0"):
        st.apply(MigrateReplica("s/r0", "pool-0"))
    assert st.snapshot(0.0, {}, {"s": 1.0}).services[0].nodes == {"g"}


def test_forecast_follows_the_trend_never_below_the_last_window():
    s = ServiceRecord("s", "m", 0.1, 1.0)
    assert s.forecast(7.0) == 7.0  # nothing measured yet
    s.observed_rates += [10.0]
    assert s.forecast(7.0) == 10.0
    s.observed_rates += [14.0]
    assert s.forecast(7.0) == 18.0
    s.observed_rates += [12.0]
    assert s.forecast(7.0) == 12.0


def test_node_usage_adds_what_training_is_about_to_take_for_one_round():
    st = _state()
    g = NODES[0]
    u = st.node_usage(g, 1.0, reserve=2.0, need=3.5, used=3.0)
    assert (u.training_need, u.training_limit, u.training_request, u.training_used) == (3.5, 5.0, 3.0, 3.0)
    st.expect([Resize("j/worker1", Resources(10, 1024))])
    u = st.node_usage(g, 2.0, reserve=2.0, need=None, used=3.0)  # need None: the limits
    assert (u.training_need, u.training_limit, u.training_request) == (11.0, 11.0, 3.0)
    assert st.node_usage(g, 3.0, reserve=2.0, need=None, used=3.0).training_limit == 5.0


def test_undo_gives_back_what_a_backend_could_not_carry_out():
    st = _state()
    st.apply(PlaceReplica("s", "g", 2.0, 4, 0.0))
    before = dict(st.services["s"].replicas), dict(st.owner)
    st.undo(st.apply(MigrateReplica("s/r0", "pool-0")))  # the new replica never listened
    assert (dict(st.services["s"].replicas), dict(st.owner)) == before
    st.undo(st.apply(PlaceReplica("s", "g", 1.0, 1, 0.0)))
    assert (dict(st.services["s"].replicas), dict(st.owner)) == before
