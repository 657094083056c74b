from dataclasses import fields

import numpy as np
import pytest

from reamer.backends.sim import EventQueue, SimCluster
from reamer.backends.sim.engine import Ev
from reamer.config.scenario import load_scenario
from reamer.domain import (
    AddContainer,
    Node,
    Preempt,
    RemoveContainer,
    Resources,
    Role,
    StartJob,
    TrainingJob,
)
from reamer.domain.decisions import InvalidDecision, Placement
from reamer.domain.readings import READINGS, ReadingTable, reading_by_container, readings_of
from reamer.models.profiles import shipped_profiles
from reamer.policies.nearchus import Nearchus
from reamer.runtime import simulate

CAL = shipped_profiles().calibration


def small(seed=1, jobs=40):
    sc = load_scenario(None)
    return sc.model_copy(update={"seed": seed, "workload": sc.workload.model_copy(update={"jobs": jobs})})


def without_wall(m):
    return {k: v for k, v in m.items() if k != "wall_s"}


def test_event_order_is_time_priority_sequence():
    q = EventQueue()
    q.push(5, Ev.TICK, "t")
    q.push(5, Ev.ARRIVAL, "a1")
    q.push(5, Ev.COMPLETION, "c")
    q.push(5, Ev.ARRIVAL, "a2")
    q.push(1, Ev.TICK, "first")
    assert [q.pop()[2] for _ in range(5)] == ["first", "c", "a1", "a2", "t"]


def test_compact_drops_superseded_events_and_keeps_the_order():
    q = EventQueue()
    for i, t in enumerate([5.0, 1.0, 3.0, 3.0, 9.0, 8.0]):
        q.push(t, Ev.COMPLETION, i)
    q.push(3.0, Ev.ARRIVAL, "a")
    # odd completions are superseded: 1 (t=1) and 3 (t=3) were due by t=6, 5 (t=8) was not
    assert q.compact(lambda kind, p: kind is not Ev.COMPLETION or p % 2 == 0, until=6.0) == 3
    assert q.popped == 2  # counted as the pops they save up to the run's end
    assert [q.pop() for _ in range(len(q))] == [(3.0, Ev.COMPLETION, 2), (3.0, Ev.ARRIVAL, "a"),
                                                (5.0, Ev.COMPLETION, 0), (9.0, Ev.COMPLETION, 4)]
    assert q.popped == 6


@pytest.mark.parametrize("horizon", [None, 4 * 3600.0])
def test_dropping_superseded_completions_changes_no_result(monkeypatch, horizon):
    """A run that drops superseded completion events whenever it can gives the results and
    the event count of one that never does (and pops them at their time)."""
    import reamer.runtime.sim as sim

    sc = small(jobs=60)
    sc = sc if horizon is None else sc.model_copy(update={"horizon_s": horizon})
    runs = []
    for at in (0, 10**9):
        monkeypatch.setattr(sim, "COMPACT_AT", at)
        runs.append(simulate(sc, "nearchus"))
    (a, b) = runs
    assert a.metrics["retimings"] > 60  # completions were superseded
    assert without_wall(a.metrics) == without_wall(b.metrics) and a.jobs == b.jobs


def test_deterministic_for_a_seed():
    a, b = simulate(small(), "static"), simulate(small(), "static")
    assert without_wall(a.metrics) == without_wall(b.metrics)
    assert a.jobs == b.jobs
    assert without_wall(simulate(small(seed=2), "static").metrics) != without_wall(a.metrics)


def test_all_jobs_finish_and_jct_is_queue_plus_run():
    r = simulate(small(), "static")
    assert r.metrics["jobs"] == 40 and r.unfinished == 0
    for j in r.jobs:
        assert j.start_s >= j.arrival_s and j.end_s > j.start_s
        assert j.jct_s == pytest.approx(j.end_s - j.arrival_s)


