"""Inference services harvested from GPU training nodes in the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from reamer.backends.sim.cluster import NOISES_PER_CONTAINER, _Columns, _job_rates, _readings
from reamer.domain.readings import TableTelemetry
from reamer.backends.sim.inference import cfs_split
from reamer.config.scenario import parse_scenario
from reamer.domain import Container, Resources, Role
from reamer.errors import InputError
from reamer.models.profiles import shipped_profiles
from reamer.models.training import Step
from reamer.runtime import simulate

HEADER = "id,model,arrival_s,ps,workers,ps_cpu,worker_cpu,worker_gpu,duration_s\n"
GPU_NODE = {"name": "gpu", "count": 1, "cores": 48, "mem_gib": 256, "gpus": 4, "gpu_model": "V100M32"}
KEYS = ("slo_attainment_pct", "requests_within_slo_pct", "training_slowdown_pct", "harvested_share_pct",
        "harvested_core_hours", "dedicated_node_hours", "migrations", "evictions", "gpu_node_cpu_util_pct")


def scenario(tmp_path, jobs: str, peak: float, horizon: float = 7200, steady: bool = True, node=GPU_NODE, **extra):
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + jobs)
    rate = {"kind": "diurnal", "trough_frac": 1.0, "noise": 0.0} if steady else {"kind": "diurnal"}
    data = {
        "name": "colo", "seed": 3, "horizon_s": horizon,
        "cluster": {"node_pools": [node]},
        "workload": {"kind": "joblist", "path": str(path)},
        "inference": {"services": [{"id": "resnet", "model": "resnet50", "slo_p99_ms": 300,
                                    "peak_rate_per_s": peak, "rate": rate}],
                      "pool": {"count": 4, "cores": 32}, **extra},
    }
    return parse_scenario(data, "test")


def test_reamer_keeps_slo_and_stays_in_slack(tmp_path):
    sc = scenario(tmp_path, "j1,resnet50,0,1,2,1,12,1,100000\n", peak=60, horizon=4 * 3600, steady=False)
    r = simulate(sc, "static", harvest="reamer")
    m = r.metrics
    assert r.policy == "static+reamer"
    assert all(k in m for k in KEYS)
    assert m["service_windows"] == 240
    assert m["slo_attainment_pct"] >= 99.9
    assert m["over_slack_core_hours"] == 0.0  # never more inference than the node's slack
    assert m["training_slowdown_pct"] == 0.0
    assert m["harvested_share_pct"] > 90.0
    # within what the node's idle CPU could hold; not all of it could: 2 of 48 cores are reserved
    assert m["harvested_share_pct"] <= m["harvestable_share_pct"] <= 100.0


# j2 arrives on the node and needs cores the harvested inference holds
RISING = "j1,resnet50,0,1,2,1,10,1,100000\nj2,mobilenet_v2,3630,1,1,1,25,1,100000\n"


def test_naive_over_commits_when_training_arrives_and_inference_is_squeezed(tmp_path):
    """j2 lands on the node naive filled: CPU is split by cpu.shares (training's request weighs
    more), so naive's replicas run on fewer cores than their limits; reamer moves them first."""
    sc = scenario(tmp_path, RISING, peak=180)
    naive = simulate(sc, "static", harvest="naive").metrics
    reamer = simulate(sc, "static", harvest="reamer").metrics
    assert naive["over_slack_core_hours"] > 0.0
    assert reamer["over_slack_core_hours"] == 0.0
    assert reamer["training_slowdown_pct"] < 1.0  # only until the next harvest round
    assert reamer["migrations"] >= 1  # inference moved away (make-before-break)
    assert reamer["slo_attainment_pct"] >= 99.9


