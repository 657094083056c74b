from reamer.domain import ClusterSnapshot, JobState, JobView, Node, Resources, StartJob, TrainingJob
from reamer.policies.static import Static, StaticConfig


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
