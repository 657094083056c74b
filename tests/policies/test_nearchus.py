"""NEARCHUS driven with hand-built snapshots (no backend)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reamer.domain import (
    AddContainer,
    ClusterSnapshot,
    Container,
    ContainerTelemetry,
    JobState,
    JobTelemetry,
    JobView,
    Node,
    RemoveContainer,
    Resize,
    Resources,
    Role,
    StartJob,
    TrainingJob,
)
from reamer.policies.diagnosis import diagnose
from reamer.policies.nearchus import Nearchus, NearchusConfig

SPEC = TrainingJob("j", "resnet50", 0.0, 1e7, 1, 2, Resources(2, 1024), Resources(2, 1024))
NODES = tuple(Node(f"n{i}", 32, 65536, nic_gbps=10) for i in range(3))


def containers(workers=2, ps=1, wcores=2.0, pscores=2.0):
    cs = [Container(f"j/ps{k}", "j", Role.PS, "n0", Resources(pscores, 1024)) for k in range(ps)]
    cs += [Container(f"j/worker{k}", "j", Role.WORKER, f"n{1 + k % 2}", Resources(wcores, 1024)) for k in range(workers)]
    return tuple(cs)


def snapshot(now, cs, speed, w_util=0.5, ps_util=0.2, net=0.2, throttled=None, since=None, wnet=None):
    free = {n.name: n.capacity - sum((c.res for c in cs if c.node == n.name), Resources()) for n in NODES}
    tel = {}
    for c in cs:
        util = w_util if c.role is Role.WORKER else ps_util
        thr = util if throttled is None else throttled
        link = net if c.role is Role.PS or wnet is None else wnet
        tel[c.id] = ContainerTelemetry(c.res.cpu * util, c.res.cpu, thr, link * 10, 10)
    job = JobView(SPEC, JobState.RUNNING, cs, 0.0, now, 0.0, None)
    return ClusterSnapshot(now, NODES, free, (), (job,), {"j": JobTelemetry(since if since is not None else now - 60, speed, tel)})


def drive(policy, rounds, cs, speed_of, **kw):
    """Run rounds, applying the policy's decisions to ``cs`` (a tiny in-test backend)."""
    cs = list(cs)
    log = []
    for k in range(1, rounds + 1):
        now = 60.0 * k
        out = policy.decide(snapshot(now, tuple(cs), speed_of(tuple(cs), k), **kw))
        log.append(out)
        for d in out:
            if isinstance(d, Resize):
                cs = [Container(c.id, c.owner, c.role, c.node, d.res) if c.id == d.container else c for c in cs]
            elif isinstance(d, AddContainer):
                n = sum(1 for c in cs if c.role is d.placement.role)
                cs.append(Container(f"j/{d.placement.role.value}x{k}{n}", "j", d.placement.role, d.placement.node, d.placement.res))
            elif isinstance(d, RemoveContainer):
                cs = [c for c in cs if c.id != d.container]
    return log, cs


def test_network_bound_job_gets_a_ps():
    log, cs = drive(Nearchus(), 4, containers(), lambda cs, k: 100.0, net=0.95, wnet=0.3, ps_util=0.6)
    first = [d for out in log for d in out][0]
    assert isinstance(first, AddContainer) and first.placement.role is Role.PS
    assert first.placement.node != "n0"  # not onto the saturated NIC of its own PS


def test_no_ps_added_where_no_nic_has_headroom():
    """The PS side is the bottleneck, but no NIC could carry the new shard's share of the
    traffic below saturation: another PS would only take bandwidth from the neighbours."""
    log, _ = drive(Nearchus(), 6, containers(), lambda cs, k: 100.0, net=0.95, wnet=0.5, ps_util=0.6)
    assert not any(isinstance(d, AddContainer) for out in log for d in out)