def test_busy_cluster_queues_jobs():
    sc = small(jobs=60)
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"node_pools": [
        sc.cluster.node_pools[0].model_copy(update={"count": 1})]})})
    r = simulate(sc, "static")
    assert r.metrics["mean_queue_s"] > 0 and r.metrics["jobs"] == 60
    assert max(r.series["cpu_alloc_pct"]) <= 100.0 + 1e-9


def test_horizon_leaves_jobs_unfinished():
    sc = small().model_copy(update={"horizon_s": 3000.0})
    r = simulate(sc, "static")
    assert r.unfinished > 0 and r.metrics["jobs"] + r.unfinished == 40


def _cluster():
    events = []
    c = SimCluster([Node("n0", 8, 8192), Node("n1", 8, 8192)], CAL, np.random.default_rng(0),
                   lambda jid, t, v: events.append((jid, t, v)))
    spec = TrainingJob("j", "resnet50", 0.0, 1e5, 1, 1, Resources(1, 512), Resources(2, 512))
    c.arrive(spec, 0.0)
    return c, events


def test_backend_rejects_overcommit_and_keeps_state():
    c, _ = _cluster()
    bad = StartJob("j", (Placement(Role.PS, "n0", Resources(1, 512)), Placement(Role.WORKER, "n0", Resources(8, 512))))
    with pytest.raises(InvalidDecision):
        c.actuate([bad], 0.0)
    assert c.state.free["n0"] == Resources(8, 8192) and "j" in c.state.queue


def test_preempt_keeps_progress_and_requeues():
    c, events = _cluster()
    c.actuate([StartJob("j", (Placement(Role.PS, "n0", Resources(1, 512)), Placement(Role.WORKER, "n1", Resources(2, 512))))], 0.0)
    assert events and events[-1][1] > 0
    c.actuate([Preempt("j")], 100.0)
    assert "j" in c.state.queue and c.jobs["j"].done > 0
    assert c.state.free["n0"] == Resources(8, 8192)
    # the completion scheduled before preemption is now stale
    jid, t, v = events[-1]
    assert not c.complete(jid, v, t)


def test_a_preempted_job_started_again_in_the_same_place_runs_at_its_speed_again():
    c, events = _cluster()
    start = StartJob("j", (Placement(Role.PS, "n0", Resources(1, 512)), Placement(Role.WORKER, "n1", Resources(2, 512))))
    c.actuate([start], 0.0)
    speed = c.jobs["j"].step.speed
    c.actuate([Preempt("j")], 100.0)
    assert c.jobs["j"].step.speed == 0.0
    c.actuate([start], 200.0)
    assert speed > 0 and c.jobs["j"].step.speed == speed and c.jobs["j"].base.speed == speed
    assert events[-1][1] < float("inf")


def test_restart_pause_reports_no_telemetry_and_speed_counts_after_it():
    """A job changing shape restarts (``restart_s``): meanwhile its workers report nothing, as on
    the local backend, and its next speed is the new shape's running speed, not diluted by the pause."""
    c = SimCluster([Node("n0", 8, 8192), Node("n1", 8, 8192)], CAL, np.random.default_rng(0),
                   lambda jid, t, v: None, telemetry_interval_s=1.0, restart_s=10.0)
    c.arrive(TrainingJob("j", "resnet50", 0.0, 1e7, 1, 1, Resources(1, 512), Resources(2, 512)), 0.0)
    c.actuate([StartJob("j", (Placement(Role.PS, "n0", Resources(1, 512)),
                              Placement(Role.WORKER, "n1", Resources(2, 512))))], 0.0)
    assert c.observe(5.0).telemetry["j"].speed > 0
    c.actuate([AddContainer("j", Placement(Role.PS, "n1", Resources(1, 512)))], 5.0)
    assert "j" not in c.observe(8.0).telemetry  # restarting: nothing reported
    tel = c.observe(20.0).telemetry["j"]
    assert tel.since_s == pytest.approx(15.0)
    assert tel.speed == pytest.approx(c.jobs["j"].step.speed)


