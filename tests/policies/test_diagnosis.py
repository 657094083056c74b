"""The diagnosis of a round's readings table against the per-container rules, one job at a time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reamer.domain import Container, ContainerTelemetry, JobState, JobTelemetry, JobView, Resources, Role, TrainingJob
from reamer.domain.readings import ReadingTable
from reamer.policies.diagnosis import Diagnosis, diagnose, diagnose_table


def reference(job: JobView, tel: JobTelemetry, cpu_sat: float, net_sat: float, margin: float) -> Diagnosis:
    """The rules of :mod:`reamer.policies.diagnosis`, container by container."""
    w_util, ps_util, thr, gpu, net, wnet, used, ps_thr = [], [], [], [], 0.0, 0.0, 0.0, 0.0
    for c in job.containers:
        t = tel.containers.get(c.id)
        if t is None:
            continue
        util = t.cpu_used / t.cpu_limit if t.cpu_limit > 0 else 0.0
        link = t.net_gbps / t.net_capacity_gbps if t.net_capacity_gbps > 0 else None
        if c.role is Role.WORKER:
            w_util.append(util)
            thr.append(t.throttled_ratio)
            if c.res.gpu > 0:
                gpu.append(t.gpu_util)
            if link is not None:
                wnet = max(wnet, link)
        else:
            ps_util.append(util)
            ps_thr = max(ps_thr, t.throttled_ratio)
            if link is not None:
                net = max(net, link)
        used += t.cpu_used
    wu = sum(w_util) / len(w_util) if w_util else 0.0
    pu = max(ps_util, default=0.0)
    gu = sum(gpu) / len(gpu) if gpu else 0.0
    if net >= net_sat and net > wnet * (1.0 + margin):
        b = "network"
    elif max(net, wnet) >= net_sat:
        b = "worker_network"
    elif gu >= cpu_sat:
        b = "gpu"
    elif wu >= cpu_sat and wu >= pu:
        b = "input" if gpu else "compute"
    elif pu >= cpu_sat:
        b = "ps"
    else:
        b = "none"
    return Diagnosis(b, wu, sum(thr) / len(thr) if thr else 0.0, gu, pu, net, wnet, used, ps_thr)


share = st.floats(0.0, 1.2)
reading = st.tuples(share, st.sampled_from([0.0, 0.5, 2.0, 7.5]), share, share, st.sampled_from([0.0, 10.0, 25.0]),
                    share, st.booleans())
container = st.tuples(st.sampled_from([Role.PS, Role.WORKER]), st.sampled_from([0.0, 0.5, 1.0]), reading)


@st.composite
def jobs(draw):
    out = []
    for k in range(draw(st.integers(0, 6))):
        spec = TrainingJob(f"j{k}", "resnet50", 0.0, 1e6, 1, 1, Resources(1, 1024), Resources(1, 1024))
        cs, tel = [], {}
        for i, (role, gpus, (u, limit, thr, link, cap, g, has)) in enumerate(draw(st.lists(container, max_size=12))):
            c = Container(f"j{k}/c{i}", spec.id, role, f"n{i % 3}", Resources(limit or 1.0, 1024, gpus))
            cs.append(c)
            if has:
                tel[c.id] = ContainerTelemetry(u * limit, limit, thr, link * cap, cap, 0.0, g)
        view = JobView(spec, JobState.RUNNING, tuple(cs), 0.0, 0.0, 0.0, None)
        out.append((view, JobTelemetry(0.0, 1.0, tel) if draw(st.booleans()) or tel else None))
    return out


@settings(max_examples=200, deadline=None)
@given(jobs(), st.floats(0.5, 1.0), st.floats(0.5, 1.0), st.sampled_from([0.0, 0.1, 0.5]))
def test_every_job_of_a_table_is_diagnosed_as_alone_by_the_rules(js, cpu_sat, net_sat, margin):
    """Up to 12 containers a job (a mean over more than 8 is where a pairwise sum would differ):
    the same bottleneck and the same numbers, to the bit; jobs without telemetry are not in it."""
    running = tuple(v for v, _ in js)
    telemetry = {v.id: t for v, t in js if t is not None}
    table = ReadingTable.of(running, telemetry)
    assert table.jobs == tuple(v.id for v in running if v.id in telemetry)
    d = diagnose_table(table, cpu_sat, net_sat, margin)
    for i, jid in enumerate(table.jobs):
        view = next(v for v in running if v.id == jid)
        want = reference(view, telemetry[jid], cpu_sat, net_sat, margin)
        assert d.at(i) == want
        assert diagnose(view, telemetry[jid], cpu_sat, net_sat, margin) == want