def test_cfs_split_both_sides_slow_by_weight():
    assert cfs_split(10.0, 4.0, 4.0, 5.0, 5.0) == (4.0, 5.0)  # fits: everyone gets its demand
    assert cfs_split(10.0, 4.0, 8.0, 8.0, 8.0) == (4.0, 6.0)  # training under its share: inference gets the rest
    t, i = cfs_split(10.0, 9.0, 2.0, 8.0, 8.0)  # both over their shares: split 2:8
    assert (t, i) == pytest.approx((2.0, 8.0))
    t, i = cfs_split(10.0, 9.0, 5.0, 9.0, 5.0)
    assert (t, i) == pytest.approx((5.0, 5.0))  # both slow
    assert cfs_split(-1.0, 1.0, 1.0, 1.0, 1.0) == (0.0, 0.0)


def test_contention_slows_training_when_inference_outweighs_it(tmp_path):
    """A small-request job whose use rises next to big replicas: both sides slow."""
    jobs = "j1,mobilenet_v2,0,1,1,1,4,1,100000\nj2,mobilenet_v2,1830,1,1,1,40,1,100000\n"
    sc = scenario(tmp_path, jobs, peak=400, horizon=3600)
    m = simulate(sc, "static", harvest="naive").metrics
    assert m["over_slack_core_hours"] > 0.0
    assert m["training_slowdown_pct"] > 5.0 and m["slo_attainment_pct"] < 99.0  # both sides lose
    r = simulate(sc, "static", harvest="reamer").metrics
    assert r["training_slowdown_pct"] < 1.0 and r["slo_attainment_pct"] >= 99.9  # inference moved first


def test_dedicated_leaves_training_untouched(tmp_path):
    jobs = "j1,resnet50,0,1,2,1,10,1,3000\nj2,mobilenet_v2,600,1,1,1,25,1,2000\n"
    sc = scenario(tmp_path, jobs, peak=50)
    alone = simulate(sc.model_copy(update={"inference": None}), "static").metrics
    ded = simulate(sc, "static", harvest="dedicated").metrics
    assert "slo_attainment_pct" not in alone
    for k in ("jobs", "mean_jct_s", "p95_jct_s", "mean_queue_s", "makespan_s", "reconfigurations"):
        assert ded[k] == alone[k], k
    assert ded["harvested_core_hours"] == 0.0 and ded["dedicated_node_hours"] > 0


def test_deterministic(tmp_path):
    sc = scenario(tmp_path, RISING, peak=120, steady=False)
    a = simulate(sc, "static", harvest="usage-reclaim").metrics
    b = simulate(sc, "static", harvest="usage-reclaim").metrics
    a.pop("wall_s"), b.pop("wall_s")
    assert repr(a) == repr(b)  # nan-aware


def test_validation_errors():
    base = {"cluster": {"node_pools": [GPU_NODE]}}
    svc = {"id": "a", "model": "resnet50", "slo_p99_ms": 100, "peak_rate_per_s": 5}
    with pytest.raises(InputError, match="inference.services.0.model"):
        simulate(parse_scenario({**base, "inference": {"services": [{**svc, "model": "nope"}]}}, "t"), "static")
    with pytest.raises(InputError, match="inference"):
        parse_scenario({**base, "inference": {"services": []}}, "t")
    with pytest.raises(InputError, match="unique"):
        parse_scenario({**base, "inference": {"services": [svc, svc]}}, "t")
    with pytest.raises(InputError, match="slo_p99_ms"):
        parse_scenario({**base, "inference": {"services": [{**svc, "slo_p99_ms": 0}]}}, "t")
    with pytest.raises(InputError, match="rate"):
        parse_scenario({**base, "inference": {"services": [{**svc, "rate": {"kind": "poisson"}}]}}, "t")
    with pytest.raises(InputError, match="pool.name"):
        simulate(parse_scenario({**base, "inference": {"services": [svc], "pool": {"name": "gpu"}}}, "t"), "static")
    with pytest.raises(InputError, match="policy.harvest: expected one of"):
        simulate(parse_scenario({**base, "inference": {"services": [svc]}}, "t"), "static", harvest="bogus")