def test_links_equally_busy_are_not_a_ps_bottleneck():
    """One worker: PS and worker links carry the same bytes, so another PS cannot help."""
    cs = containers(workers=1)
    tie = diagnose(snapshot(60, cs, 100.0, net=0.95, wnet=0.93).running[0],
                   snapshot(60, cs, 100.0, net=0.95, wnet=0.93).telemetry["j"], 0.85, 0.8)
    ps_side = diagnose(snapshot(60, cs, 100.0, net=0.95, wnet=0.4).running[0],
                       snapshot(60, cs, 100.0, net=0.95, wnet=0.4).telemetry["j"], 0.85, 0.8)
    assert tie.bottleneck == "worker_network" and ps_side.bottleneck == "network"


def test_idle_ps_is_trimmed():
    log, cs = drive(Nearchus(), 3, containers(pscores=2.0), lambda cs, k: 100.0, w_util=0.7, ps_util=0.02)
    flat = [d for out in log for d in out]
    assert flat and isinstance(flat[0], Resize) and flat[0].container == "j/ps0" and flat[0].res.cpu == 0.5


def test_compute_bound_job_grows_vertically_then_gets_workers():
    cfg = NearchusConfig(efficiency_threshold=0.5)

    def speed(cs, k):  # Amdahl-like: each step up pays less and less
        cores = sum(c.res.cpu for c in cs if c.role is Role.WORKER)
        return 100.0 * cores ** 0.3

    log, cs = drive(Nearchus(cfg), 20, containers(), speed, w_util=0.95, ps_util=0.6)
    flat = [d for out in log for d in out]
    assert isinstance(flat[0], Resize) and flat[0].res.cpu > 2.0
    assert any(isinstance(d, AddContainer) and d.placement.role is Role.WORKER for d in flat)


def test_change_that_does_not_pay_is_reverted():
    log, cs = drive(Nearchus(), 8, containers(), lambda cs, k: 100.0, w_util=0.95, ps_util=0.6)
    flat = [d for out in log for d in out]
    up = flat[0]
    assert isinstance(up, Resize) and up.res.cpu > 2.0
    back = [d for d in flat[1:] if isinstance(d, Resize) and d.container == up.container]
    assert back and back[0].res.cpu == 2.0


def test_waits_for_stable_speed():
    rng = np.random.default_rng(0)
    speeds = iter([100, 60, 140, 70, 130])
    log, _ = drive(Nearchus(NearchusConfig(max_wait_samples=10)), 5, containers(),
                   lambda cs, k: next(speeds) * (1 + 0.001 * rng.standard_normal()), w_util=0.95)
    assert all(not out for out in log)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), noise=st.floats(0.0, 0.03))
def test_noise_alone_triggers_no_change(seed, noise):
    """A balanced job (nothing saturated, quota binding) only sees noise: no decisions."""
    rng = np.random.default_rng(seed)
    log, _ = drive(Nearchus(), 30, containers(),
                   lambda cs, k: 100.0 * (1 + noise * rng.standard_normal()),
                   w_util=0.7, ps_util=0.6, net=0.3, throttled=0.6)
    assert all(not out for out in log)


def test_idle_unthrottled_workers_are_trimmed():
    log, cs = drive(Nearchus(), 3, containers(wcores=4.0), lambda cs, k: 100.0, w_util=0.2, throttled=0.0)
    flat = [d for out in log for d in out]
    assert flat and all(isinstance(d, Resize) and d.res.cpu < 4.0 for d in flat)


# ------------------------------------------------------------- cluster level (several jobs)
GPU_NODES = tuple(Node(f"g{i}", 16, 65536, gpus=1, nic_gbps=10) for i in range(2))


