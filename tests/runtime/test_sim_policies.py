"""Every registered policy runs on every kind of scenario the foundation accepts."""

import pytest

from reamer.runtime import simulate
from reamer.config.scenario import parse_scenario
from reamer.policies import policy_names

POOLS = [{"name": "cpu", "count": 3, "cores": 32, "mem_gib": 128},
         {"name": "gpu", "count": 2, "cores": 64, "mem_gib": 256, "gpus": 4, "gpu_model": "V100M32"}]


def scenarios(tmp_path, shared):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,model,arrival_s,ps,workers,ps_cpu,worker_cpu,worker_gpu,duration_s\n"
                    "a,resnet50,0,1,2,1,4,0,900\nb,vgg16,60,1,1,2,8,1,1200\nc,bilstm,90,2,4,1,1,0,600\n")
    out = {
        "synthetic-cpu": {"cluster": {"node_pools": POOLS[:1]}, "workload": {"kind": "synthetic", "jobs": 12}},
        "synthetic-gpu": {"cluster": {"node_pools": POOLS},
                          "workload": {"kind": "synthetic", "jobs": 12, "gpus_per_worker": 1}},
        "joblist": {"cluster": {"node_pools": POOLS}, "workload": {"kind": "joblist", "path": str(jobs)}},
    }
    if shared is not None:
        out["openb"] = {"cluster": {"node_list": str(shared / "openb_node_list_all_node.csv"), "max_nodes": 12},
                        "workload": {"kind": "openb", "pod_list": str(shared / "openb_pod_list_default.csv"),
                                     "max_jobs": 25, "max_duration_s": 3600}}
    return out


@pytest.mark.parametrize("policy", policy_names())
def test_policy_finishes_every_scenario(tmp_path, policy, shared_data_or_none):
    for name, data in scenarios(tmp_path, shared_data_or_none).items():
        sc = parse_scenario({"name": name, "seed": 3, **data}, name)
        r = simulate(sc, policy)
        assert r.unfinished == 0 and r.metrics["jobs"] > 0, (name, policy)
        assert max(r.series["cpu_alloc_pct"]) <= 100 + 1e-6


def test_a_job_that_fits_no_node_is_named_in_a_warning_and_left_unfinished():
    import logging

    sc = parse_scenario({"name": "big", "seed": 1,
                         "cluster": {"node_pools": [{"name": "cpu", "count": 1, "cores": 8, "mem_gib": 32}]},
                         "workload": {"kind": "synthetic", "jobs": 3, "worker_cores": [64], "ps_cores": [1],
                                      "workers": [1, 1], "runtime_s": [60, 120]}}, "big.yaml")
    # a handler of its own on the module's logger: the CLI's logging setup (other tests) may
    # have changed the package logger's handlers and propagation
    logger, records = logging.getLogger("reamer.runtime.sim"), []
    handler, level = logging.Handler(logging.WARNING), logger.level
    handler.emit = records.append
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        r = simulate(sc, "static")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert r.metrics["unfinished"] == 3
    assert [rec.getMessage().split(" (")[0] for rec in records] == [
        "3 of 3 jobs request a container that fits no node they may use"]


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_places_containers_only_on_the_nodes_their_job_allows(tmp_path, policy):
    """Each placement is validated by the shared state (a container on a node its job does not
    allow raises), so a run that finishes placed every PS and worker where it may go."""
    from dataclasses import replace

    import numpy as np

    from reamer.models.profiles import shipped_profiles
    from reamer.workloads.build import build_jobs, build_nodes

    sc = parse_scenario({"name": "pinned", "seed": 5, "cluster": {"node_pools": POOLS},
                         "workload": {"kind": "synthetic", "jobs": 16, "gpus_per_worker": 1}}, "pinned")
    prof = shipped_profiles()
    jobs = build_jobs(sc, build_nodes(sc), prof.calibration, np.random.default_rng(0), prof.models)
    ps_only, workers_only = frozenset({"cpu-0002"}), frozenset({"gpu-0001", "cpu-0000"})
    pinned = [replace(j, ps_nodes=ps_only, worker_nodes=workers_only) if k % 2 else j for k, j in enumerate(jobs)]
    r = simulate(sc, policy, jobs=pinned)
    assert r.unfinished == 0