def test_rounds_between_intervals_are_not_periodic():
    """A snapshot says whether its round is one of the policy's intervals (telemetry due) or one
    the simulator runs between them, on an arrival or a completion."""
    c = SimCluster([Node("n0", 8, 8192)], CAL, np.random.default_rng(0), lambda jid, t, v: None,
                   telemetry_interval_s=60.0)
    c.arrive(TrainingJob("j", "resnet50", 0.0, 1e7, 1, 1, Resources(1, 512), Resources(2, 512)), 0.0)
    assert not c.observe(0.0).periodic
    assert not c.observe(30.0).periodic
    assert c.observe(60.0).periodic
    assert not c.observe(61.0).periodic


def _crowded(nic_gbps=10.0):
    """Six network-heavy jobs (vgg16 on GPUs, one 1-core PS each): their workers on one node
    and their PS on another, so all their traffic shares those two nodes' NICs."""
    events = {}
    c = SimCluster([Node("n0", 64, 65536, 12, nic_gbps=nic_gbps), Node("p0", 64, 65536, 0, nic_gbps=nic_gbps)], CAL,
                   np.random.default_rng(0), lambda jid, t, v: events.__setitem__(jid, t))
    specs = [TrainingJob(f"j{k}", "vgg16", 0.0, 1e6, 1, 2, Resources(1, 512), Resources(4, 512, 1)) for k in range(6)]
    for s in specs:
        c.arrive(s, 0.0)
    start = [StartJob(s.id, (Placement(Role.PS, "p0", s.ps_res),) + (Placement(Role.WORKER, "n0", s.worker_res),) * 2)
             for s in specs]
    return c, specs, start, events


def test_jobs_as_requested_run_at_their_request_speed_however_crowded_the_link():
    """A job's work is defined at its request on full links (a trace's duration contains the
    contention it met): six jobs as requested on one 10 GbE node each run at that speed."""
    from reamer.workloads.build import request_speed

    c, specs, start, events = _crowded()
    c.actuate(start, 0.0)
    want = request_speed("vgg16", CAL, specs[0].batch, 1, 2, specs[0].ps_res, specs[0].worker_res, 10.0)
    assert [c.jobs[s.id].step.speed for s in specs] == [want] * 6
    assert events["j0"] == pytest.approx(1e6 / want)


def test_a_policy_that_adds_flows_slows_the_neighbours_until_they_are_gone():
    """Relative to the request: a job given a second PS puts more flows on the node than its
    request did, and its neighbours lose bandwidth until it is back to its request; on an
    uncrowded link nothing moves."""
    c, _, start, _ = _crowded()
    c.actuate(start, 0.0)
    before, own = c.jobs["j1"].step.speed, c.jobs["j0"].step.speed
    c.actuate([AddContainer("j0", Placement(Role.PS, "p0", Resources(1, 512)))], 10.0)
    assert c.jobs["j1"].step.speed < before and c.jobs["j0"].step.speed > own
    (ps2,) = [x for x in c.state.jobs["j0"].containers.values() if x.role is Role.PS][1:]
    c.actuate([RemoveContainer(ps2.id)], 20.0)
    assert c.jobs["j1"].step.speed == pytest.approx(before, rel=2e-3)  # a fixed point, solved to 0.1%
    lone, _, start, _ = _crowded(nic_gbps=1e5)
    lone.actuate(start, 0.0)
    before = lone.jobs["j1"].step.speed
    lone.actuate([AddContainer("j0", Placement(Role.PS, "p0", Resources(1, 512)))], 10.0)
    assert lone.jobs["j1"].step.speed == pytest.approx(before, rel=1e-6)