def _cluster_snap(now, running, queue, speeds, gpu_util=0.95, cpu_util=0.3, extra=()):
    """``running``: {job spec: containers}; every job GPU-bound at ``gpu_util``."""
    every = [c for cs in running.values() for c in cs] + list(extra)  # extra: other tenants' containers
    free = {n.name: n.capacity - sum((c.res for c in every if c.node == n.name), Resources()) for n in GPU_NODES}
    views, tel = [], {}
    for spec, cs in running.items():
        views.append(JobView(spec, JobState.RUNNING, tuple(cs), 0.0, now, 0.0, None))
        ct = {c.id: ContainerTelemetry(c.res.cpu * cpu_util, c.res.cpu, cpu_util if cpu_util > 0.8 else 0.0, 1.0, 10,
                                       gpu_util=gpu_util if c.role is Role.WORKER else 0.0) for c in cs}
        tel[spec.id] = JobTelemetry(now - 60, speeds[spec.id], ct)
    q = tuple(JobView(s, JobState.QUEUED) for s in queue)
    return ClusterSnapshot(now, GPU_NODES, free, q, tuple(views), tel)


@pytest.mark.parametrize("between_intervals", [False, True])
def test_gpu_workers_it_added_are_taken_back_when_a_job_waits_for_a_gpu(between_intervals):
    """Also when the job arrives between telemetry intervals: the round that takes room back
    learns then which jobs run (it skips that work in rounds that need no room)."""
    a = TrainingJob("a", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024, 1.0), max_workers=4)
    b = TrainingJob("b", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024, 1.0))
    cs = [Container("a/ps0", "a", Role.PS, "g0", Resources(1, 1024)),
          Container("a/worker1", "a", Role.WORKER, "g0", Resources(2, 1024, 1.0))]
    pol = Nearchus(NearchusConfig(trim=False, trim_ps=False))
    added = None
    for k in range(1, 8):  # GPU-bound: NEARCHUS adds a worker (the only free GPU is on g1), it pays
        speed = 100.0 * sum(1 for c in cs if c.role is Role.WORKER)
        out = pol.decide(_cluster_snap(60.0 * k, {a: cs}, (), {"a": speed}))
        for d in out:
            if isinstance(d, AddContainer):
                added = Container("a/worker9", "a", d.placement.role, d.placement.node, d.placement.res)
                cs.append(added)
    assert added is not None and added.node == "g1" and added.res.gpu == 1.0
    snap = _cluster_snap(600.0, {a: cs}, (b,), {"a": 200.0})
    if between_intervals:
        pol.decide(_cluster_snap(600.0, {a: cs}, (), {"a": 200.0}))
        snap = replace(snap, now=630.0, telemetry={})
    out = pol.decide(snap)
    assert RemoveContainer("a/worker9") in out
    start = [d for d in out if isinstance(d, StartJob)]
    assert start and start[0].job == "b" and any(p.node == "g1" and p.res.gpu == 1.0 for p in start[0].placements)


def test_room_is_taken_back_for_a_head_whose_ps_and_workers_may_use_different_nodes():
    """The head's PS may run only on g0 and its workers only on g1 (no node takes both): the GPU
    worker NEARCHUS added on g1 is taken back for its worker."""
    a = TrainingJob("a", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024, 1.0), max_workers=4)
    b = TrainingJob("b", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024, 1.0),
                    ps_nodes=frozenset({"g0"}), worker_nodes=frozenset({"g1"}))
    cs = [Container("a/ps0", "a", Role.PS, "g0", Resources(1, 1024)),
          Container("a/worker1", "a", Role.WORKER, "g0", Resources(2, 1024, 1.0))]
    pol = Nearchus(NearchusConfig(trim=False, trim_ps=False))
    for k in range(1, 8):  # GPU-bound: NEARCHUS adds a worker on g1 (the only free GPU), it pays
        speed = 100.0 * sum(1 for c in cs if c.role is Role.WORKER)
        for d in pol.decide(_cluster_snap(60.0 * k, {a: cs}, (), {"a": speed})):
            if isinstance(d, AddContainer):
                cs.append(Container("a/worker9", "a", d.placement.role, d.placement.node, d.placement.res))
    assert cs[-1].id == "a/worker9" and cs[-1].node == "g1"
    out = pol.decide(_cluster_snap(600.0, {a: cs}, (b,), {"a": 200.0}))
    assert RemoveContainer("a/worker9") in out
    start = [d for d in out if isinstance(d, StartJob)]
    assert start and sorted((p.role.value, p.node) for p in start[0].placements) == [("ps", "g0"), ("worker", "g1")]