def test_genai_rates(shared_data):
    svc = {"id": "gen", "model": "bert_base", "slo_p99_ms": 800, "peak_rate_per_s": 20,
           "rate": {"kind": "genai", "path": str(shared_data / "genai_qps.csv")}}
    sc = parse_scenario({"horizon_s": 3600, "cluster": {"node_pools": [GPU_NODE]},
                         "workload": {"kind": "synthetic", "jobs": 2, "gpus_per_worker": 1},
                         "inference": {"services": [svc]}}, "t")
    m = simulate(sc, "static", harvest="reamer").metrics
    assert m["service_windows"] == 60 and m["slo_attainment_pct"] >= 99.0


def test_drifting_need_reamer_keeps_training_fast(tmp_path):
    jobs = "j1,resnet50,0,1,4,1,10,1,100000\nj2,mobilenet_v2,0,1,1,1,8,1,100000\n"
    still = scenario(tmp_path, jobs, peak=150, horizon=3 * 3600)
    drift = scenario(tmp_path, jobs, peak=150, horizon=3 * 3600, need_variation=0.5)
    a = simulate(still, "static", harvest="reamer").metrics
    b = simulate(drift, "static", harvest="reamer").metrics
    assert a["cpu_util_pct"] != b["cpu_util_pct"]  # the need really moves
    assert b["training_slowdown_pct"] < 1.0
    assert b["slo_attainment_pct"] >= 99.9


def test_per_node_cpu_stack_adds_up_to_each_node_and_to_the_total(tmp_path):
    from reamer.backends.sim.inference import NODE_LAYERS
    from reamer.reports.html import colocation_figures

    sc = scenario(tmp_path, "j1,resnet50,0,1,2,1,12,1,100000\n", peak=60, horizon=3600)
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"node_pools": [
        sc.cluster.node_pools[0].model_copy(update={"count": 2})]})})
    r = simulate(sc, "static", harvest="reamer")
    s = r.inference_series
    nodes = sorted({k.split(":", 2)[2] for k in s if k.startswith("node_cpu:")})
    assert len(nodes) == 2
    for i in range(len(s["t"])):
        for n in nodes:  # each node's layers stack to its cores
            assert sum(s[f"node_cpu:{layer}:{n}"][i] for layer in NODE_LAYERS) == pytest.approx(GPU_NODE["cores"])
        for layer in NODE_LAYERS:  # and the nodes' layers add up to the all-nodes stack
            assert sum(s[f"node_cpu:{layer}:{n}"][i] for n in nodes) == pytest.approx(s[layer][i], abs=1e-6)
    assert s["slo_ms:resnet"] == [300.0]
    stack, lat = colocation_figures([r])
    menu = stack.layout.updatemenus[0].buttons
    assert [b.label for b in menu] == ["all GPU nodes", *nodes]
    assert sum(menu[1].args[0]["visible"]) == len(NODE_LAYERS)  # one node's four layers
    assert any("SLO resnet" in (a.text or "") for a in lat.layout.annotations)


def test_need_scale_multiplies_every_gpu_jobs_input_cost(tmp_path):
    """One ResNet-50 worker, 10 cores, 1 GPU, behind a 10 GbE PS link: about 124 samples/s, so
    its pipeline (8.6 ms of CPU per image, the zoo's) keeps 1.07 cores busy per unit of scale."""
    jobs = "j1,resnet50,0,1,1,1,10,1,3600\n"
    runs = {k: simulate(scenario(tmp_path, jobs, peak=20, horizon=7200, need_scale=k), "static", harvest="reamer")
            for k in (1.0, 2.0, 12.0)}
    one, two, twelve = (runs[k] for k in (1.0, 2.0, 12.0))
    assert two.metrics["cpu_util_pct"] > 1.5 * one.metrics["cpu_util_pct"]  # the pipeline's share doubles
    assert two.jobs[0].speed == pytest.approx(one.jobs[0].speed, rel=1e-9)  # as fast: 2.1 of 10 cores
    assert twelve.jobs[0].speed < 0.9 * one.jobs[0].speed  # 12.8 cores needed, 10 requested: input-bound


