"""Optimus driven with hand-built snapshots (no backend): what it measures per configuration."""

from __future__ import annotations

from reamer.domain import (
    ClusterSnapshot,
    Container,
    ContainerTelemetry,
    JobState,
    JobTelemetry,
    JobView,
    Node,
    Resources,
    Role,
    TrainingJob,
)
from reamer.policies.optimus import Optimus

SPEC = TrainingJob("j", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024), max_workers=4)
NODES = (Node("n0", 32, 65536, nic_gbps=10),)


def _snap(now, cs, speed=None, periodic=True, queue=()):
    free = {"n0": NODES[0].capacity - sum((c.res for c in cs), Resources())}
    running = (JobView(SPEC, JobState.RUNNING, tuple(cs), 0.0, now, 0.0, None),) if cs else ()
    tel = {} if speed is None else {"j": JobTelemetry(
        now - 60, speed, {c.id: ContainerTelemetry(c.res.cpu / 2, c.res.cpu, 0.0, 1.0, 10) for c in cs})}
    return ClusterSnapshot(now, NODES, free, tuple(queue), running, tel, periodic=periodic)


def test_a_configuration_is_measured_from_the_slot_that_changed_it():
    """Speeds count toward the (PS, workers) configuration the job ran all interval: a resize
    keeps the configuration (its containers are new objects, their counts the same); a worker
    added at a slot starts a new one, measured from that slot on; rounds between slots change
    nothing."""
    ps = Container("j/ps0", "j", Role.PS, "n0", Resources(1, 1024))
    w0 = Container("j/worker0", "j", Role.WORKER, "n0", Resources(2, 1024))
    pol = Optimus()
    pol.decide(_snap(0.0, [ps, w0]))  # started: configuration (1, 1) from t = 0
    assert pol.decide(_snap(30.0, [ps, w0], periodic=False)) == []  # an event between slots
    pol.decide(_snap(60.0, [ps, w0], speed=100.0))
    st = pol.jobs["j"]
    assert st.config == (1, 1) and st.since == 0.0 and st.points[(1, 1)].n == 1
    bigger = Container("j/worker0", "j", Role.WORKER, "n0", Resources(3, 1024))
    pol.decide(_snap(120.0, [ps, bigger], speed=110.0))  # resized in place: still (1, 1)
    assert st.config == (1, 1) and st.since == 0.0 and st.points[(1, 1)].n == 2
    w1 = Container("j/worker1", "j", Role.WORKER, "n0", Resources(2, 1024))
    pol.decide(_snap(150.0, [ps, bigger, w1], periodic=False))  # not looked at between slots
    assert st.config == (1, 1)
    pol.decide(_snap(180.0, [ps, bigger, w1]))  # seen at the next slot: measured from the last one
    assert st.config == (1, 2) and st.since == 120.0 and (1, 2) not in st.points
    pol.decide(_snap(240.0, [ps, bigger, w1], speed=210.0))  # its interval began after the change
    assert st.points[(1, 2)].n == 1 and st.points[(1, 2)].mean == 210.0


def test_a_job_that_arrives_between_slots_waits_for_the_next():
    """Optimus allocates once per slot: a job queued between slots is started at the next."""
    view = JobView(SPEC, JobState.QUEUED, (), 0.0, 10.0, 0.0, None)
    pol = Optimus()
    assert pol.decide(_snap(10.0, [], periodic=False, queue=(view,))) == []
    out = pol.decide(_snap(60.0, [], queue=(view,)))
    assert [type(d).__name__ for d in out] == ["StartJob"]
