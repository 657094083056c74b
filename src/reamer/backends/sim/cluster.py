"""The simulator's training backend: observe/actuate over the shared cluster state, driven
by the event loop. It keeps only physics: each job's progress and its step in the speed
model (:mod:`reamer.models.training`), completion events, telemetry and time integrals.
What a decision books (free capacity, containers, ids, validation) is the shared
:class:`~reamer.backends.state.ClusterState`'s.

Telemetry is the speed model plus seeded multiplicative noise, so policies face noise as on
real machines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from reamer.backends.state import ClusterState, Effect, JobRecord, Launch, Reshape, SetQuota, Stop
from reamer.domain import (
    ClusterSnapshot,
    Container,
    ContainerTelemetry,
    Decision,
    JobState,
    JobTelemetry,
    JobView,
    Node,
    Role,
    TrainingJob,
)
from reamer.models.training import ZERO_STEP, Calibration, ModelProfile, Side, Step, step
from reamer.models.zoo import ZOO, gpu_factor


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
    view: JobView | None = None
    paused_until: float = 0.0  # checkpoint + restart after a change of its PS/worker set
    base: Step = ZERO_STEP  # its step without CPU contention from co-located inference


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
        # node -> Σ of its containers' concurrent flows (_bw), dropped when one of them changes
        self._active: dict[str, float] = {}

    # ------------------------------------------------------------------ events
    def arrive(self, spec: TrainingJob, now: float) -> None:
        self.jobs[spec.id] = _Run(self.state.submit(spec, now), t_last=now)

    def complete(self, jid: str, version: int, now: float) -> bool:
        j = self.jobs[jid]
        if j.rec.state is not JobState.RUNNING or j.version != version:
            return False  # stale completion event
        self.integrate(now)
        self._progress(j, now)
        nodes = self._released(j, self.state.finish(jid, now))
        if j.rec.spec.duration_s is None:
            j.done = j.rec.spec.samples  # a fixed-duration job keeps the samples it did
        self._refresh(nodes, set(), now)
        return True

    # ---------------------------------------------------------------- observe
    def observe(self, now: float) -> ClusterSnapshot:
        with_telemetry = now >= self.next_telemetry
        if with_telemetry:
            self.next_telemetry = now + (self.telemetry_interval_s or math.inf)
        running = []
        for jid in self.state.running:
            j = self.jobs[jid]
            if j.view is None or with_telemetry:
                self._progress(j, now)
                j.view = j.rec.view(j.done, now)
            running.append(j.view)
        queue = []
        for jid in self.state.queue:
            j = self.jobs[jid]
            if j.view is None:
                j.view = j.rec.view(j.done, j.t_last)
            queue.append(j.view)
        tel = self._measure(now) if with_telemetry else {}
        return self.state.snapshot(now, queue, running, tel)

    def _measure(self, now: float) -> dict[str, JobTelemetry]:
        """Telemetry of each running job over its last interval, with seeded noise. A job in its
        restart pause reports nothing, and its speed counts from the end of the pause: on the
        local backend its workers are down, and the speed comes from their reports once back."""
        out = {}
        for jid in self.state.running:
            j = self.jobs[jid]
            since = max(j.tel_since, j.paused_until)
            dt = now - since
            if dt <= 0:
                continue
            speed = (j.done - j.tel_done) / dt * self._noise()
            out[jid] = JobTelemetry(since, max(0.0, speed), self._container_telemetry(j))
            j.tel_since, j.tel_done = now, j.done
        return out

    def _noise(self) -> float:
        return max(0.0, 1.0 + self.noise * float(self.rng.standard_normal())) if self.noise else 1.0

    def _container_telemetry(self, j: _Run) -> dict[str, ContainerTelemetry]:
        st = j.step
        prof = self.models[j.rec.spec.model]
        bits = 8.0 * prof.param_bytes
        containers = j.rec.containers.values()
        ws = [c for c in containers if c.role is Role.WORKER]
        ps = [c for c in containers if c.role is Role.PS]
        out = {}
        t = st.t if st.speed > 0 else math.inf
        for c in containers:
            if c.role is Role.WORKER:
                if c.res.gpu > 0 and prof.gpu_samples_per_s > 0:
                    busy = min(1.0, st.t_pipe / t)  # the pipeline runs its threads for t_pipe
                    throttled = busy if st.t_pipe >= t * (1 - 1e-9) else 0.0  # stalls the step
                else:
                    busy = throttled = st.worker_busy
                traffic = 2.0 * bits / t
            else:
                busy = throttled = st.ps_busy
                traffic = 2.0 * len(ws) * bits / max(1, len(ps)) / t
            out[c.id] = ContainerTelemetry(
                cpu_used=c.res.cpu * busy * self._noise(),
                cpu_limit=c.res.cpu,
                throttled_ratio=min(1.0, throttled * self._noise()),
                net_gbps=traffic / 1e9 * self._noise(),
                net_capacity_gbps=self._bw(c),
                mem_used_mib=c.res.mem_mib * 0.8,
                gpu_util=min(1.0, st.gpu_busy * self._noise()) if c.res.gpu > 0 and c.role is Role.WORKER else 0.0,
            )
        return out

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
            self._changed(touched)
            nodes |= touched
            if not isinstance(e, Stop):
                jobs.add(e.job)
        self._refresh(nodes, jobs, now)

    def _carry(self, e: Effect, now: float) -> set[str]:
        """The physics of one effect; returns the nodes it touched."""
        j = self.jobs[e.job]
        if isinstance(e, Launch):
            j.t_last = j.tel_since = now
            j.tel_done = j.done
            spec, started = j.rec.spec, j.rec.started_s
            if spec.duration_s is not None and started is not None:  # ends at its first start + duration
                j.version += 1
                self.on_change(spec.id, max(now, started + spec.duration_s), j.version)
            return {c.node for c in e.containers}
        self._progress(j, now)
        if isinstance(e, SetQuota):
            return {e.container.node}
        if isinstance(e, Reshape):
            j.paused_until = now + self.restart_s
            return {c.node for c in (*e.added, *e.removed)}
        # Stop: preempted, its progress kept (checkpoint); the completion event goes stale
        nodes = self._released(j, e)
        j.version += 1
        j.view = None
        return nodes

    def _released(self, j: _Run, e: Stop) -> set[str]:
        self._account(j, ZERO_STEP)
        j.base = ZERO_STEP
        nodes = {c.node for c in e.containers}
        self._changed(nodes)
        return nodes

    # ------------------------------------------------------------- dynamics
    def _bw(self, c: Container) -> float:
        """A container's share of its node's NIC: fair share among the flows active at once.

        Each PS/worker container is on the network for its job's ``net_busy`` share of a
        step (as of the job's current speed; a new container counts as always active), so
        the node carries ``Σ net_busy`` concurrent flows on average.
        """
        active = self._active.get(c.node)
        if active is None:  # summed once per node until a step or a container there changes
            active = 0.0
            owner = self.state.owner
            for cid in self.state.on_node[c.node]:
                st = self.jobs[owner[cid]].step
                active += st.net_busy if st.speed > 0 else 1.0
            self._active[c.node] = active
        return self.state.node_by_name[c.node].nic_gbps / max(1.0, active)

    def _changed(self, nodes) -> None:
        """Forget the flow sums of ``nodes``: a container or a job's step there changed."""
        for n in nodes:
            self._active.pop(n, None)

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
        """Swap the job's contribution to the cluster-wide used/allocated rates."""
        old = j.step
        self.cpu_used += new.cpu_used - old.cpu_used
        self.gpu_used += new.gpu_used - old.gpu_used
        j.step = new
        self._changed(c.node for c in j.rec.containers.values())

    def _refresh(self, nodes: set[str], jobs: set[str], now: float) -> None:
        """Recompute the speed of ``jobs`` and of every job with a container on ``nodes``."""
        jids = set(jobs)
        owner = self.state.owner
        for node in nodes:
            jids.update(owner[c] for c in self.state.on_node[node])
        for jid in sorted(jids):
            j = self.jobs[jid]
            if j.rec.state is not JobState.RUNNING:
                continue
            self._progress(j, now)
            j.base = self._speed(j)
            new = self._contend(j, j.base)
            j.view = None
            if new.speed == j.step.speed and new.cpu_used == j.step.cpu_used and j.paused_until <= now:
                continue
            self._account(j, new)
            j.version += 1
            spec = j.rec.spec
            if spec.duration_s is not None:
                started = j.rec.started_s
                eta = max(now, (now if started is None else started) + spec.duration_s)
            else:
                left = spec.samples - j.done
                eta = max(now, j.paused_until) + left / new.speed if new.speed > 0 else math.inf
            self.on_change(jid, eta, j.version)

    def _speed(self, j: _Run) -> Step:
        spec = j.rec.spec
        prof = self.models[spec.model]
        if self.input_scale and spec.id in self.input_scale:
            prof = replace(prof, input_core_s_per_sample=prof.input_core_s_per_sample * self.input_scale[spec.id])
        workers, ps = [], []
        for c in j.rec.containers.values():
            node = self.state.node_by_name[c.node]
            side = Side(c.res.cpu, self._bw(c), c.res.gpu, None, gpu_factor(node.gpu_model))
            (workers if c.role is Role.WORKER else ps).append(side)
        return step(prof, self.cal, spec.batch, workers, ps)

    def _contend(self, j: _Run, base: Step) -> Step:
        """The job's step under CPU contention: synchronous training runs at the pace of its
        most contended container; a GPU job whose input pipeline gets a share ``k`` of the CPU
        it uses slows to ``k`` of its speed (its use is what sustains that speed)."""
        if not self.contention:
            return base
        k = min((self.contention.get(c.node, 1.0) for c in j.rec.containers.values()), default=1.0)
        if k >= 1.0:
            return base
        return replace(base, speed=base.speed * k, cpu_used=base.cpu_used * k, gpu_used=base.gpu_used * k,
                       worker_busy=base.worker_busy * k, ps_busy=base.ps_busy * k, net_busy=base.net_busy * k,
                       gpu_busy=base.gpu_busy * k)

    def set_contention(self, factors: dict[str, float], now: float) -> None:
        """Set the per-node contention shares (nodes absent: none) and re-time affected jobs."""
        changed = {n for n in set(factors) | set(self.contention) if factors.get(n, 1.0) != self.contention.get(n, 1.0)}
        if not changed:
            return
        self.integrate(now)
        self.contention = {n: k for n, k in factors.items() if k < 1.0}
        self._refresh(changed, set(), now)

    def set_input_scale(self, scales: dict[str, float], now: float) -> None:
        """Set per-job factors on the input-pipeline cost (a job's CPU need) and re-time them."""
        changed = {k for k in set(scales) | set(self.input_scale) if scales.get(k, 1.0) != self.input_scale.get(k, 1.0)}
        if not changed:
            return
        self.integrate(now)
        self.input_scale = dict(scales)
        self._refresh(set(), changed, now)

    def container_use(self, c: Container, contended: bool = False) -> float:
        """Cores a training container keeps busy on average (no noise), at its job's base step
        (what it needs) or, with ``contended``, at its current step (what it gets)."""
        j = self.jobs[c.owner]
        st = j.step if contended else j.base
        if st.speed <= 0:
            return 0.0
        t = st.t
        if c.role is Role.WORKER:
            if c.res.gpu > 0 and self.models[j.rec.spec.model].gpu_samples_per_s > 0:
                return c.res.cpu * min(1.0, st.t_pipe / t) * (st.speed / j.base.speed if contended else 1.0)
            return c.res.cpu * st.worker_busy
        return c.res.cpu * st.ps_busy

    def node_use(self, node: str, contended: bool = False) -> float:
        """Cores the training containers on ``node`` keep busy (:meth:`container_use` summed)."""
        return sum(self.container_use(c, contended) for c in self.state.containers_on(node))

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