def test_a_burstable_input_bound_job_runs_on_the_node_s_idle_cores(tmp_path):
    """On a 1 Tb/s NIC (its PS traffic is not what this is about) a ResNet-50 worker of 10 cores
    steps at about 330 samples/s; at scale 4 its pipeline needs more than its request
    (Amdahl at the model's fraction): guaranteed, it is held to its request and slows;
    burstable, it takes the rest from the idle node and runs as fast as at scale 1, using more
    CPU than it requests."""
    jobs = "j1,resnet50,0,1,1,1,10,1,3600\n"
    node = {**GPU_NODE, "nic_gbps": 1000}
    runs = {(k, qos): simulate(scenario(tmp_path, jobs, peak=20, horizon=7200, node=node, need_scale=k,
                                        training_qos=qos), "static", harvest="dedicated")
            for k in (1.0, 4.0) for qos in ("guaranteed", "burstable")}
    fast = runs[1.0, "guaranteed"].jobs[0].speed
    assert runs[1.0, "burstable"].jobs[0].speed == pytest.approx(fast, rel=1e-9)  # no need above its request
    assert runs[4.0, "guaranteed"].jobs[0].speed < 0.9 * fast
    burst = runs[4.0, "burstable"]
    assert burst.jobs[0].speed == pytest.approx(fast, rel=0.02)
    job = burst.jobs[0]
    used = burst.metrics["cpu_util_pct"] / 100 * 48 * 7200 / (job.end_s - job.start_s)  # cores while it ran
    assert used > 11.0  # above the 11 cores it requests (worker + PS)


def test_an_input_bound_worker_reads_throttled_only_under_a_cpu_limit():
    """A GPU worker whose input pipeline stalls its step: under a limit the CFS quota throttles
    it; burstable, it has no quota, so it is never throttled and its stall shows as CPU used
    above its request instead (as ``cpu.stat`` reads for a cgroup without a quota)."""
    prof = shipped_profiles().models["resnet50"]
    st = Step(t_comp=0.1, t_net=0.0, t_ps=0.0, speed=320.0, worker_busy=1.0, ps_busy=0.0, net_busy=0.0,
              gpu_busy=0.6, t_pipe=0.1)
    w = Container("w", "j", Role.WORKER, "n", Resources(10, 1024, 1))
    cols = _Columns.of((w,), {"n": 0})

    def reading(burst: dict[str, float], burstable: bool):
        table = _readings(["j"], np.zeros(1), np.zeros(1), [cols], [_job_rates(st, prof, cols, 0.0, burstable)],
                          np.array([10.0]), np.ones(1 + NOISES_PER_CONTAINER), [1], burst)
        return TableTelemetry(table)["j"].containers["w"]

    limited = reading({}, False)
    burst = reading({"w": 4.0}, True)
    assert limited.throttled_ratio == 1.0 and limited.cpu_used == 10.0
    assert burst.throttled_ratio == 0.0 and burst.cpu_used == 14.0 > burst.cpu_limit


def test_a_harvester_that_counts_requests_slows_a_bursting_job_and_reamer_does_not(tmp_path):
    """naive takes the cores above training's request, where the input-bound job bursts: the
    CFS splits them by cpu.shares and training slows; reamer's need is the measured use,
    bursts included, and leaves them to training."""
    jobs = "j1,resnet50,0,1,1,1,10,1,100000\n"
    sc = scenario(tmp_path, jobs, peak=300, horizon=3 * 3600, need_scale=24.0, training_qos="burstable")
    naive = simulate(sc, "static", harvest="naive").metrics
    reamer = simulate(sc, "static", harvest="reamer").metrics
    assert naive["training_slowdown_pct"] > 5.0
    assert reamer["training_slowdown_pct"] < 1.0 and reamer["slo_attainment_pct"] >= 99.9