def test_thin_start_when_the_request_does_not_fit_and_restore_when_the_queue_is_empty():
    big = TrainingJob("big", "resnet50", 0.0, 1e9, 1, 2, Resources(1, 1024), Resources(8, 1024))
    filler = TrainingJob("f", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(12, 1024))
    fc = [Container("f/ps0", "f", Role.PS, "g0", Resources(1, 1024)),
          Container("f/worker0", "f", Role.WORKER, "g0", Resources(12, 1024)),
          Container("f/worker1", "f", Role.WORKER, "g1", Resources(12, 1024))]
    pol = Nearchus(NearchusConfig(restore=True, trim=False, trim_ps=False))
    out = pol.decide(_cluster_snap(0.0, {filler: fc}, (big,), {"f": 100.0}, gpu_util=0.0))
    start = [d for d in out if isinstance(d, StartJob)]
    assert start and all(p.res.cpu < 8 for p in start[0].placements if p.role is Role.WORKER)
    bc = [Container(f"big/{p.role.value}{i}", "big", p.role, p.node, p.res) for i, p in enumerate(start[0].placements)]
    out = pol.decide(_cluster_snap(60.0, {big: bc}, (), {"big": 50.0}, gpu_util=0.0))  # the filler is gone
    grown = [d for d in out if isinstance(d, Resize)]
    adds = [d for d in out if isinstance(d, AddContainer)]
    thin = [c for c in bc if c.role is Role.WORKER]
    assert {d.container for d in grown} == {c.id for c in thin} and all(d.res.cpu == 8 for d in grown)
    assert len(thin) + len(adds) == 2


def test_cpu_growth_while_the_head_waits_only_for_a_gpu():
    """No node has the GPU the head needs: growing a job's CPU takes nothing from it, adding a
    GPU worker would."""
    a = TrainingJob("a", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024, 1.0), max_workers=4)
    b = TrainingJob("b", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024, 1.0))
    cs = [Container("a/ps0", "a", Role.PS, "g0", Resources(1, 1024)),
          Container("a/worker1", "a", Role.WORKER, "g0", Resources(2, 1024, 1.0))]
    other = [Container("o/worker0", "o", Role.WORKER, "g1", Resources(2, 1024, 1.0))]
    for blocked, cfg in ((True, NearchusConfig(trim_ps=False)),
                         (False, NearchusConfig(trim_ps=False, grow_while_gpu_blocked=False))):
        pol = Nearchus(cfg)
        flat = []
        for k in range(1, 4):
            flat += pol.decide(_cluster_snap(60.0 * k, {a: cs}, (b,), {"a": 100.0}, gpu_util=0.3, cpu_util=0.95,
                                             extra=other))
        grew = [d for d in flat if isinstance(d, Resize) and d.res.cpu > 2]
        assert bool(grew) is blocked
        assert not any(isinstance(d, AddContainer) for d in flat)


def test_cpu_growth_while_the_head_waits_for_a_gpu_on_the_nodes_it_may_use():
    """g1's GPU is free, but the head's workers may use only g0: it still waits for a GPU, so
    growing a job's CPU takes nothing from it."""
    a = TrainingJob("a", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024, 1.0), max_workers=4)
    b = TrainingJob("b", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024, 1.0),
                    worker_nodes=frozenset({"g0"}))
    cs = [Container("a/ps0", "a", Role.PS, "g0", Resources(1, 1024)),
          Container("a/worker1", "a", Role.WORKER, "g0", Resources(2, 1024, 1.0))]
    pol = Nearchus(NearchusConfig(trim_ps=False))
    flat = []
    for k in range(1, 4):
        flat += pol.decide(_cluster_snap(60.0 * k, {a: cs}, (b,), {"a": 100.0}, gpu_util=0.3, cpu_util=0.95))
    assert [d for d in flat if isinstance(d, Resize) and d.res.cpu > 2]
    assert not any(isinstance(d, AddContainer | StartJob) for d in flat)


