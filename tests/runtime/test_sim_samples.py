"""``RunResult.samples_trained``: the samples every job trained within the run, finished or
not (what a horizon cuts short counts for what it did)."""

import pytest

from reamer.config.scenario import parse_scenario
from reamer.runtime import simulate

POOL = {"name": "cpu", "count": 2, "cores": 32, "mem_gib": 128}


def _run(tmp_path, rows: str, horizon: float | None):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,model,arrival_s,ps,workers,ps_cpu,worker_cpu,worker_gpu,duration_s\n" + rows)
    data = {"name": "samples", "seed": 1, "cluster": {"node_pools": [POOL]},
            "workload": {"kind": "joblist", "path": str(jobs)}}
    if horizon is not None:
        data["horizon_s"] = horizon
    return simulate(parse_scenario(data, "samples"), "static")


def test_a_lone_job_cut_by_the_horizon_counts_what_it_trained_until_then(tmp_path):
    full = _run(tmp_path, "a,resnet50,100,1,2,1,4,0,900\n", None)
    (rec,) = full.jobs
    assert full.samples_trained == pytest.approx(rec.samples)
    cut = _run(tmp_path, "a,resnet50,100,1,2,1,4,0,900\n", 550.0)
    assert cut.jobs == [] and cut.unfinished == 1
    # alone on its nodes its speed never changes: trained in proportion to its time run
    assert cut.samples_trained == pytest.approx(rec.samples * (550.0 - rec.start_s) / (rec.end_s - rec.start_s))


def test_samples_trained_grow_with_the_horizon_and_count_the_finished_jobs(tmp_path):
    rows = "a,resnet50,0,1,2,1,4,0,900\nb,vgg16,60,1,1,2,8,0,1200\nc,bilstm,90,2,4,1,1,0,600\n"
    got = [_run(tmp_path, rows, h) for h in (300.0, 800.0, 1000.0, None)]
    trained = [r.samples_trained for r in got]
    assert trained == sorted(trained) and trained[0] > 0
    for r in got:
        assert r.samples_trained >= sum(j.samples for j in r.jobs) - 1e-6
    assert got[2].jobs and got[2].unfinished  # some done, some cut
    assert got[2].samples_trained > sum(j.samples for j in got[2].jobs)
    assert got[-1].unfinished == 0 and got[-1].samples_trained == pytest.approx(sum(j.samples for j in got[-1].jobs))
