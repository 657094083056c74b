"""The simulator's training backend: observe/actuate over the shared cluster state, driven
by the event loop. It keeps only physics: each job's progress and its step in the speed
model (:mod:`reamer.models.training`), completion events, telemetry and time integrals.
What a decision books (free capacity, containers, ids, validation) is the shared
:class:`~reamer.backends.state.ClusterState`'s.

A job's work is defined at its request on full links (:func:`reamer.workloads.build.request_speed`),
so a trace's job replays at its recorded duration when it runs as requested: the contention it
met is in that duration. The NIC model changes a job's speed only relative to that: a
container's bandwidth is the link's, scaled by the node's flows *as requested* over its flows
*now* (:meth:`SimCluster._bw`). Under ``static`` the two are equal and every job runs at its
recorded speed; when a policy changes a job's shape, it and its neighbours gain or lose.
A job whose containers are all on one node talks in the host: its traffic puts no flow on the
NIC, and its links run at the node's link rate whatever the NIC carries.

Telemetry is the speed model plus seeded multiplicative noise, so policies face noise as on
real machines.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from reamer.backends.sim.views import RunningViews
from reamer.backends.state import ClusterState, Effect, JobRecord, Launch, Reshape, SetQuota, Stop
from reamer.domain import (
    ClusterSnapshot,
    Container,
    Decision,
    JobState,
    JobTelemetry,
    JobView,
    Node,
    Role,
    TrainingJob,
)
from reamer.domain.readings import ROLE_CODE, ReadingTable, TableTelemetry
from reamer.models.training import ZERO_STEP, Calibration, ModelProfile, Step, StepPlan, fraction_of, plan_step
from reamer.models.zoo import ZOO

log = logging.getLogger(__name__)


STEP_MEMO = 65_536  # step plans remembered (_plan) before the memo starts over
_WORKER = Role.WORKER
NOISES_PER_CONTAINER = 4  # telemetry noise factors per container: CPU use, throttling, network, GPU
BURST_GRID = 0.05  # burstable training: a worker's cores above its request, rounded down to this
REFRESH_PASSES = 4  # rounds of re-timing the jobs on nodes whose flows a re-timed job moved
# a node's jobs are re-timed when its bandwidth factor moved by more than this share since they
# were last timed (or came back to exactly 1: flows as requested), well inside telemetry noise
FACTOR_TOLERANCE = 1e-3
NO_FLOWS: tuple[float, tuple, frozenset[str]] = (0.0, (), frozenset())


@dataclass
class _Run:
    """The physics of one job: samples done, its current step, its completion event's version."""

    rec: JobRecord
    done: float = 0.0
    t_last: float = 0.0
    step: Step = ZERO_STEP
    version: int = 0
    tel_since: float = 0.0
    tel_done: float = 0.0
    paused_until: float = 0.0  # checkpoint + restart after a change of its PS/worker set
    base: Step = ZERO_STEP  # its step without CPU contention from co-located inference
    w_ref: float = 0.0  # its network share of a step at its request on full links (flows as requested)
    # the flows it adds: (flow now per container, (node, flow as requested) per container, those nodes)
    flows: tuple[float, tuple[tuple[str, float], ...], frozenset[str]] = NO_FLOWS
    flow_refs: tuple | None = None  # (its (node, flow as requested) per container, their nodes); None: to be rebuilt
    # its containers as the speed model takes them: (the step plan of its workers' and PS' cores,
    # worker nodes, PS nodes); None: to be rebuilt (an effect or a burst changed them)
    shape: tuple | None = None
    base_at: tuple | None = None  # (plan, worker link, PS link, input scale) its base step was made at
    host: float = 0.0  # the link rate of its one node while all its containers are there (in-host), else 0.0
    pipe: bool = False  # its model's GPU workers run an input pipeline (GPU job with a GPU rate)
    cols: _Columns | None = None  # its containers as its readings take them; None: to be rebuilt (an effect changed)
    need_at: tuple = (None, 0.0, 0.0)  # (base step, input scale, cores its workers' input pipeline needs then)
    rates: tuple = (None, None, 0.0, ())  # (step, cols, host link) -> _job_rates of them, kept while they stand


@dataclass
class Totals:
    """Time integrals for utilization (core-seconds, GPU-seconds)."""

    t: float = 0.0
    cpu_used_s: float = 0.0
    gpu_used_s: float = 0.0
    cpu_alloc_s: float = 0.0
    gpu_alloc_s: float = 0.0
    speed_share_s: float = 0.0  # ∫ Σ_running speed / uncontended speed (only with track_share)
    job_s: float = 0.0  # ∫ number of running jobs (only with track_share)