def test_a_job_on_one_node_talks_in_the_host_off_the_nic():
    """A job whose PS and workers share a node puts no flow on its NIC: a neighbour given a
    second PS does not slow it, and it does not slow the neighbours; moved across nodes, its
    traffic is on the NIC again."""
    c, _, start, _ = _crowded()
    local = TrainingJob("h", "vgg16", 0.0, 1e6, 1, 2, Resources(1, 512), Resources(4, 512, 1))
    c.arrive(local, 0.0)
    c.actuate(start[:5] + [StartJob("h", (Placement(Role.PS, "n0", local.ps_res),)
                                    + (Placement(Role.WORKER, "n0", local.worker_res),) * 2)], 0.0)
    alone = c.jobs["h"].step.speed
    flows = list(c._flows["n0"])
    c.actuate([AddContainer("j0", Placement(Role.PS, "p0", Resources(1, 512)))], 10.0)
    assert c.jobs["h"].step.speed == alone
    assert not c.jobs["h"].flows[1]  # no flow of its own
    assert c._flows["n0"][1] == pytest.approx(flows[1])  # no flow of its own, as requested or now
    c.actuate([AddContainer("h", Placement(Role.PS, "p0", Resources(1, 512)))], 20.0)
    assert {n for n, _ in c.jobs["h"].flows[1]} == c.jobs["h"].flows[2] == {"n0", "p0"}


