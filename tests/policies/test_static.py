from hypothesis import given, settings
from hypothesis import strategies as st

from reamer.backends.state import ClusterState
from reamer.domain import (
    ClusterSnapshot,
    JobState,
    JobView,
    Node,
    Preempt,
    Resources,
    StartJob,
    TrainingJob,
)
from reamer.policies.placement import FreeMap
from reamer.policies.static import Static, StaticConfig, request_of, shape_of


def job(jid, cores, workers=1):
    return TrainingJob(jid, "resnet50", 0.0, 1e4, 1, workers, Resources(1, 1024), Resources(cores, 1024))


def snap(free_cores, *jobs):
    nodes = tuple(Node(f"n{i}", 8, 8192) for i in range(len(free_cores)))
    free = {n.name: Resources(c, 8192) for n, c in zip(nodes, free_cores)}
    return ClusterSnapshot(0.0, nodes, free, tuple(JobView(j, JobState.QUEUED) for j in jobs), ())


def test_gang_starts_whole_request():
    (d,) = Static().decide(snap([8, 8], job("a", 4, workers=3)))
    assert isinstance(d, StartJob) and len(d.placements) == 4
    assert sum(p.res.cpu for p in d.placements) == 13


def test_job_that_does_not_fit_waits_and_backfill_starts_later_jobs():
    s = snap([4], job("big", 8), job("small", 1))
    assert [d.job for d in Static().decide(s)] == ["small"]
    assert Static(StaticConfig(backfill=False)).decide(s) == []


def test_two_jobs_never_overcommit_a_node():
    out = Static().decide(snap([5], job("a", 3), job("b", 3)))
    assert [d.job for d in out] == ["a"]


def _scan(snapshot, backfill=True):
    """The plain FIFO scan the grouped queue must reproduce: every queued job in order, a
    request skipped once it did not fit."""
    free, failed, out = FreeMap(snapshot), set(), []
    for v in snapshot.queue:
        if shape_of(v.spec) in failed:
            continue
        placed = free.place_gang(request_of(v.spec), "spread")
        if placed is None:
            failed.add(shape_of(v.spec))
            if not backfill:
                break
            continue
        out.append(StartJob(v.id, placed))
    return out


@settings(max_examples=60, deadline=None)
@given(rounds=st.lists(st.tuples(st.lists(st.tuples(st.sampled_from([1.0, 2.0, 3.0, 6.0]), st.integers(1, 3),
                                                    st.sampled_from([0.0, 1.0])), max_size=6),
                                 st.integers(0, 3), st.booleans()), min_size=1, max_size=12),
       backfill=st.booleans())
def test_grouped_queue_decides_as_a_scan_of_the_whole_queue(rounds, backfill):
    state = ClusterState([Node(f"n{i}", 8, 8192, 2) for i in range(3)])
    policy, n = Static(StaticConfig(backfill=backfill)), 0
    for t, (arrivals, finish, preempt) in enumerate(rounds):
        for cores, workers, gpu in arrivals:
            n += 1
            state.submit(TrainingJob(f"j{n}", "resnet50", t, 1e4, 1, workers, Resources(1, 512),
                                     Resources(cores, 1024, gpu)), t)
        for jid in list(state.running)[:finish]:  # some finish, one may be preempted (requeued)
            state.finish(jid, t)
        if preempt and state.running:
            state.apply(Preempt(next(iter(state.running))), t)
        snap = state.snapshot(t, [state.jobs[j].view(0.0, t) for j in state.queue],
                              [state.jobs[j].view(0.0, t) for j in state.running], {})
        want = _scan(snap, backfill)
        got = policy.decide(snap)
        assert got == want
        for d in got:
            state.apply(d, t)


def test_a_job_that_is_one_pod_starts_on_one_node_or_waits():
    """``one_node``: PS and workers go to one node that fits them together; spread over two
    nodes the same request would fit, on one it waits."""
    pod = TrainingJob("p", "resnet50", 0.0, 1e4, 1, 2, Resources(1, 1024), Resources(3, 1024), one_node=True)
    (d,) = Static().decide(snap([5, 8], pod))
    assert {p.node for p in d.placements} == {"n1"} and len(d.placements) == 3
    assert Static().decide(snap([5, 5], pod)) == []
    spread = TrainingJob("s", "resnet50", 0.0, 1e4, 1, 2, Resources(1, 1024), Resources(3, 1024))
    (d,) = Static().decide(snap([5, 5], pod, spread))  # the same request as several pods does fit
    assert d.job == "s" and len({p.node for p in d.placements}) == 2