@dataclass(frozen=True, slots=True)
class _Columns:
    """A job's containers as the readings' columns take them (rebuilt when an effect changes them):
    their ids, and per container (row) the ``FIELDS``, row after row in ``rows``."""

    FIELDS = ("kind", "role", "node", "cpu", "gpu", "mem")  # kind 0: a PS, 1: a GPU worker, 2: a CPU worker
    ids: tuple[str, ...]
    rows: tuple[float, ...]
    workers: int

    @classmethod
    def of(cls, containers: Iterable[Container], node_index: Mapping[str, int]) -> _Columns:
        cs = tuple(containers)
        rows = tuple(x for c in cs for x in (0 if c.role is not _WORKER else 2 - (c.res.gpu > 0), ROLE_CODE[c.role],
                                              node_index[c.node], c.res.cpu, c.res.gpu, c.res.mem_mib))
        return cls(tuple(c.id for c in cs), rows, sum(1 for c in cs if c.role is _WORKER))


def _job_rates(st: Step, prof: ModelProfile, cols: _Columns, host: float, burstable: bool) -> tuple[float, ...]:
    """A job's share of the step each kind of container is busy and throttled, and its traffic
    per PS and per worker: (PS busy, GPU-worker busy, GPU-worker throttled, CPU-worker busy,
    GPU busy, worker Gbit/s, PS Gbit/s, host link). A GPU worker runs the input pipeline's
    threads for ``t_pipe``; ``burstable``: GPU workers have no CFS quota, so they are never
    throttled (their pipeline's stall shows as CPU used above the request instead)."""
    bits = 8.0 * prof.param_bytes
    n_w = cols.workers
    n_ps = len(cols.ids) - n_w
    t = st.t if st.speed > 0 else math.inf
    w_busy = st.worker_busy
    if prof.gpu_samples_per_s > 0:
        g_busy = min(1.0, st.t_pipe / t)
        stalls = not burstable and st.t_pipe >= t * (1 - 1e-9)
        g_throttled = g_busy if stalls else 0.0  # the quota stalls the step
    else:
        g_busy = g_throttled = w_busy
    return (st.ps_busy, g_busy, g_throttled, w_busy, st.gpu_busy, 2.0 * bits / t / 1e9,
            2.0 * n_w * bits / max(1, n_ps) / t / 1e9, host)


_BUSY = np.array([0, 1, 3])  # per kind of container: its busy share's column of _job_rates
_THROTTLED = np.array([0, 2, 3])  # and its throttled share's


def _readings(jobs: Sequence[str], since: np.ndarray, speed: np.ndarray, cols: Sequence[_Columns],
              rates: Sequence[tuple[float, ...]], node_bw: np.ndarray, noise: np.ndarray, first: Sequence[int],
              extra: Mapping[str, float] | None = None) -> ReadingTable:
    """The table of the jobs' telemetry (``since``, measured ``speed``) and of every container's
    readings of the interval: its kind's share of its job's step
    (``rates``, :func:`_job_rates`) on the cores it runs on (its CPU limit, plus ``extra`` cores
    where burstable training bursts), scaled by its four noise factors (job ``i``'s containers'
    from ``noise[first[i]:]``, four each); its link's capacity: its job's host link, else its
    node's bandwidth (``node_bw``)."""
    counts = [len(c.ids) for c in cols]
    n = sum(counts)
    start = np.zeros(len(cols) + 1, dtype=int)
    np.cumsum(counts, out=start[1:])
    job = np.repeat(np.arange(len(cols)), counts)

    width = len(_Columns.FIELDS)
    m = np.fromiter(chain.from_iterable([c.rows for c in cols]), float, n * width).reshape(n, width)
    kind, role, node = m[:, :3].astype(int).T
    cpu, gpus, mem = m[:, 3], m[:, 4], m[:, 5]
    r = np.fromiter(chain.from_iterable(rates), float, 8 * len(rates)).reshape(-1, 8)[job]
    rows = np.arange(n)
    pos = np.asarray(first, dtype=int)[job] + NOISES_PER_CONTAINER * (rows - start[job])
    a, b, k, g = (noise[pos + i] for i in range(NOISES_PER_CONTAINER))
    ids = tuple(chain.from_iterable(c.ids for c in cols))
    on = cpu if not extra else cpu + np.fromiter((extra.get(cid, 0.0) for cid in ids), float, n)
    busy = r[rows, _BUSY[kind]]
    throttled = r[rows, _THROTTLED[kind]]
    gpu_worker = kind == 1
    return ReadingTable(
        tuple(jobs), since, speed, start, ids, job, role, gpus, cpu, node, np.ones(n, dtype=bool),
        on * busy * a, cpu, np.minimum(1.0, throttled * b), np.where(kind == 0, r[:, 6], r[:, 5]) * k,
        np.where(r[:, 7] > 0, r[:, 7], node_bw[node]), mem * 0.8,
        np.where(gpu_worker, np.minimum(1.0, r[:, 4] * g), 0.0))


