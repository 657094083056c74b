from hypothesis import given, settings
from hypothesis import strategies as st

from reamer.domain import JobState, JobView, Resources, TrainingJob
from reamer.policies.queue import RequestGroups


def _job(n: int, cores: float) -> TrainingJob:
    return TrainingJob(f"j{n}", "resnet50", 0.0, 1e4, 1, 1, Resources(1, 512), Resources(cores, 1024))


def _key(spec: TrainingJob) -> float:
    return spec.worker_res.cpu


def _plain(queue, misses):
    """The scan the groups must reproduce: every queued job in order, a key skipped once missed."""
    out, missed = [], set()
    for v in queue:
        if _key(v.spec) in missed:
            continue
        out.append(v.id)
        if v.id in misses:
            missed.add(_key(v.spec))
    return out


@settings(max_examples=80, deadline=None)
@given(rounds=st.lists(st.tuples(st.lists(st.sampled_from([1.0, 2.0, 3.0]), max_size=6),  # arrivals (cores)
                                 st.sets(st.integers(0, 40), max_size=6),  # jobs that miss this round
                                 st.integers(0, 3),  # jobs yielded that leave the queue (started)
                                 st.booleans()),  # one of them comes back (requeued at the tail)
                       min_size=1, max_size=12))
def test_a_scan_yields_what_a_scan_of_the_whole_queue_would(rounds):
    groups, queue, n, enq, nodes = RequestGroups(_key), [], 0, 0, object()
    for arrivals, misses, leave, back in rounds:
        for cores in arrivals:
            n += 1
            enq += 1
            queue.append(JobView(_job(n, cores), JobState.QUEUED, order=enq))
        miss_ids = {f"j{i}" for i in misses}
        got = []
        for key, v in groups.scan(tuple(queue), nodes):
            got.append(v.id)
            assert key == _key(v.spec)
            if v.id in miss_ids:
                groups.miss(key)
        assert got == _plain(queue, miss_ids)
        started = [v for v in queue if v.id in got[:leave]]
        queue = [v for v in queue if v not in started]
        if back and started:
            enq += 1
            queue.append(started[0]._replace(order=enq))


def test_a_queue_without_numbers_or_from_another_state_is_taken_in_afresh():
    groups = RequestGroups(_key)
    a = tuple(JobView(_job(i, 1.0), JobState.QUEUED, order=i) for i in (1, 2))
    assert [v.id for _, v in groups.scan(a, "state-1")] == ["j1", "j2"]
    b = tuple(JobView(_job(i, 2.0), JobState.QUEUED) for i in (7, 8))  # order 0: numbered by position
    assert [v.id for _, v in groups.scan(b, "state-1")] == ["j7", "j8"]
    c = tuple(JobView(_job(i, 1.0), JobState.QUEUED, order=i) for i in (1, 2))
    assert [v.id for _, v in groups.scan(c, "state-2")] == ["j1", "j2"]
    # the same nodes, but numbers that do not continue the jobs taken in (another state's)
    d = tuple(JobView(_job(i, 1.0), JobState.QUEUED, order=k) for k, i in enumerate((5, 6, 9), 1))
    assert [v.id for _, v in groups.scan(d, "state-2")] == ["j5", "j6", "j9"]