def test_a_trace_replays_at_its_recorded_durations_under_static(tmp_path):
    """(JCT − queue) of every job equals its recorded duration under ``static``, on a cluster
    where the jobs share NICs and queue."""
    rows = ["id,model,arrival_s,ps,workers,ps_cpu,worker_cpu,worker_gpu,duration_s"]
    rng = np.random.default_rng(3)
    durations = {}
    for k in range(120):
        d = float(rng.integers(60, 3600))
        durations[f"j{k}"] = d
        rows.append(f"j{k},{rng.choice(['vgg16', 'resnet50', 'bert_base'])},{k * 20},1,{rng.integers(1, 5)},1,4,1,{d}")
    (tmp_path / "jobs.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "sc.yaml").write_text("name: replay\ncluster: {nic_gbps: 10, node_pools: [{name: g, count: 3, "
                                      "cores: 32, mem_gib: 256, gpus: 4}]}\nworkload: {kind: joblist, path: jobs.csv}\n")
    r = simulate(load_scenario(tmp_path / "sc.yaml"), "static")
    assert r.unfinished == 0 and r.metrics["mean_queue_s"] > 0
    for j in r.jobs:
        assert j.jct_s - j.queue_s == pytest.approx(durations[j.id], rel=1e-9)


def test_workers_beyond_a_fraction_s_measured_cores_are_noted_once_per_model(caplog):
    """The speed model extrapolates a model's Amdahl fraction past the cores it was measured at:
    the run notes it (model -> (measured up to, most cores seen)) and logs it once per model."""
    import logging

    caplog.set_level(logging.INFO, logger="reamer.backends.sim.cluster")
    from dataclasses import replace

    from reamer.models.zoo import ZOO

    models = {"resnet50": replace(ZOO["resnet50"], parallel_fraction=0.9, max_cores=2.0),
              "vgg16": replace(ZOO["vgg16"], parallel_fraction=0.9, max_cores=8.0)}
    c = SimCluster([Node("n0", 32, 65536)], CAL, np.random.default_rng(0), lambda jid, t, v: None, models=models)
    for k, (model, cores) in enumerate([("resnet50", 2), ("resnet50", 4), ("resnet50", 6), ("vgg16", 4)]):
        c.arrive(TrainingJob(f"j{k}", model, 0.0, 1e6, 1, 1, Resources(1, 512), Resources(cores, 512)), 0.0)
        c.actuate([StartJob(f"j{k}", (Placement(Role.PS, "n0", Resources(1, 512)),
                                      Placement(Role.WORKER, "n0", Resources(cores, 512))))], 0.0)
        if k == 0:
            assert c.extrapolated == {}  # at the measured range: nothing to say
    assert c.extrapolated == {"resnet50": (2.0, 6.0)}  # vgg16's 4 cores are inside its 8
    warned = [r for r in caplog.records if "extrapolates" in r.getMessage()]
    assert len(warned) == 1 and "resnet50" in warned[0].getMessage()


def test_a_model_without_its_own_curve_is_held_to_the_machine_s_range():
    from dataclasses import replace

    cal = replace(CAL, max_cores=2.0)
    c = SimCluster([Node("n0", 32, 65536)], cal, np.random.default_rng(0), lambda jid, t, v: None)
    c.arrive(TrainingJob("j", "bert_base", 0.0, 1e6, 1, 1, Resources(1, 512), Resources(4, 512)), 0.0)
    c.actuate([StartJob("j", (Placement(Role.PS, "n0", Resources(1, 512)),
                              Placement(Role.WORKER, "n0", Resources(4, 512))))], 0.0)
    assert c.extrapolated == {"bert_base": (2.0, 4.0)}


def test_what_is_noted_is_the_cores_containers_got_not_their_request():
    """A job started below its request (a thin start) is held to the cores it runs on; a PS
    grown past the machine's measured range is noted as ``PS``."""
    from dataclasses import replace

    cal = replace(CAL, max_cores=2.0)
    c = SimCluster([Node("n0", 32, 65536)], cal, np.random.default_rng(0), lambda jid, t, v: None)
    c.arrive(TrainingJob("j", "bert_base", 0.0, 1e6, 1, 1, Resources(1, 512), Resources(8, 512)), 0.0)
    c.actuate([StartJob("j", (Placement(Role.PS, "n0", Resources(1, 512)),
                              Placement(Role.WORKER, "n0", Resources(1, 512))))], 0.0)
    assert c.extrapolated == {}
    c.actuate([AddContainer("j", Placement(Role.PS, "n0", Resources(3, 512)))], 10.0)
    assert c.extrapolated == {"PS": (2.0, 3.0)}


def test_the_need_window_percentile_is_numpys_to_the_bit():
    import numpy as np

    from reamer.backends.sim.inference import percentile

    rng = np.random.default_rng(0)
    for _ in range(2000):
        xs = (rng.random(int(rng.integers(1, 40))) * rng.choice([1e-3, 1.0, 100.0])).tolist()
        q = float(rng.choice([0.0, 50.0, 95.0, 99.9, 100.0, rng.random() * 100]))
        assert percentile(xs, q) == float(np.percentile(np.asarray(xs), q))


def test_the_readings_table_is_the_one_its_per_job_telemetry_gives():
    """The simulator measures a round's telemetry as a table; the per-job mapping it hands out
    with it builds back to the same table (rows = each view's containers in order, node indexes
    in the snapshot's order), however NEARCHUS reshapes and resizes the jobs."""
    checked = []

    class Checked(Nearchus):
        def decide(self, snap):
            if snap.telemetry:
                index = {n.name: i for i, n in enumerate(snap.nodes)}
                want = ReadingTable.of(snap.running, dict(snap.telemetry.items()), index)
                got = readings_of(snap)
                for f in fields(ReadingTable):
                    a, b = getattr(got, f.name), getattr(want, f.name)
                    assert (a == b) if isinstance(a, tuple) else np.array_equal(a, b), f.name
                for tel in snap.telemetry.values():  # one reading by container, from the column or the mapping
                    cols = {f: reading_by_container(tel.containers, f) for f in READINGS}
                    for f in READINGS:
                        assert cols[f] == {cid: getattr(c, f) for cid, c in tel.containers.items()}, f
                        assert reading_by_container(tel.containers, f) == cols[f]
                checked.append(len(got.jobs))
            return super().decide(snap)

    r = simulate(small(jobs=30), Checked())
    assert len(checked) > 20 and max(checked) > 3
    assert r.metrics["reconfigurations"] > 0
