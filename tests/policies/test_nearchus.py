"""NEARCHUS driven with hand-built snapshots (no backend)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
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
    TrainingJob,
)
from reamer.policies.nearchus import Nearchus, NearchusConfig

SPEC = TrainingJob("j", "resnet50", 0.0, 1e7, 1, 2, Resources(2, 1024), Resources(2, 1024))
NODES = tuple(Node(f"n{i}", 32, 65536, nic_gbps=10) for i in range(3))


def containers(workers=2, ps=1, wcores=2.0, pscores=2.0):
    cs = [Container(f"j/ps{k}", "j", Role.PS, "n0", Resources(pscores, 1024)) for k in range(ps)]
    cs += [Container(f"j/worker{k}", "j", Role.WORKER, f"n{1 + k % 2}", Resources(wcores, 1024)) for k in range(workers)]
    return tuple(cs)


def snapshot(now, cs, speed, w_util=0.5, ps_util=0.2, net=0.2, throttled=None, since=None):
    free = {n.name: n.capacity - sum((c.res for c in cs if c.node == n.name), Resources()) for n in NODES}
    tel = {}
    for c in cs:
        util = w_util if c.role is Role.WORKER else ps_util
        thr = util if throttled is None else throttled
        tel[c.id] = ContainerTelemetry(c.res.cpu * util, c.res.cpu, thr, net * 10, 10)
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
    log, cs = drive(Nearchus(), 4, containers(), lambda cs, k: 100.0, net=0.95)
    first = [d for out in log for d in out][0]
    assert isinstance(first, AddContainer) and first.placement.role is Role.PS


def test_compute_bound_job_grows_vertically_then_gets_workers():
    cfg = NearchusConfig(efficiency_threshold=0.5)

    def speed(cs, k):  # Amdahl-like: each step up pays less and less
        cores = sum(c.res.cpu for c in cs if c.role is Role.WORKER)
        return 100.0 * cores ** 0.3

    log, cs = drive(Nearchus(cfg), 20, containers(), speed, w_util=0.95)
    flat = [d for out in log for d in out]
    assert isinstance(flat[0], Resize) and flat[0].res.cpu > 2.0
    assert any(isinstance(d, AddContainer) and d.placement.role is Role.WORKER for d in flat)


def test_change_that_does_not_pay_is_reverted():
    log, cs = drive(Nearchus(), 8, containers(), lambda cs, k: 100.0, w_util=0.95)
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
                   w_util=0.7, ps_util=0.3, net=0.3, throttled=0.6)
    assert all(not out for out in log)


def test_idle_unthrottled_workers_are_trimmed():
    log, cs = drive(Nearchus(), 3, containers(wcores=4.0), lambda cs, k: 100.0, w_util=0.2, throttled=0.0)
    flat = [d for out in log for d in out]
    assert flat and all(isinstance(d, Resize) and d.res.cpu < 4.0 for d in flat)