def test_gpu_workers_short_of_cpu_are_input_bound_and_get_cpu():
    """GPU busy 30 %, the workers' CPU 95 % used: the input pipeline starves the GPU. NEARCHUS
    calls it ``input`` (a CPU worker as busy is ``compute``) and upscales the workers' CPU."""
    a = TrainingJob("a", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 1024), Resources(2, 1024, 1.0))
    cs = [Container("a/ps0", "a", Role.PS, "g0", Resources(1, 1024)),
          Container("a/worker1", "a", Role.WORKER, "g0", Resources(2, 1024, 1.0))]
    snap = _cluster_snap(60.0, {a: cs}, (), {"a": 100.0}, gpu_util=0.3, cpu_util=0.95)
    assert diagnose(snap.running[0], snap.telemetry["a"], 0.85, 0.8).bottleneck == "input"
    cpu_only = snapshot(60, containers(workers=1), 100.0, w_util=0.95)
    assert diagnose(cpu_only.running[0], cpu_only.telemetry["j"], 0.85, 0.8).bottleneck == "compute"
    pol = Nearchus(NearchusConfig(trim_ps=False))
    flat = []
    for k in range(1, 4):
        flat += pol.decide(_cluster_snap(60.0 * k, {a: cs}, (), {"a": 100.0}, gpu_util=0.3, cpu_util=0.95))
    assert any(isinstance(d, Resize) and d.container == "a/worker1" and d.res.cpu > 2 for d in flat)


class Unscreened(Nearchus):
    """NEARCHUS taking every measured job through its per-job path."""

    def _may_act(self, t, d):
        return np.ones(len(t.jobs), dtype=bool)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), w_util=st.floats(0.05, 1.0), ps_util=st.floats(0.0, 1.0),
       net=st.floats(0.0, 1.0), wnet=st.floats(0.0, 1.0), throttled=st.sampled_from([0.0, 0.05, 0.5, 0.9]),
       wcores=st.sampled_from([0.5, 1.0, 2.0, 4.0]), pscores=st.sampled_from([0.5, 1.0, 2.0]),
       flags=st.tuples(st.booleans(), st.booleans(), st.booleans()))
@example(seed=1, w_util=0.5, ps_util=0.6, net=0.95, wnet=0.3, throttled=0.5, wcores=2.0, pscores=2.0,
         flags=(True, True, True))  # network-bound: a PS is added
@example(seed=1, w_util=0.2, ps_util=0.6, net=0.2, wnet=0.2, throttled=0.0, wcores=1.0, pscores=1.0,
         flags=(True, True, True))  # a trim of one step (1 → 0.5 cores)
def test_the_screen_passes_over_only_jobs_whose_round_would_change_nothing(seed, w_util, ps_util, net, wnet,
                                                                           throttled, wcores, pscores, flags):
    """Screening the measured jobs as arrays first gives the decisions of taking each through
    the per-job path (evaluate the last change, diagnose, plan, act)."""
    trim, trim_ps, outscale = flags
    cfg = NearchusConfig(trim=trim, trim_ps=trim_ps, outscale=outscale)
    noise = np.random.default_rng(seed).normal(0.0, 0.03, 40)

    def speed(cs, k):  # more worker cores pay, less and less
        return 100.0 * sum(c.res.cpu for c in cs if c.role is Role.WORKER) ** 0.3 * (1 + noise[k])

    kw = dict(w_util=w_util, ps_util=ps_util, net=net, wnet=wnet, throttled=throttled)
    screened, _ = drive(Nearchus(cfg), 30, containers(wcores=wcores, pscores=pscores), speed, **kw)
    every, _ = drive(Unscreened(cfg), 30, containers(wcores=wcores, pscores=pscores), speed, **kw)
    assert screened == every
