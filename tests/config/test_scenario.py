from pathlib import Path

import pytest

from reamer.config.scenario import load_scenario
from reamer.errors import InputError

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def test_default_is_embedded():
    sc = load_scenario(None)
    assert sc.name == "default" and sc.cluster.node_pools


def _err(tmp_path, text) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_scenario(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg
    return msg


def test_malformed_yaml(tmp_path):
    msg = _err(tmp_path, "cluster: [\n  node_pools: {\n")
    assert "line" in msg and "valid YAML" in msg


def test_negative_cores(tmp_path):
    msg = _err(tmp_path, "cluster:\n  node_pools:\n    - {name: a, count: 1, cores: -4, mem_gib: 8}\n")
    assert "cluster.node_pools.0.cores" in msg and "greater than 0" in msg


def test_unknown_field(tmp_path):
    msg = _err(tmp_path, "cluster:\n  node_pools: []\n  nodes: 3\n")
    assert "cluster" in msg


def test_no_nodes(tmp_path):
    assert "node_pools or node_list" in _err(tmp_path, "cluster: {}\n")


def test_not_a_mapping(tmp_path):
    assert "YAML mapping" in _err(tmp_path, "- 1\n- 2\n")


POOL = "cluster:\n  node_pools:\n    - {name: a, count: 1, cores: 8, mem_gib: 32}\n"


@pytest.mark.parametrize("workload, field", [
    ("{kind: synthetic, workers: [4, 1]}", "got workers [4, 1]"),
    ("{kind: synthetic, runtime_s: [120, 60]}", "got runtime_s [120.0, 60.0]"),
    ("{kind: synthetic, ps: [0, 0]}", "workload.synthetic.ps.0"),
])
def test_synthetic_ranges_are_checked_before_any_job_is_drawn(tmp_path, workload, field):
    msg = _err(tmp_path, POOL + f"workload: {workload}\n")
    assert field in msg


def test_a_seed_is_non_negative(tmp_path):
    assert "field seed" in _err(tmp_path, POOL + "seed: -1\n")


def test_a_file_that_is_not_utf8_names_the_file(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_bytes(b"\xc1\x00name: x\n")
    with pytest.raises(InputError, match="expected UTF-8 text") as e:
        load_scenario(p)
    assert str(p) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="existing scenario"):
        load_scenario(tmp_path / "nope.yaml")


def test_relative_paths_resolve_against_the_file(tmp_path):
    p = tmp_path / "sub" / "s.yaml"
    p.parent.mkdir()
    p.write_text("cluster: {node_list: nodes.csv}\nworkload: {kind: joblist, path: jobs.csv}\n")
    sc = load_scenario(p)
    assert sc.cluster.node_list == p.parent / "nodes.csv"
    assert sc.workload.path == p.parent / "jobs.csv"


def test_local_policy_section_defaults_to_a_real_runs_policy_and_ids_are_unique():
    from reamer.config.local import parse_local

    host = {"name": "h", "cores": 1.0}
    sc = parse_local({"hosts": [host], "policy": {"options": {"nearchus": {"block_s": 60}}}}, "t.yaml")
    assert (sc.policy.training, sc.policy.interval_s, sc.policy.harvest) == ("nearchus", 3.0, "reamer")
    job = {"id": "j", "model": "small_cnn", "samples": 10}
    with pytest.raises(InputError, match="job ids must be unique"):
        parse_local({"hosts": [host], "jobs": [job, job]}, "t.yaml")


def _offered_cores(sc) -> float:
    """The share of the cluster's cores a synthetic workload offers, from its own distributions."""
    import math

    wl, pools = sc.workload, sc.cluster.node_pools

    def mean(choices) -> float:
        return sum(choices) / len(choices)

    # workers and PS: uniform integer ranges (mean of the ends); cores: uniform choices
    cores = sum(wl.workers) / 2 * mean(wl.worker_cores) + sum(wl.ps) / 2 * mean(wl.ps_cores)
    lo, hi = wl.runtime_s
    runtime = (hi - lo) / math.log(hi / lo)  # mean of a log-uniform runtime
    return cores * runtime / wl.mean_interarrival_s / sum(p.count * p.cores for p in pools)


def test_the_month_scenario_offers_what_its_header_says():
    """scenarios/month.yaml: 30 days of arrivals at 80% of the cluster's cores, computed from
    its own workload distributions as its header does."""
    sc = load_scenario(SCENARIOS / "month.yaml")
    assert _offered_cores(sc) == pytest.approx(0.80, abs=0.005)
    assert sc.workload.jobs * sc.workload.mean_interarrival_s == pytest.approx(30 * 86400, rel=1e-3)


def test_the_embedded_default_offers_what_its_header_says():
    """src/reamer/data/default.yaml: the month's job mix, one job every 150 s: ~112 % of the cores."""
    assert _offered_cores(load_scenario(None)) == pytest.approx(1.12, abs=0.005)


def test_the_paper_scenario_is_default_tfjobs_of_the_paper_s_models_at_its_stated_load():
    import numpy as np

    from reamer.models.profiles import shipped_profiles
    from reamer.workloads import build_jobs, build_nodes

    sc = load_scenario(SCENARIOS / "paper.yaml")
    assert _offered_cores(sc) == pytest.approx(0.80, abs=0.005)
    prof = shipped_profiles()
    jobs = build_jobs(sc, build_nodes(sc), prof.calibration, np.random.default_rng(1), prof.models)
    assert len(jobs) == 150 and {(j.ps, j.workers, j.ps_res.cpu, j.worker_res.cpu) for j in jobs} == {(2, 4, 1, 1)}
    assert {j.model for j in jobs} == set(sc.workload.models)
    assert all(m.endswith("_cifar10") or m == "bilstm" for m in sc.workload.models)


def test_a_key_given_twice_is_an_error_not_a_silent_override(tmp_path):
    msg = _err(tmp_path, POOL + "seed: 1\nseed: 2\n")
    assert "line 5" in msg and "the key 'seed' given twice" in msg


def test_yaml_merge_keys_still_load(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("cluster:\n  node_pools:\n    - &cpu {name: a, count: 1, cores: 8, mem_gib: 32}\n"
                 "    - <<: *cpu\n      name: b\n      cores: 16\n")
    pools = load_scenario(p).cluster.node_pools
    assert [(x.name, x.cores, x.mem_gib) for x in pools] == [("a", 8, 32), ("b", 16, 32)]