def test_the_need_forgets_a_job_that_left_the_node(tmp_path):
    """j2's 24 cores leave the node at 1 h. The need is a high percentile of the use over the
    last ``need_window_s`` (30 min) of the containers still there, so the cores j2 used count
    no more from the next round: reamer harvests them within minutes, not half an hour later."""
    jobs = "j1,resnet50,0,1,2,1,8,1,100000\nj2,resnet50,0,1,1,1,24,0,3600\n"
    r = simulate(scenario(tmp_path, jobs, peak=300, horizon=3 * 3600), "static", harvest="reamer")
    s = r.inference_series
    end = next(j.end_s for j in r.jobs if j.id == "j2")

    def harvested_at(t: float) -> float:
        return s["harvested_cores"][max(i for i, x in enumerate(s["t"]) if x <= t)]

    before, soon, later = harvested_at(end - 300), harvested_at(end + 600), harvested_at(end + 2400)
    assert later > before + 10  # the freed cores are worth harvesting
    assert soon >= later - 1e-9  # and they are harvested within ten minutes


def test_a_job_started_between_windows_needs_its_level_from_the_start(tmp_path):
    """The need scale is on every job's input cost from its start, not only from the first
    window after it: j1 starts half-way through the first window, and the CPU it is measured
    using at the next round is what it uses from then on (no variation here; NEARCHUS for the
    telemetry, its resizes leave the pipeline's use as it is)."""
    cpu = {}

    def hook(rec):
        if rec.node_cpu:
            cpu[rec.t] = sum(rec.node_cpu.values())

    sc = scenario(tmp_path, "j1,resnet50,30,1,1,1,10,1,3600\n", peak=20, horizon=600, need_scale=4.0)
    simulate(sc, "nearchus", harvest="reamer", on_round=hook)
    first = min(t for t in cpu if t > 30)
    assert first < 120
    later = sorted(v for t, v in cpu.items() if t > first)
    assert later and 0.9 * later[len(later) // 2] <= cpu[first] <= 1.1 * later[-1]  # measured with noise


def test_a_job_arriving_between_windows_finds_its_cores_free(tmp_path):
    """j2 arrives at 3,630 s, half-way through a window, on cores the replicas hold, so the
    joint loop harvests in that round too: the replicas move before j2 starts and training
    never runs contended. Each loop on its own, j2 runs contended until
    the next window."""
    joint = simulate(scenario(tmp_path, RISING, peak=300), "static", harvest="reamer").metrics
    alone = simulate(scenario(tmp_path, RISING, peak=300, coordination="none"), "static", harvest="reamer").metrics
    assert joint["training_slowdown_pct"] == 0.0
    assert alone["training_slowdown_pct"] > 0.0
    assert joint["slo_attainment_pct"] >= 99.9
    assert joint["harvest_rounds"] > joint["service_windows"]  # (one service) and a round at 3,630 s
    assert alone["harvest_rounds"] == alone["service_windows"]  # on its own: at windows only


def test_between_windows_the_harvester_sees_the_window_s_measurements_and_new_jobs_at_their_limits(tmp_path):
    """Rounds at 3,630 s and 3,640 s start j2 and j3 between two windows. The harvester sees the
    need measured at 3,600 s plus, at 3,630 s, what j2 is about to take (its CPU) and, at
    3,640 s, j2 at its CPU limits (started, not yet measured) plus j3's; nothing is measured
    anew between windows. At 3,660 s the window's measurement replaces the limits by use."""
    from reamer.policies import make_policy

    seen: dict[float, float] = {}

    class Spy:
        name, interval_s = "spy", 60.0

        def __init__(self):
            self.inner = make_policy("reamer", kind="harvest", interval_s=60.0)

        def decide(self, snap):
            seen[snap.now] = snap.usage["gpu-0000"].training_need
            return self.inner.decide(snap)

    jobs = ("j1,resnet50,0,1,2,1,10,1,100000\nj2,mobilenet_v2,3630,1,1,1,15,1,100000\n"
            "j3,mobilenet_v2,3640,1,1,1,8,0,100000\n")  # each start needs cores the replicas hold
    simulate(scenario(tmp_path, jobs, peak=300, horizon=2 * 3600), "static", harvest=Spy())
    assert 3630.0 in seen and 3640.0 in seen
    assert seen[3630.0] == pytest.approx(seen[3600.0] + 16.0)
    assert seen[3640.0] == pytest.approx(seen[3600.0] + 16.0 + 9.0)
    assert seen[3660.0] < seen[3640.0]  # j2 measured: it uses less than its 15 + 1 cores