class SimCluster:
    """Implements :class:`reamer.control.Backend` over simulated nodes and jobs."""

    def __init__(
        self,
        nodes: Sequence[Node],
        cal: Calibration,
        rng: np.random.Generator,
        on_change: Callable[[str, float, int], None],
        noise_pct: float = 0.0,
        telemetry_interval_s: float | None = None,
        restart_s: float = 0.0,
        models: Mapping[str, ModelProfile] | None = None,
    ) -> None:
        self.state = ClusterState(nodes)
        self.nodes = self.state.nodes
        # training models by name (the calibrated profile's merged over the zoo; default the zoo)
        self.models: Mapping[str, ModelProfile] = models if models is not None else ZOO
        self.cal = cal
        self.rng = rng
        self.noise = noise_pct / 100.0
        self.on_change = on_change  # (job id, completion time, version) for the event loop
        self.jobs: dict[str, _Run] = {}
        self.cap_cpu = sum(n.cores for n in self.nodes)
        self.cap_gpu = sum(n.gpus for n in self.nodes)
        self.totals = Totals()
        self.cpu_used = self.gpu_used = 0.0
        self.telemetry_interval_s = telemetry_interval_s
        self.restart_s = restart_s
        self.next_telemetry = telemetry_interval_s or math.inf
        # node -> share (< 1) of its CPU demand training gets there while co-located inference
        # over-commits the node (set by backends.sim.inference; empty = no co-location)
        self.contention: dict[str, float] = {}
        self.track_share = False  # integrate speed / uncontended speed (co-location runs)
        # job id -> factor on its model's CPU input-pipeline cost (time-varying training need;
        # set by backends.sim.inference; empty = the zoo's constant cost)
        self.input_scale: dict[str, float] = {}
        self.input_scale_default = 1.0  # a job with no factor yet (started since the last window): the run's need scale
        # burstable training (``inference.training_qos: burstable``, set by
        # backends.sim.inference): a GPU worker's input pipeline, short of CPU at its request,
        # runs on more — out of the cores its node's other training containers leave
        # (node cores − ``burst_reserve``), shared by cpu.shares (:meth:`_burst_node`)
        self.burstable = False
        self.burst_reserve = 0.0
        self.burst: dict[str, float] = {}  # container id -> cores it runs on above its request
        # node -> [Σ of its containers' concurrent flows now, Σ as requested] (_bw), kept up to
        # date as containers come and go and steps change
        self._flows: dict[str, list[float]] = {n.name: [0.0, 0.0] for n in self.nodes}
        # node -> its containers' bandwidth (_bw): the link's × _factor, kept with the flows
        self._node_bw: dict[str, float] = {n.name: n.nic_gbps * self._factor(n.name) for n in self.nodes}
        self._node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self._bw_column = np.array(list(self._node_bw.values()), dtype=float)  # the same, in node order (readings)
        # node -> the bandwidth factor its jobs were last re-timed for (absent: 1.0)
        self._timed: dict[str, float] = {}
        self._plans: dict[tuple, StepPlan] = {}  # the step plans of cores (a job that cannot step: a plan of none)
        # model (or "PS") -> (the most cores the fraction used for its containers was measured
        # at, the most one of them got beyond that): where the speed model extrapolated (_check_range)
        self.extrapolated: dict[str, tuple[float, float]] = {}
        # the views a snapshot shows, kept in the state's queue / running order; a running
        # job's view is rebuilt when telemetry is due or its containers changed (``_reshaped``);
        # ``_stale``: the jobs re-timed or changed since the last snapshot
        self._queued: dict[str, JobView] = {}
        self._queue_view: tuple[JobView, ...] | None = None  # _queued as a snapshot shows it (None: changed)
        self._running = RunningViews()  # in chunks: a snapshot copies only the chunks that changed
        self._stale: set[str] = set()
        self._reshaped: set[str] = set()
        # (node, contended) -> node_use, until a step, burst or container there changes
        self._node_use: dict[tuple[str, bool], float] = {}
        # the model's work so far: re-timings that changed a running job's step; running jobs
        # measured, summed over telemetry rounds
        self.retimings = 0
        self.job_intervals = 0

    # ------------------------------------------------------------------ events
    def arrive(self, spec: TrainingJob, now: float) -> None:
        rec = self.state.submit(spec, now)
        self.jobs[spec.id] = _Run(rec, t_last=now, pipe=self.models[spec.model].gpu_samples_per_s > 0)
        self._queued[spec.id] = rec.view(0.0, now)
        self._queue_view = None

    def due(self, jid: str, version: int) -> bool:
        """Whether the completion event of ``version`` is the job's current one (a re-timing,
        stop or end since supersedes it)."""
        j = self.jobs[jid]
        return j.rec.state is JobState.RUNNING and j.version == version

    def complete(self, jid: str, version: int, now: float) -> bool:
        if not self.due(jid, version):
            return False  # stale completion event
        j = self.jobs[jid]
        self.integrate(now)
        self._progress(j, now)
        nodes = self._released(j, self.state.finish(jid, now))
        self._running.remove(jid)
        if j.rec.spec.duration_s is None:
            j.done = j.rec.spec.samples  # a fixed-duration job keeps the samples it did
        self._refresh(nodes, (), now)
        return True

    # ---------------------------------------------------------------- observe
    def observe(self, now: float) -> ClusterSnapshot:
        with_telemetry = now >= self.next_telemetry
        if with_telemetry:
            self.next_telemetry = now + (self.telemetry_interval_s or math.inf)
        # Between telemetry rounds a view changes only with the job's containers (its progress
        # shows as last measured); a re-timed job's progress is integrated to now all the same,
        # so where the integration is split does not depend on which views a round rebuilds.
        views = self._running
        shown = self._reshaped
        for jid in self.state.running if with_telemetry else self._stale:
            if jid in views:
                j = self.jobs[jid]
                self._progress(j, now)
                if with_telemetry or jid in shown:
                    views.set(jid, j.rec.view(j.done, now))
        self._stale.clear()
        shown.clear()
        queue = self._queue_view
        if queue is None:
            queue = self._queue_view = tuple(self._queued.values())
        running = views.snapshot()
        tel, table = self._measure(now) if with_telemetry else ({}, None)
        return self.state.snapshot(now, queue, running, tel, table, with_telemetry)

    def _measure(self, now: float) -> tuple[Mapping[str, JobTelemetry], ReadingTable]:
        """Telemetry of each running job over its last interval, with seeded noise (one factor
        per job and four per container, drawn at once), as a table and as the per-job mapping
        made from it. A job in its restart pause reports nothing, and its speed counts from the
        end of the pause: on the local backend its workers are down, and the speed comes from
        their reports once back."""
        ids, cols, rates, progress, n, jobs = [], [], [], [], 0, self.jobs
        models, burstable = self.models, self.burstable
        for jid in self.state.running:
            j = jobs[jid]
            since = j.paused_until if j.paused_until > j.tel_since else j.tel_since
            if now > since:
                c = j.cols
                if c is None:
                    c = j.cols = _Columns.of(j.rec.containers.values(), self._node_index)
                st, was, host, r = j.rates
                if st is not j.step or was is not c or host != j.host:
                    r = _job_rates(j.step, models[j.rec.spec.model], c, j.host, burstable)
                    j.rates = (j.step, c, j.host, r)
                ids.append(jid)
                cols.append(c)
                rates.append(r)
                progress.append((j.done - j.tel_done, now - since, since, n))
                n += 1 + NOISES_PER_CONTAINER * len(c.ids)
                j.tel_since, j.tel_done = now, j.done
        self.job_intervals += len(ids)
        noise = self._factors(n)
        cols4 = np.fromiter(chain.from_iterable(progress), float, 4 * len(progress))
        done, dt, since_s, k = cols4.reshape(4, -1, order="F")  # (per job: progress, interval, since, noise index)
        first = k.astype(int)
        speed = np.maximum(0.0, done / dt * noise[first])
        table = _readings(ids, since_s, speed, cols, rates, self._bw_column, noise, first + 1, self.burst)
        return TableTelemetry(table), table

    def _factors(self, n: int) -> np.ndarray:
        """``n`` multiplicative noise factors, max(0, 1 + noise × N(0, 1))."""
        if not self.noise:
            return np.ones(n)
        return np.maximum(0.0, 1.0 + self.noise * self.rng.standard_normal(n))

    # ---------------------------------------------------------------- actuate
    def actuate(self, decisions: Sequence[Decision], now: float) -> None:
        """Book each decision in the shared state (which validates it), carry out its effect,
        then re-time every job whose speed it may change."""
        if not decisions:
            return
        self.integrate(now)
        nodes: set[str] = set()
        jobs: set[str] = set()
        for d in decisions:
            e = self.state.apply(d, now)
            touched = self._carry(e, now)
            nodes |= touched
            if not isinstance(e, Stop):
                jobs.add(e.job)
        self._refresh(nodes, jobs, now)

    def _carry(self, e: Effect, now: float) -> set[str]:
        """The physics of one effect; returns the nodes it touched."""
        j = self.jobs[e.job]
        j.shape = j.cols = j.flow_refs = None
        j.host = self._host_link(j)
        if not isinstance(e, Stop):
            self._check_range(j)
            self._reshaped.add(e.job)
        if isinstance(e, Launch):
            j.t_last = j.tel_since = now
            j.tel_done = j.done
            j.w_ref = self._reference_flow(j, e.containers)
            self._set_flows(j)
            del self._queued[e.job]
            self._queue_view = None
            self._running.add(e.job)
            self._stale.add(e.job)
            spec, started = j.rec.spec, j.rec.started_s
            if spec.duration_s is not None and started is not None:  # ends at its first start + duration
                j.version += 1
                self.on_change(spec.id, max(now, started + spec.duration_s), j.version)
            return {c.node for c in e.containers}
        self._progress(j, now)
        if isinstance(e, SetQuota):
            return {e.container.node}
        if isinstance(e, Reshape):
            for c in e.removed:
                self.burst.pop(c.id, None)
            self._set_flows(j)
            j.paused_until = now + self.restart_s
            return {c.node for c in (*e.added, *e.removed)}
        # Stop: preempted, its progress kept (checkpoint); the completion event goes stale
        nodes = self._released(j, e)
        j.version += 1
        self._running.remove(e.job)
        self._queued[e.job] = j.rec.view(j.done, j.t_last)
        self._queue_view = None
        return nodes

    def _released(self, j: _Run, e: Stop) -> set[str]:
        self._account(j, ZERO_STEP)
        self._set_flows(j)  # its containers are gone: its flows too
        j.base, j.base_at = ZERO_STEP, None
        for c in e.containers:
            self.burst.pop(c.id, None)
        return {c.node for c in e.containers}

    # ------------------------------------------------------------- dynamics
    def _bw(self, c: Container) -> float:
        """A container's bandwidth: its link's, times the node's concurrent flows as requested
        over its flows now (:meth:`_set_flows`). Equal sums give the full link — the speed a
        trace's record implies; more flows than requested share it, fewer leave more."""
        return self._node_bw[c.node]

    def _set_flows(self, j: _Run) -> None:
        """Put the job's flows on its nodes' sums, in place of those it had there. Each PS/worker
        container is on the network for its job's ``net_busy`` share of a step: now, as of the
        job's current step (before its first: its request's); as requested, the share at its
        request on full links, for as many containers of each role as it requested (spread
        over those it has, so that a job given a second PS adds flows but not requested ones)."""
        if j.host and j.flows is NO_FLOWS:  # its traffic stays in its host, as it did
            return
        flows = self._flows
        w_old, refs_old, old_nodes = j.flows
        for node, ref in refs_old:
            f = flows[node]
            f[0] -= w_old
            f[1] -= ref
        containers = j.rec.containers.values()
        if not containers or j.host:
            j.flows = NO_FLOWS
            self._set_bw(old_nodes)
            return
        if j.flow_refs is None:
            spec = j.rec.spec
            n_ps = sum(1 for c in containers if c.role is Role.PS)
            n_w = len(containers) - n_ps
            ref_ps = j.w_ref * (spec.ps / n_ps) if n_ps else 0.0
            ref_w = j.w_ref * (spec.workers / n_w) if n_w else 0.0
            refs = tuple((c.node, ref_ps if c.role is Role.PS else ref_w) for c in containers)
            j.flow_refs = (refs, frozenset(node for node, _ in refs))
        refs, nodes = j.flow_refs
        w = j.step.net_busy if j.step.speed > 0 else j.w_ref
        for node, ref in refs:
            f = flows[node]
            f[0] += w
            f[1] += ref
        j.flows = (w, refs, nodes)
        self._set_bw(nodes if old_nodes is nodes else old_nodes | nodes)

    def _host_link(self, j: _Run) -> float:
        """The link rate of the job's one node when all its containers are there (their traffic
        stays in the host); 0.0 when they span nodes (their traffic is on the NIC) or it has none."""
        nodes = {c.node for c in j.rec.containers.values()}
        return self.state.node_by_name[nodes.pop()].nic_gbps if len(nodes) == 1 else 0.0

    def _set_bw(self, nodes: Iterable[str]) -> None:
        by_name, bw, column, index, flows = (self.state.node_by_name, self._node_bw, self._bw_column,
                                             self._node_index, self._flows)
        for node in nodes:
            now_, ref = flows[node]  # its _factor, inline: a call per node and flow change costs
            bw[node] = column[index[node]] = by_name[node].nic_gbps * (max(1.0, ref) / max(1.0, now_))

    def _factor(self, node: str) -> float:
        """The node's flows as requested over its flows now (each counted at least 1)."""
        now_, ref = self._flows[node]
        return max(1.0, ref) / max(1.0, now_)

    def _reference_flow(self, j: _Run, containers: Sequence[Container]) -> float:
        """The job's network share of a step at its request on full links: what each of its
        containers adds to the flows of its node as requested."""
        spec = j.rec.spec
        nic = min(self.state.node_by_name[c.node].nic_gbps for c in containers)
        w, p = spec.worker_res, spec.ps_res
        plan = self._plan(spec.model, spec.batch, ((w.cpu, w.gpu, None),) * spec.workers, ((p.cpu, None),) * spec.ps)
        return plan.at(nic, nic).net_busy

    def _progress(self, j: _Run, now: float) -> None:
        """Advance a job's samples to ``now`` at its current speed (called for running jobs,
        and for a job being stopped before its step is zeroed)."""
        start = max(j.t_last, j.paused_until)
        if now > start:
            spec = j.rec.spec
            done = j.done + j.step.speed * (now - start)
            j.done = min(spec.samples, done) if spec.duration_s is None else done
        j.t_last = now

    def _account(self, j: _Run, new: Step) -> None:
        """Swap the job's contribution to the cluster-wide used/allocated rates and to the flows
        of its nodes."""
        old = j.step
        self.cpu_used += new.cpu_used - old.cpu_used
        self.gpu_used += new.gpu_used - old.gpu_used
        j.step = new
        for c in j.rec.containers.values():
            self._node_use.pop((c.node, True), None)
        if new.net_busy != old.net_busy or (new.speed > 0) != (old.speed > 0):
            self._set_flows(j)

    def _refresh(self, nodes: Iterable[str], jobs: Iterable[str], now: float, contended: bool = False) -> None:
        """Re-time ``jobs``, then every job on a node among ``nodes`` (or among the re-timed
        jobs' nodes) whose bandwidth factor moved by more than ``FACTOR_TOLERANCE`` since its
        jobs were last timed: a node whose flows are still as requested leaves its jobs as they
        are. A re-timed job's new flows move its nodes' factors in turn: repeated up to
        ``REFRESH_PASSES`` times. Bursts are re-shared on ``nodes`` (unless only their
        ``contended`` shares moved: a burst is of the uncontended step) and wherever a job's
        uncontended step moved."""
        check = set(nodes)
        burst = set() if contended else set(check)
        todo = sorted(set(jobs))
        owner, on_node, timed = self.state.owner, self.state.on_node, self._timed
        for _ in range(REFRESH_PASSES):
            for jid in todo:
                j = self.jobs[jid]
                base = j.base
                if self._retime(jid, now):
                    check.update(c.node for c in j.rec.containers.values())
                if j.base is not base and j.base != base:
                    burst.update(c.node for c in j.rec.containers.values())
            for node in burst:  # its containers, their bursts or uncontended steps moved
                self._node_use.pop((node, False), None)
                self._node_use.pop((node, True), None)
            more: set[str] = set()
            if self.burstable:
                for node in sorted(burst):
                    more |= self._burst_node(node)
            for node in check:
                f = self._factor(node)
                was = timed.get(node, 1.0)
                if f != was and (f == 1.0 or abs(f - was) > FACTOR_TOLERANCE * was):
                    if f == 1.0:
                        timed.pop(node, None)
                    else:
                        timed[node] = f
                    more.update(owner[c] for c in on_node[node])
            if not more:
                return
            todo, check, burst = sorted(more), set(), set()

    def _cores(self, c: Container) -> float:
        """The cores a container runs on: its CPU limit, plus its burst (burstable training)."""
        return c.res.cpu + self.burst.get(c.id, 0.0)

    def _extra_need(self, c: Container) -> float:
        """Cores a GPU worker's input pipeline needs above its request not to stall its step
        (0: none, or not a GPU worker): the effective cores ``batch × CPU per sample / rest``
        (``rest``: the step without the stall), as cores by the inverse of Amdahl's law at its
        model's fraction; a pipeline no number of cores keeps fed wants the whole node."""
        if c.role is not _WORKER or c.res.gpu <= 0:
            return 0.0
        j = self.jobs[c.owner]
        spec, st = j.rec.spec, j.base
        scale = self.input_scale.get(spec.id, self.input_scale_default)
        at = j.need_at
        if at[0] is st and at[1] == scale:  # its workers share one need
            return max(0.0, at[2] - c.res.cpu)
        model = self.models[spec.model]
        need = 0.0
        if model.gpu_samples_per_s > 0 and st.speed > 0:
            rest = st.gpu_busy * st.t + st.t_net + st.t_ps
            work = spec.batch * model.input_core_s_per_sample * scale
            f = fraction_of(model, self.cal)[0]
            e = work / rest if rest > 0 else math.inf
            if e <= 1.0:
                need = e
            else:
                inv = 1.0 / e - (1.0 - f)
                need = f / inv if inv > 0 else math.inf
        j.need_at = (st, scale, need)
        return max(0.0, need - c.res.cpu)

    def _burst_node(self, node: str) -> set[str]:
        """Share the cores a node's training containers leave (cores − ``burst_reserve`` − what
        the others use − the bursting ones' requests) among its input-bound GPU workers by
        weighted max-min fairness, their requests as weights (the CFS with cpu.shares and no
        limit), each up to its :meth:`_extra_need`; bursts are rounded down to 0.05 cores.
        Returns the jobs whose bursts changed."""
        containers = self.state.containers_on(node)
        avail = self.state.node_by_name[node].cores - self.burst_reserve
        wants: list[tuple[Container, float]] = []
        for c, use in zip(containers, self.container_uses(containers), strict=True):
            extra = self._extra_need(c)
            if extra > BURST_GRID:
                wants.append((c, extra))
                avail -= c.res.cpu
            else:
                avail -= use
        got = dict.fromkeys((c.id for c, _ in wants), 0.0)
        left, open_ = max(0.0, avail), list(wants)
        while open_ and left > 1e-9:  # water-filling: an equal share per weight, the satisfied leave
            w = sum(c.res.cpu for c, _ in open_)
            share = left / w
            done = [(c, x) for c, x in open_ if x - got[c.id] <= share * c.res.cpu]
            if not done:
                for c, _ in open_:
                    got[c.id] += share * c.res.cpu
                break
            for c, x in done:
                left -= x - got[c.id]
                got[c.id] = x
            finished = {c.id for c, _ in done}
            open_ = [(c, x) for c, x in open_ if c.id not in finished]
        changed: set[str] = set()
        for c in containers:
            g = got.get(c.id)
            b = 0.0 if g is None else round(math.floor(g / BURST_GRID + 1e-9) * BURST_GRID, 4)
            if b != self.burst.get(c.id, 0.0):
                if b > 0:
                    self.burst[c.id] = b
                else:
                    self.burst.pop(c.id, None)
                changed.add(c.owner)
                self.jobs[c.owner].shape = None
        return changed

    def _retime(self, jid: str, now: float) -> bool:
        """Recompute a running job's step and its completion event; True if its step changed."""
        j = self.jobs[jid]
        if j.rec.state is not JobState.RUNNING:
            return False
        self._progress(j, now)
        self._stale.add(jid)
        plan, bw_w, bw_ps, scale, k = self._inputs(j)
        at = (plan, bw_w, bw_ps, scale)
        if at != j.base_at:  # its plan, links or input cost moved (not only its contention)
            j.base, j.base_at = plan.at(bw_w, bw_ps, scale), at
        new = self._contend(j.base, k)
        if new.speed == j.step.speed and new.cpu_used == j.step.cpu_used and j.paused_until <= now:
            if new != j.step:
                self._account(j, new)
            return False
        self._account(j, new)
        self.retimings += 1
        spec = j.rec.spec
        if spec.duration_s is not None:
            return True  # it ends at its first start + duration whatever its speed: the event of its launch stands
        j.version += 1
        left = spec.samples - j.done
        eta = max(now, j.paused_until) + left / new.speed if new.speed > 0 else math.inf
        self.on_change(jid, eta, j.version)
        return True

    def _inputs(self, j: _Run) -> tuple:
        """What the job's step is computed from: the plan of its workers' (cores, GPUs, threads)
        and PS' (cores, threads), its slowest worker and PS links, its input-cost factor and the
        contention share of its most contended node."""
        shape = j.shape
        if shape is None:
            workers, ps, w_nodes, ps_nodes = [], [], set(), set()
            for c in j.rec.containers.values():
                if c.role is Role.WORKER:
                    workers.append((self._cores(c), c.res.gpu, None))
                    w_nodes.add(c.node)
                else:
                    ps.append((c.res.cpu, None))
                    ps_nodes.add(c.node)
            spec = j.rec.spec
            plan = self._plan(spec.model, spec.batch, tuple(workers), tuple(ps))
            shape = j.shape = (plan, tuple(w_nodes), tuple(ps_nodes))
        plan, w_nodes, ps_nodes = shape
        if j.host:
            bw_w = bw_ps = j.host
        else:
            bw = self._node_bw
            bw_w = min([bw[n] for n in w_nodes]) if w_nodes else math.inf
            bw_ps = min([bw[n] for n in ps_nodes]) if ps_nodes else math.inf
        k = 1.0
        if self.contention:
            k = min((self.contention.get(n, 1.0) for n in (*w_nodes, *ps_nodes)), default=1.0)
        return plan, bw_w, bw_ps, self.input_scale.get(j.rec.spec.id, self.input_scale_default), k

    def _plan(self, model: str, batch: int, workers: tuple, ps: tuple) -> StepPlan:
        """The speed model's plan of a job's cores (:func:`reamer.models.training.plan_step`;
        workers as (cores, GPUs, threads), PS as (cores, threads)), which :meth:`StepPlan.at`
        finishes for its links and input cost. Remembered per model and cores (jobs of one
        request share it); bounded: forgotten wholesale when large."""
        key = (model, batch, workers, ps)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= STEP_MEMO:
                self._plans.clear()
            plan = self._plans[key] = plan_step(self.models[model], self.cal, batch, workers, ps)
        return plan

    def _check_range(self, j: _Run) -> None:
        """Note a job's containers (as an effect leaves them) on more cores than the parallel
        fraction the speed model uses for them was measured at
        (:func:`~reamer.models.training.fraction_of` for its model's workers, the machine's for
        every PS, noted as ``PS``), logged once per name; the run's result carries the notes
        (``RunResult.extrapolated``), and the CLI's tables show them."""
        model = j.rec.spec.model
        top_w = top_ps = 0.0
        for c in j.rec.containers.values():
            if c.role is Role.WORKER:
                top_w = max(top_w, c.res.cpu)
            else:
                top_ps = max(top_ps, c.res.cpu)
        for name, (f, limit), top in ((model, fraction_of(self.models[model], self.cal), top_w),
                                      ("PS", (self.cal.parallel_fraction, self.cal.max_cores), top_ps)):
            if limit is None or top <= self.extrapolated.get(name, (limit, limit))[1]:
                continue
            if name not in self.extrapolated:
                log.info("%s: containers of %g cores, but the parallel fraction %.3g the speed model uses for them "
                         "was measured up to %g cores; it extrapolates", name, top, f, limit)
            self.extrapolated[name] = (float(limit), float(top))

    @staticmethod
    def _contend(base: Step, k: float) -> Step:
        """The job's step under CPU contention: synchronous training runs at the pace of its
        most contended container (``k``: the share of its CPU demand its most contended node
        gives it); a GPU job whose input pipeline gets a share ``k`` of the CPU it uses slows
        to ``k`` of its speed (its use is what sustains that speed)."""
        if k >= 1.0:
            return base
        return Step(base.t_comp, base.t_net, base.t_ps, base.speed * k, base.worker_busy * k, base.ps_busy * k,
                    base.net_busy * k, base.gpu_busy * k, base.t_pipe, base.cpu_used * k, base.gpu_used * k)

    def set_contention(self, factors: dict[str, float], now: float) -> None:
        """Set the per-node contention shares (nodes absent: none) and re-time affected jobs."""
        changed = {n for n in set(factors) | set(self.contention) if factors.get(n, 1.0) != self.contention.get(n, 1.0)}
        if not changed:
            return
        self.integrate(now)
        self.contention = {n: k for n, k in factors.items() if k < 1.0}
        owner, on_node = self.state.owner, self.state.on_node
        self._refresh(changed, {owner[c] for n in changed for c in on_node[n]}, now, contended=True)

    def set_input_scale(self, scales: dict[str, float], now: float) -> None:
        """Set per-job factors on the input-pipeline cost (a job's CPU need) and re-time them."""
        d = self.input_scale_default
        changed = {k for k in set(scales) | set(self.input_scale) if scales.get(k, d) != self.input_scale.get(k, d)}
        if not changed:
            return
        self.integrate(now)
        self.input_scale = dict(scales)
        self._refresh((), changed, now)

    def container_uses(self, containers: Iterable[Container], contended: bool = False) -> list[float]:
        """Cores each training container keeps busy on average (no noise), at its job's base
        step (what it needs) or, with ``contended``, at its current step (what it gets)."""
        jobs, worker, out = self.jobs, Role.WORKER, []
        for c in containers:
            j = jobs[c.owner]
            st = j.step if contended else j.base
            if st.speed <= 0:
                out.append(0.0)
                continue
            res = c.res
            if c.role is worker:
                if res.gpu > 0 and j.pipe:  # its cores (its burst too) × the share its input pipeline is busy
                    use = self._cores(c) * min(1.0, st.t_pipe / st.t)
                    out.append(use * (st.speed / j.base.speed) if contended else use)
                else:
                    out.append(res.cpu * st.worker_busy)
            else:
                out.append(res.cpu * st.ps_busy)
        return out

    def node_use(self, node: str, contended: bool = False) -> float:
        """Cores the training containers on ``node`` keep busy (:meth:`container_uses` summed;
        remembered until a step, burst or container there changes)."""
        key = (node, contended)
        use = self._node_use.get(key)
        if use is None:
            use = self._node_use[key] = sum(self.container_uses(self.state.containers_on(node), contended))
        return use

    def samples_trained(self, until: float) -> float:
        """Samples every job has trained by ``until`` (≥ the last event; the running ones are
        advanced to it: call it once the run is over)."""
        running = self.state.running
        for jid, j in self.jobs.items():
            if jid in running:
                self._progress(j, until)
        return sum(j.done for j in self.jobs.values())

    def speed_share(self) -> tuple[float, int]:
        """(Σ over running jobs of speed / uncontended speed, number of running jobs)."""
        tot, n = 0.0, 0
        for jid in self.state.running:
            j = self.jobs[jid]
            if j.base.speed > 0:
                tot += j.step.speed / j.base.speed
                n += 1
        return tot, n

    def integrate(self, now: float) -> None:
        """Advance the utilization integrals to ``now``."""
        t = self.totals
        dt = now - t.t
        if dt > 0:
            t.cpu_used_s += self.cpu_used * dt
            t.gpu_used_s += self.gpu_used * dt
            t.cpu_alloc_s += self.state.cpu_alloc * dt
            t.gpu_alloc_s += self.state.gpu_alloc * dt
            if self.track_share:
                share, n = self.speed_share()
                t.speed_share_s += share * dt
                t.job_s += n * dt
            t.t = now
