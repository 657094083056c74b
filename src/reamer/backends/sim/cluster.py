"""Simulated cluster state: the ``sim`` backend's observe/actuate, driven by the event loop.

Speeds come from :mod:`reamer.models.training` (the one speed model); telemetry is that
model plus seeded multiplicative noise, so policies face noise as on real machines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from reamer.domain import (
    AddContainer,
    ClusterSnapshot,
    Container,
    ContainerTelemetry,
    Decision,
    JobState,
    JobTelemetry,
    JobView,
    Node,
    Preempt,
    RemoveContainer,
    Resize,
    Resources,
    Role,
    StartJob,
    TrainingJob,
)
from reamer.domain.decisions import InvalidDecision, Placement, check_start  # InvalidDecision: re-exported
from reamer.models.training import ZERO_STEP, Calibration, ModelProfile, Side, Step, step
from reamer.models.zoo import ZOO, gpu_factor

NETWORKED = (Role.PS, Role.WORKER)


@dataclass
class _Job:
    spec: TrainingJob
    state: JobState = JobState.QUEUED
    containers: dict[str, Container] = field(default_factory=dict)
    done: float = 0.0
    t_last: float = 0.0
    step: Step = ZERO_STEP
    version: int = 0
    next_id: int = 0
    started: float | None = None
    finished: float | None = None
    last_change: float | None = None
    queued_since: float = 0.0
    queue_s: float = 0.0
    reconfigs: int = 0
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
        self.nodes = tuple(nodes)
        # training models by name (the calibrated profile's merged over the zoo; default the zoo)
        self.models: Mapping[str, ModelProfile] = models if models is not None else ZOO
        self.node_by_name = {n.name: n for n in self.nodes}
        self.free: dict[str, Resources] = {n.name: n.capacity for n in self.nodes}
        # networked containers per node; insertion-ordered (not a set) so float sums are
        # reproducible across processes whatever the string-hash seed
        self.on_node: dict[str, dict[str, None]] = {n.name: {} for n in self.nodes}
        self.owner: dict[str, str] = {}  # container id -> job id
        self.cal = cal
        self.rng = rng
        self.noise = noise_pct / 100.0
        self.on_change = on_change  # (job id, completion time, version) for the event loop
        self.jobs: dict[str, _Job] = {}
        self.queue: dict[str, None] = {}  # insertion-ordered set
        self.running: dict[str, None] = {}
        self.cap_cpu = sum(n.cores for n in self.nodes)
        self.cap_gpu = sum(n.gpus for n in self.nodes)
        self.totals = Totals()
        self.cpu_used = self.gpu_used = self.cpu_alloc = self.gpu_alloc = 0.0
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

    # ------------------------------------------------------------------ events
    def arrive(self, spec: TrainingJob, now: float) -> None:
        j = _Job(spec, queued_since=now, t_last=now)
        self.jobs[spec.id] = j
        self.queue[spec.id] = None

    def complete(self, jid: str, version: int, now: float) -> bool:
        j = self.jobs[jid]
        if j.state is not JobState.RUNNING or j.version != version:
            return False  # stale completion event
        self._integrate(now)
        self._progress(j, now)
        touched = self._release(j)
        j.state = JobState.DONE
        j.finished = now
        if j.spec.duration_s is None:
            j.done = j.spec.samples  # a fixed-duration job keeps the samples it did
        del self.running[jid]
        self._refresh(touched, now)
        return True

    # ---------------------------------------------------------------- observe
    def observe(self, now: float) -> ClusterSnapshot:
        with_telemetry = now >= self.next_telemetry
        if with_telemetry:
            self.next_telemetry = now + (self.telemetry_interval_s or math.inf)
        running = []
        for jid in self.running:
            j = self.jobs[jid]
            if j.view is None or with_telemetry:
                self._progress(j, now)
                j.view = self._view(j, now)
            running.append(j.view)
        queue = []
        for jid in self.queue:
            j = self.jobs[jid]
            if j.view is None:
                j.view = self._view(j, now)
            queue.append(j.view)
        tel = self._measure(now) if with_telemetry else {}
        return ClusterSnapshot(now, self.nodes, MappingProxyType(dict(self.free)), tuple(queue),
                               tuple(running), MappingProxyType(tel))

    def _view(self, j: _Job, now: float) -> JobView:
        return JobView(j.spec, j.state, tuple(j.containers.values()), j.done, now if j.state is JobState.RUNNING else j.t_last,
                       j.started, j.last_change)

    def _measure(self, now: float) -> dict[str, JobTelemetry]:
        """Telemetry of each running job over its last interval, with seeded noise. A job in its
        restart pause reports nothing, and its speed counts from the end of the pause: on the
        local backend its workers are down, and the speed comes from their reports once back."""
        out = {}
        for jid in self.running:
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

    def _container_telemetry(self, j: _Job) -> dict[str, ContainerTelemetry]:
        st = j.step
        prof = self.models[j.spec.model]
        bits = 8.0 * prof.param_bytes
        ws = [c for c in j.containers.values() if c.role is Role.WORKER]
        ps = [c for c in j.containers.values() if c.role is Role.PS]
        out = {}
        t = st.t if st.speed > 0 else math.inf
        for c in j.containers.values():
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
        if not decisions:
            return
        self._integrate(now)
        touched: set[str] = set()
        for d in decisions:
            if isinstance(d, StartJob):
                touched |= self._start(d, now)
            elif isinstance(d, Resize):
                touched |= self._resize(d, now)
            elif isinstance(d, AddContainer):
                touched |= self._add(d, now)
            elif isinstance(d, RemoveContainer):
                touched |= self._remove(d, now)
            elif isinstance(d, Preempt):
                touched |= self._preempt(d, now)
            else:  # pragma: no cover - typing guards this
                raise InvalidDecision(f"unknown decision {d!r}")
        self._refresh(touched, now)

    def _job(self, jid: str, state: JobState) -> _Job:
        j = self.jobs.get(jid)
        if j is None or j.state is not state:
            raise InvalidDecision(f"job {jid} is not {state.value}")
        return j

    def _place(self, j: _Job, p: Placement) -> Container:
        if p.node not in self.free:
            raise InvalidDecision(f"unknown node {p.node}")
        if not p.res.fits_in(self.free[p.node]):
            raise InvalidDecision(f"{p.res} does not fit on {p.node} (free {self.free[p.node]})")
        self.free[p.node] = self.free[p.node] - p.res
        self.cpu_alloc += p.res.cpu
        self.gpu_alloc += p.res.gpu
        cid = f"{j.spec.id}/{p.role.value}{j.next_id}"
        j.next_id += 1
        c = Container(cid, j.spec.id, p.role, p.node, p.res)
        j.containers[cid] = c
        self.owner[cid] = j.spec.id
        if p.role in NETWORKED:
            self.on_node[p.node][cid] = None
        return c

    def _unplace(self, c: Container) -> None:
        self.free[c.node] = self.free[c.node] + c.res
        self.cpu_alloc -= c.res.cpu
        self.gpu_alloc -= c.res.gpu
        self.on_node[c.node].pop(c.id, None)
        del self.owner[c.id]

    def _start(self, d: StartJob, now: float) -> set[str]:
        j = self._job(d.job, JobState.QUEUED)
        check_start(d, self.free)
        for p in d.placements:
            self._place(j, p)
        del self.queue[d.job]
        self.running[d.job] = None
        j.state = JobState.RUNNING
        j.queue_s += now - j.queued_since
        if j.started is None:
            j.started = now
        j.t_last = j.tel_since = j.last_change = now
        j.tel_done = j.done
        if j.spec.duration_s is not None:  # ends at its first start + duration, whatever its speed
            j.version += 1
            self.on_change(j.spec.id, max(now, j.started + j.spec.duration_s), j.version)
        return {p.node for p in d.placements} | {"job:" + j.spec.id}

    def _running_container(self, cid: str) -> tuple[_Job, Container]:
        jid = self.owner.get(cid)
        if jid is None:
            raise InvalidDecision(f"unknown container {cid}")
        j = self.jobs[jid]
        return j, j.containers[cid]

    def _changed(self, j: _Job, now: float) -> None:
        self._progress(j, now)
        j.last_change = now
        j.reconfigs += 1

    def _resize(self, d: Resize, now: float) -> set[str]:
        j, c = self._running_container(d.container)
        free = self.free[c.node] + c.res
        if not d.res.fits_in(free) or d.res.cpu <= 0:
            raise InvalidDecision(f"resize {c.id} to {d.res}: does not fit on {c.node}")
        self._changed(j, now)
        self.free[c.node] = free - d.res
        self.cpu_alloc += d.res.cpu - c.res.cpu
        self.gpu_alloc += d.res.gpu - c.res.gpu
        j.containers[c.id] = Container(c.id, c.owner, c.role, c.node, d.res, c.cpuset)
        return {c.node, "job:" + j.spec.id}

    def _add(self, d: AddContainer, now: float) -> set[str]:
        j = self._job(d.job, JobState.RUNNING)
        self._changed(j, now)
        j.paused_until = now + self.restart_s
        self._place(j, d.placement)
        return {d.placement.node, "job:" + j.spec.id}

    def _remove(self, d: RemoveContainer, now: float) -> set[str]:
        j, c = self._running_container(d.container)
        if sum(1 for x in j.containers.values() if x.role is c.role) <= 1:
            raise InvalidDecision(f"remove {c.id}: a job keeps at least one {c.role.value}")
        self._changed(j, now)
        j.paused_until = now + self.restart_s
        self._unplace(c)
        del j.containers[c.id]
        return {c.node, "job:" + j.spec.id}

    def _preempt(self, d: Preempt, now: float) -> set[str]:
        j = self._job(d.job, JobState.RUNNING)
        self._progress(j, now)
        touched = self._release(j)
        j.state = JobState.QUEUED
        j.queued_since = now
        j.version += 1
        j.step = ZERO_STEP
        j.view = None
        del self.running[d.job]
        self.queue[d.job] = None
        return touched

    def _release(self, j: _Job) -> set[str]:
        nodes = set()
        for c in j.containers.values():
            self._unplace(c)
            nodes.add(c.node)
        j.containers = {}
        self._account(j, ZERO_STEP)
        j.base = ZERO_STEP
        return nodes

    # ------------------------------------------------------------- dynamics
    def _bw(self, c: Container) -> float:
        """A container's share of its node's NIC: fair share among the flows active at once.

        Each PS/worker container is on the network for its job's ``net_busy`` share of a
        step (as of the job's current speed; a new container counts as always active), so
        the node carries ``Σ net_busy`` concurrent flows on average.
        """
        node = self.node_by_name[c.node]
        active = 0.0
        for cid in self.on_node[c.node]:
            st = self.jobs[self.owner[cid]].step
            active += st.net_busy if st.speed > 0 else 1.0
        return node.nic_gbps / max(1.0, active)

    def _progress(self, j: _Job, now: float) -> None:
        start = max(j.t_last, j.paused_until)
        if j.state is JobState.RUNNING and now > start:
            done = j.done + j.step.speed * (now - start)
            j.done = min(j.spec.samples, done) if j.spec.duration_s is None else done
        j.t_last = now

    def _account(self, j: _Job, new: Step) -> None:
        """Swap the job's contribution to the cluster-wide used/allocated rates."""
        old = j.step
        self.cpu_used += new.cpu_used - old.cpu_used
        self.gpu_used += new.gpu_used - old.gpu_used
        j.step = new

    def _refresh(self, touched: set[str], now: float) -> None:
        """Recompute the speed of every job with a container on a touched node."""
        jids = {t[4:] for t in touched if t.startswith("job:")}
        for node in touched:
            if node.startswith("job:"):
                continue
            jids.update(self.owner[c] for c in self.on_node[node])
        for jid in sorted(jids):
            j = self.jobs[jid]
            if j.state is not JobState.RUNNING:
                continue
            self._progress(j, now)
            j.base = self._speed(j)
            new = self._contend(j, j.base)
            j.view = None
            if new.speed == j.step.speed and new.cpu_used == j.step.cpu_used and j.paused_until <= now:
                continue
            self._account(j, new)
            j.version += 1
            if j.spec.duration_s is not None:
                eta = max(now, (now if j.started is None else j.started) + j.spec.duration_s)
            else:
                left = j.spec.samples - j.done
                eta = max(now, j.paused_until) + left / new.speed if new.speed > 0 else math.inf
            self.on_change(jid, eta, j.version)

    def _speed(self, j: _Job) -> Step:
        prof = self.models[j.spec.model]
        if self.input_scale and j.spec.id in self.input_scale:
            prof = replace(prof, input_core_s_per_sample=prof.input_core_s_per_sample * self.input_scale[j.spec.id])
        workers, ps = [], []
        for c in j.containers.values():
            node = self.node_by_name[c.node]
            side = Side(c.res.cpu, self._bw(c), c.res.gpu, None, gpu_factor(node.gpu_model))
            (workers if c.role is Role.WORKER else ps).append(side)
        return step(prof, self.cal, j.spec.batch, workers, ps)

    def _contend(self, j: _Job, base: Step) -> Step:
        """The job's step under CPU contention: synchronous training runs at the pace of its
        most contended container; a GPU job whose input pipeline gets a share ``k`` of the CPU
        it uses slows to ``k`` of its speed (its use is what sustains that speed)."""
        if not self.contention:
            return base
        k = min((self.contention.get(c.node, 1.0) for c in j.containers.values()), default=1.0)
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
        self._integrate(now)
        self.contention = {n: k for n, k in factors.items() if k < 1.0}
        self._refresh(changed, now)

    def set_input_scale(self, scales: dict[str, float], now: float) -> None:
        """Set per-job factors on the input-pipeline cost (a job's CPU need) and re-time them."""
        changed = {"job:" + k for k in set(scales) | set(self.input_scale)
                   if scales.get(k, 1.0) != self.input_scale.get(k, 1.0)}
        if not changed:
            return
        self._integrate(now)
        self.input_scale = dict(scales)
        self._refresh(changed, now)

    def container_use(self, c: Container, contended: bool = False) -> float:
        """Cores a training container keeps busy on average (no noise), at its job's base step
        (what it needs) or, with ``contended``, at its current step (what it gets)."""
        j = self.jobs[self.owner[c.id]]
        st = j.step if contended else j.base
        if st.speed <= 0:
            return 0.0
        t = st.t
        if c.role is Role.WORKER:
            if c.res.gpu > 0 and self.models[j.spec.model].gpu_samples_per_s > 0:
                return c.res.cpu * min(1.0, st.t_pipe / t) * (st.speed / j.base.speed if contended else 1.0)
            return c.res.cpu * st.worker_busy
        return c.res.cpu * st.ps_busy

    def containers_on(self, node: str) -> list[Container]:
        """Training containers on ``node``."""
        return [self.jobs[self.owner[cid]].containers[cid] for cid in self.on_node[node]]

    def speed_share(self) -> tuple[float, int]:
        """(Σ over running jobs of speed / uncontended speed, number of running jobs)."""
        tot, n = 0.0, 0
        for jid in self.running:
            j = self.jobs[jid]
            if j.base.speed > 0:
                tot += j.step.speed / j.base.speed
                n += 1
        return tot, n

    def _integrate(self, now: float) -> None:
        t = self.totals
        dt = now - t.t
        if dt > 0:
            t.cpu_used_s += self.cpu_used * dt
            t.gpu_used_s += self.gpu_used * dt
            t.cpu_alloc_s += self.cpu_alloc * dt
            t.gpu_alloc_s += self.gpu_alloc * dt
            if self.track_share:
                share, n = self.speed_share()
                t.speed_share_s += share * dt
                t.job_s += n * dt
            t.t = now
