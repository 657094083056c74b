"""NEARCHUS: adaptive resource allocation for PS training jobs (Tariq et al., NOMS 2024;
control logic from the authors' patent US 11,665,106 B2; docs/design.md#nearchus).

Per running job, every control interval:

1. **Stabilize** — after any change, wait until the job's measured speed is stable: at
   least ``stable_samples`` intervals that do not straddle the change, with a coefficient
   of variation ≤ ``stable_cv`` (or ``max_wait_samples`` intervals, whichever first).
2. **Evaluate the last change** — resource efficiency = relative speed gain ÷ relative
   cores added. A change that gained less than ``min_gain`` is reverted (and that action is
   blocked for ``block_s``); one that paid is kept as an *increment* with its gain per core.
3. **Diagnose and act** (:mod:`reamer.policies.diagnosis`):
   * network-bound (a PS link saturated) → outscale: add a PS; only worker links saturated
     → nothing that more resources would fix (no change);
   * PS-CPU-bound → upscale the PS while vertical efficiency ≥ ``efficiency_threshold``,
     else add a PS;
   * compute-bound → upscale the workers while vertical efficiency ≥ threshold, else
     outscale: add a worker (parallelism);
   * nothing saturated → trim the workers' CPU limit to what they use (+margin): what the
     job does not need is given back (the joint loop hands it to inference).
   * first of all (unless PS-bound): PS containers that use little of their CPU are trimmed
     to what they use (+margin) — a PS mostly moves bytes.
   Every job stays within its per-job maximum (``max_growth`` × requested cores, the spec's
   ``max_ps``/``max_workers``/``max_cores_per_container``).

Cluster level: queued jobs start FIFO (with backfill) at their request, or at the largest
smaller shape that fits (≥ 1 PS + 1 worker) and then grow; when the head of the queue cannot
start, increments are taken back from running jobs, least efficient (gain per core) first —
GPU workers NEARCHUS added first when the head waits for a GPU share. Added PS/workers and
thin starts go only to nodes whose measured NIC use is below ``net_saturation``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from reamer.domain import (
    AddContainer,
    ClusterSnapshot,
    Decision,
    JobView,
    RemoveContainer,
    Resize,
    Resources,
    Role,
    StartJob,
    TrainingJob,
)
from reamer.domain.readings import INFERENCE, PS, WORKER, ReadingTable, reading_by_container, readings_of
from reamer.policies.diagnosis import BOTTLENECKS, DEFAULT_THRESHOLDS, Diagnoses, Diagnosis, Thresholds, diagnose_table
from reamer.policies.placement import FreeMap, Strategy, gang_order
from reamer.policies.queue import RequestGroups


class NearchusConfig(BaseModel):
    """Every threshold of the policy (documented in docs/nearchus.md)."""

    model_config = ConfigDict(extra="forbid")
    stable_samples: int = Field(2, ge=1)
    stable_cv: float = Field(0.06, gt=0)
    max_wait_samples: int = Field(5, ge=1)
    min_gain: float = Field(0.05, ge=0)  # relative speed gain a grow must bring to be kept
    efficiency_threshold: float = Field(0.3, ge=0)  # (ΔS/S)/(ΔR/R) to keep scaling vertically
    cpu_saturation: float = Field(DEFAULT_THRESHOLDS.cpu, gt=0, le=1)
    net_saturation: float = Field(DEFAULT_THRESHOLDS.net, gt=0, le=1)
    net_side_margin: float = Field(DEFAULT_THRESHOLDS.side_margin, ge=0)  # PS link busier than worker links by this much → PS side is the bottleneck
    upscale_factor: float = Field(1.5, gt=1)
    core_step: float = Field(0.5, gt=0)  # CPU limits are multiples of this
    max_growth: float = Field(4.0, ge=1)  # per-job maximum: × requested cores
    trim: bool = True
    trim_ps: bool = True  # trim idle PS containers too
    trim_below: float = Field(0.5, gt=0, le=1)  # worker CPU util under which limits are trimmed
    trim_margin: float = Field(0.25, ge=0)
    trim_throttled: float = Field(0.1, ge=0, le=1)  # ... and throttled in fewer periods than this
    block_s: float = Field(1800.0, ge=0)  # an action that did not pay is not retried for this long (doubling)
    reclaim: bool = True
    start_fractions: list[float] = [1.0, 0.5, 0.25]  # worker CPU shares tried when the request does not fit
    nic_headroom: bool = True  # added PS/workers and thin starts only on nodes whose measured NIC use < net_saturation
    grow_while_gpu_blocked: bool = True  # head waits only for a GPU share: jobs may grow CPU, add PS, CPU workers
    restore: bool = False  # queue empty: give jobs started thin / squeezed their request back at once (measured: no better than growth by efficiency)
    outscale: bool = True  # ablation: False = vertical scaling only
    stabilize: bool = True  # ablation: False = act on every interval's raw sample
    placement: Strategy = "spread"
    gpu_fit: bool = True  # fractional-GPU containers: best fit on free GPU shares first (against fragmentation)


class Action(StrEnum):
    """What NEARCHUS does to one job in one round."""

    TRIM_PS = "trim_ps"  # PS limits down to their use
    TRIM = "trim"  # worker limits down to their use
    UP_PS = "up_ps"  # PS limits up (vertical)
    UP_WORKERS = "up_workers"  # worker limits up (vertical)
    ADD_PS = "add_ps"  # one more PS shard (outscale, network-bound)
    ADD_WORKER = "add_worker"  # one more worker (outscale, parallelism)

    @property
    def trims(self) -> bool:
        return self in (Action.TRIM, Action.TRIM_PS)

    @property
    def upscales(self) -> bool:
        return self in (Action.UP_PS, Action.UP_WORKERS)

    @property
    def adds(self) -> bool:
        return self in (Action.ADD_PS, Action.ADD_WORKER)

    @property
    def role(self) -> Role:
        return Role.PS if self in (Action.TRIM_PS, Action.UP_PS, Action.ADD_PS) else Role.WORKER


@dataclass
class _Change:
    kind: Action
    at: float
    speed_before: float
    cores_before: float
    cores_after: float
    undo: list[tuple[str, Resources]] = field(default_factory=list)  # resize back
    ids_before: frozenset[str] = frozenset()
    added: list[str] = field(default_factory=list)  # containers to remove to undo
    gain_per_core: float = 0.0

    def undo_decisions(self) -> list[Decision]:
        return [Resize(cid, res) for cid, res in self.undo] + [RemoveContainer(c) for c in self.added]


@dataclass
class _Job:
    last_change: float
    samples: list[float] = field(default_factory=list)
    pending: _Change | None = None
    increments: list[_Change] = field(default_factory=list)
    blocked: dict[Action, float] = field(default_factory=dict)
    failures: dict[Action, int] = field(default_factory=dict)
    vertical_eff: float | None = None
    owed: bool = False  # runs below its request because it started thin or was squeezed


def _unconfirmed(st: _Job) -> bool:
    """Its last change added containers whose ids it has not seen yet."""
    return st.pending is not None and not st.pending.added and st.pending.kind.adds


def _cores(job: JobView) -> float:
    return sum(c.res.cpu for c in job.containers)


def _gpu_room(free: FreeMap, gpu: float, usable: np.ndarray | None) -> np.ndarray:
    """Per node: ``gpu`` of a GPU is free there, and it is one of the ``usable`` nodes (None: any)."""
    room = free.free[:, 2] >= gpu - 1e-9
    return room if usable is None else room & usable


def _request_cores(spec: TrainingJob) -> float:
    return spec.ps * spec.ps_res.cpu + spec.workers * spec.worker_res.cpu


class Nearchus:
    name = "nearchus"

    def __init__(self, config: NearchusConfig | None = None, interval_s: float = 60.0) -> None:
        self.cfg = config or NearchusConfig()
        self.interval_s = interval_s
        self.jobs: dict[str, _Job] = {}
        self._adding: set[str] = set()  # jobs whose added containers are still to be confirmed (_sync)
        self._free: FreeMap | None = None
        # the queue by request; a request whose smallest shape did not fit is skipped for the round
        self._queue = RequestGroups(lambda s: (s.ps_res, s.worker_res, s.one_node, s.ps_nodes, s.worker_nodes))
        self._cpu_growth_ok = False
        # per node (FreeMap order): measured NIC utilization (last telemetry); None: nothing measured
        self._nic: np.ndarray | None = None
        # the telemetry round whose NIC use _nic is still to be summed from (:meth:`_nic_now`)
        self._nic_from: tuple[ReadingTable, FreeMap] | None = None
        self._nic_cap = np.zeros(0)
        self._nic_nodes: object = None
        self._shape_memo: dict[tuple, list[tuple[tuple[Role, Resources], ...]]] = {}  # request -> _shapes

    @property
    def thresholds(self) -> Thresholds:
        """The saturation thresholds its diagnosis uses (reports diagnose with the same)."""
        return Thresholds(self.cfg.cpu_saturation, self.cfg.net_saturation, self.cfg.net_side_margin)

    # ----------------------------------------------------------------- round
    def decide(self, snap: ClusterSnapshot) -> list[Decision]:
        free = self._free = FreeMap(snap, self._free)
        self._crowd = free.crowding(snap)
        out: list[Decision] = []
        if snap.nodes is not self._nic_nodes:  # (another) node list: its links
            self._nic_nodes, self._nic, self._nic_from = snap.nodes, None, None
            self._nic_cap = np.array([n.nic_gbps for n in snap.nodes], dtype=float)
        table = readings_of(snap) if snap.telemetry else None
        if table is not None:
            self._nic_from = (table, free)  # summed when first needed: most rounds place nothing
        # A round without telemetry or an addition to confirm has nothing to do per running
        # job unless the head of the queue needs room taken back (:meth:`_reclaim` syncs then):
        # it skips them (the same decisions, in time bounded by what is due rather than by the
        # running jobs).
        running: dict[str, JobView] | None = None
        if snap.telemetry or self._adding:
            running = self._sync(snap, table)
        if self.cfg.restore and not snap.queue and any(st.owed for st in self.jobs.values()):
            out += self._restore(snap, free)
        if self.cfg.reclaim and snap.queue:
            out += self._reclaim(snap, running, free)
        out += self._start(snap, free)
        waiting = bool(snap.queue) and any(isinstance(d, StartJob) for d in out) is False
        # the head waits for a GPU share no node it may use has: CPU-only growth takes nothing it needs
        head = snap.queue[0].spec if waiting else None
        self._cpu_growth_ok = (head is not None and self.cfg.grow_while_gpu_blocked and head.worker_res.gpu > 0
                               and not _gpu_room(free, head.worker_res.gpu, free.allowed(head, Role.WORKER)).any())
        if table is not None:  # every job diagnosed at once; the per-job path only for those it may move
            diag = diagnose_table(table, self.cfg.cpu_saturation, self.cfg.net_saturation, self.cfg.net_side_margin)
            moves = self._may_act(table, diag)
            index, telemetry, jobs = table.index, snap.telemetry, self.jobs
            for job in snap.running:
                i = index.get(job.id)
                if i is None:
                    continue
                st = jobs[job.id]
                if st.pending is None and not moves[i]:
                    continue  # no change to judge, and nothing in its plan would do anything
                out += self._adapt(job, st, diag.at(i), telemetry[job.id], snap.now, free, grow=not waiting)
        return out

    def _may_act(self, t: ReadingTable, d: Diagnoses) -> np.ndarray:
        """Per job of ``t``: whether its plan (:meth:`_plan`) holds an action that could change
        anything: any growth, or a trim that would take cores from one of its containers (sized as
        :meth:`_act` sizes it). A job with no change pending and no such action gets nothing from
        :meth:`_adapt`, so it is screened out as one array program."""
        cfg, b, n = self.cfg, d.bottleneck, len(t.jobs)
        names = ("none", "network", "gpu", "input", "compute", "ps")
        none, network, gpu, input_, compute, ps_ = map(BOTTLENECKS.index, names)
        grows = (b == ps_) | (b == compute) | (b == input_)
        if cfg.outscale:
            grows |= (b == network) | (b == gpu)
        trim_ps = ((b != ps_) & (d.ps_cpu_util < cfg.trim_below) & (d.ps_throttled < cfg.trim_throttled)
                   if cfg.trim_ps else np.zeros(n, dtype=bool))
        trim = (((b == none) | (b == gpu)) & (d.worker_cpu_util < cfg.trim_below)
                & (d.worker_throttled < cfg.trim_throttled) if cfg.trim else np.zeros(n, dtype=bool))
        ps, worker = t.role == PS, t.role == WORKER
        util = np.where(ps, d.ps_cpu_util[t.job], d.worker_cpu_util[t.job])
        step = cfg.core_step
        want = np.maximum(step, np.ceil(np.maximum(step, t.cores * util * (1 + cfg.trim_margin)) / step - 1e-9) * step)
        shrinks = want < t.cores
        return (grows | (trim_ps & (np.bincount(t.job[shrinks & ps], minlength=n) > 0))
                | (trim & (np.bincount(t.job[shrinks & worker], minlength=n) > 0)))

    def _sync(self, snap: ClusterSnapshot, table: ReadingTable | None) -> dict[str, JobView]:
        """Forget jobs no longer running, take in running ones it does not know, confirm the
        containers its additions created and keep each job's measured speed. Returns the
        running jobs by id."""
        running = {j.spec.id: j for j in snap.running}
        jobs = self.jobs
        for jid in jobs.keys() - running.keys():
            del jobs[jid]
        if len(jobs) < len(running):  # (what it knows is now among the running jobs)
            for jid, job in running.items():
                if jid not in jobs:
                    jobs[jid] = _Job(job.started_s or snap.now)
        for jid in self._adding:  # every job with an addition still to confirm is in _adding (_act)
            st = jobs.get(jid)
            if st is not None and _unconfirmed(st):
                st.pending.added = sorted({c.id for c in running[jid].containers} - st.pending.ids_before)
        if table is not None:
            for jid, since, speed in zip(table.jobs, table.since.tolist(), table.speed.tolist()):
                st = jobs.get(jid)
                if st is not None and since >= st.last_change - 1e-9:
                    st.samples.append(speed)
        self._adding = {jid for jid in self._adding if (st := jobs.get(jid)) is not None and _unconfirmed(st)}
        return running

    # --------------------------------------------------------------- per job
    def _stable_speed(self, st: _Job) -> float | None:
        s = st.samples
        if not self.cfg.stabilize:
            return s[-1] if s else None
        k = self.cfg.stable_samples
        if len(s) < k:
            return None
        last = s[-k:]
        mean = math.fsum(last) / k
        if mean <= 0:
            return None
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in last) / k)  # population std, as numpy's
        if std / mean <= self.cfg.stable_cv or len(s) >= self.cfg.max_wait_samples:
            return mean
        return None

    def _reset(self, st: _Job, now: float) -> None:
        st.samples = []
        st.last_change = now

    def _adapt(self, job: JobView, st: _Job, d: Diagnosis, tel, now: float, free: FreeMap,
               grow: bool) -> list[Decision]:
        speed = self._stable_speed(st)
        if speed is None:
            return []
        ch = st.pending
        if ch is not None:
            st.pending = None
            gain = speed / ch.speed_before - 1.0 if ch.speed_before > 0 else 0.0
            if ch.kind.trims:
                if gain < -self.cfg.min_gain:  # trimming hurt: give the cores back
                    return self._revert(job, st, ch, now, free, block=True)
            elif gain < self.cfg.min_gain:
                return self._revert(job, st, ch, now, free, block=True)
            else:
                added = ch.cores_after - ch.cores_before
                ch.gain_per_core = (speed - ch.speed_before) / added if added > 0 else math.inf
                if ch.kind.upscales:
                    st.vertical_eff = gain / (added / ch.cores_before) if added > 0 else 0.0
                st.increments.append(ch)
        for kind in self._plan(d, st):
            if not grow and not kind.trims and not (
                    self._cpu_growth_ok and (kind is not Action.ADD_WORKER or job.of_role(Role.WORKER)[0].res.gpu == 0)):
                continue  # jobs are waiting: idle cores go to them, not to growth
            dec = self._act(kind, job, st, d, speed, now, free, tel)
            if dec:
                return dec
        return []

    def _plan(self, d: Diagnosis, st: _Job) -> list[Action]:
        if (self.cfg.trim_ps and d.bottleneck != "ps" and d.ps_cpu_util < self.cfg.trim_below
                and d.ps_throttled < self.cfg.trim_throttled):
            trim_ps = [Action.TRIM_PS]  # idle PS cores (a PS mostly moves bytes) go back first
        else:
            trim_ps = []
        return trim_ps + self._plan_grow(d, st)

    def _plan_grow(self, d: Diagnosis, st: _Job) -> list[Action]:
        vertical_ok = st.vertical_eff is None or st.vertical_eff >= self.cfg.efficiency_threshold
        out = self.cfg.outscale
        if d.bottleneck == "network":
            return [Action.ADD_PS] if out else []
        if d.bottleneck == "worker_network":
            return []
        if d.bottleneck == "ps":
            return ([Action.UP_PS] if vertical_ok else []) + ([Action.ADD_PS] if out else []) + [Action.UP_PS]
        if d.bottleneck in ("compute", "input"):  # input: more CPU feeds its GPUs; a worker brings a GPU and CPU
            return (([Action.UP_WORKERS] if vertical_ok else []) + ([Action.ADD_WORKER] if out else [])
                    + [Action.UP_WORKERS])
        trim = [Action.TRIM] if self._trimmable(d) else []
        if d.bottleneck == "gpu":  # a GPU cannot be upscaled: parallelism is the way
            return trim + ([Action.ADD_WORKER] if out else [])
        return trim

    def _trimmable(self, d: Diagnosis) -> bool:
        """Workers use little of their limit and the quota never binds (not throttled)."""
        return (self.cfg.trim and d.worker_cpu_util < self.cfg.trim_below
                and d.worker_throttled < self.cfg.trim_throttled)

    def _act(self, kind: Action, job: JobView, st: _Job, d: Diagnosis, speed: float, now: float,
             free: FreeMap, tel=None) -> list[Decision]:
        if st.blocked.get(kind, -math.inf) > now:
            return []
        role = kind.role
        trims: dict[str, float] = {}  # container id -> the cores a trim leaves it
        if kind.trims:
            util = d.ps_cpu_util if role is Role.PS else d.worker_cpu_util
            for c in job.of_role(role):
                want = self._round(max(self.cfg.core_step, c.res.cpu * util * (1 + self.cfg.trim_margin)))
                if want < c.res.cpu:
                    trims[c.id] = want
            if not trims:
                return []  # every container is as small as its use allows
        spec = job.spec
        cores = _cores(job)
        cap = self.cfg.max_growth * _request_cores(spec)
        decisions: list[Decision] = []
        undo: list[tuple[str, Resources]] = []
        if not kind.adds:
            new_total = cores
            for c in job.of_role(role):
                if kind.trims:
                    want = trims.get(c.id)
                    if want is None:
                        continue
                else:
                    want = min(spec.max_cores_per_container, self._round(c.res.cpu * self.cfg.upscale_factor))
                    room = free.free[free.index[c.node]][0]
                    want = min(want, c.res.cpu + math.floor(room / self.cfg.core_step) * self.cfg.core_step)
                    if want <= c.res.cpu or new_total + want - c.res.cpu > cap + 1e-9:
                        continue
                new = Resources(want, c.res.mem_mib, c.res.gpu)
                free.reserve(c.node, new - c.res)
                decisions.append(Resize(c.id, new))
                undo.append((c.id, c.res))
                new_total += want - c.res.cpu
            if not decisions:
                return []
            after = new_total
        else:
            mine = job.of_role(role)
            if len(mine) >= (spec.max_ps if role is Role.PS else spec.max_workers):
                return []
            tmpl = mine[0].res
            if cores + tmpl.cpu > cap + 1e-9:
                return []
            expect = self._expected_gbps(job, role, tel)
            p = free.place_one(role, tmpl, self.cfg.placement, self._crowd, keep_gpus=True,
                               allowed=free.home(job, role, self._nic_ok(free, expect)), gpu_fit=self.cfg.gpu_fit)
            if p is None:
                return []
            self._crowd[free.index[p.node]] += 1
            nic = self._nic_now()
            if nic is not None:
                i = free.index[p.node]
                nic[i] += expect / self._nic_cap[i]
            decisions.append(AddContainer(job.id, p))
            after = cores + tmpl.cpu
        if kind is Action.TRIM:
            st.owed = False  # it does not use what it has: nothing is owed
        st.pending = _Change(kind, now, speed, cores, after, undo, frozenset(c.id for c in job.containers))
        if kind.adds:
            self._adding.add(job.id)
        self._reset(st, now)
        return decisions

    def _round(self, cores: float) -> float:
        step = self.cfg.core_step
        return max(step, math.ceil(cores / step - 1e-9) * step)

    def _revert(self, job: JobView, st: _Job, ch: _Change, now: float, free: FreeMap,
                block: bool) -> list[Decision]:
        present = {c.id: c for c in job.containers}
        decisions: list[Decision] = []
        for d in ch.undo_decisions():
            c = present.get(d.container)
            if c is None:
                continue
            if isinstance(d, Resize):
                room = free.free[free.index[c.node]][0]
                cpu = min(d.res.cpu, c.res.cpu + math.floor(room / self.cfg.core_step) * self.cfg.core_step)
                if cpu == c.res.cpu:
                    continue  # undoing a trim: the cores went to someone else meanwhile
                d = Resize(c.id, Resources(cpu, d.res.mem_mib, d.res.gpu))
                free.reserve(c.node, d.res - c.res)
            else:
                free.reserve(c.node, Resources() - c.res)
            decisions.append(d)
        if block:  # exponential back-off: an action that keeps failing is tried ever less often
            st.failures[ch.kind] = st.failures.get(ch.kind, 0) + 1
            st.blocked[ch.kind] = now + self.cfg.block_s * 2 ** (st.failures[ch.kind] - 1)
        if ch.kind.upscales:
            st.vertical_eff = 0.0  # vertical scaling stopped paying: outscale next
        self._reset(st, now)
        return decisions

    # ---------------------------------------------------------- cluster level
    def _shapes(self, spec: TrainingJob) -> list[tuple[tuple[Role, Resources], ...]]:
        """The request first, then smaller gangs down to 1 PS + 1 worker, each in
        :func:`gang_order` (kept per request: the queue's head asks each round)."""
        key = (spec.ps, spec.workers, spec.ps_res, spec.worker_res)
        shapes = self._shape_memo.get(key)
        if shapes is None:
            shapes = []
            for w in range(spec.workers, 0, -1):
                for k in self.cfg.start_fractions:  # thinner containers first: per core they train faster
                    wr = spec.worker_res
                    wres = Resources(max(self.cfg.core_step, self._round(wr.cpu * k)), wr.mem_mib, wr.gpu)
                    shapes.append(tuple(gang_order(((Role.PS, spec.ps_res),) * spec.ps + ((Role.WORKER, wres),) * w)))
            shapes = self._shape_memo[key] = list(dict.fromkeys(shapes))
        return shapes

    def _nic_util(self, t: ReadingTable, free: FreeMap) -> np.ndarray | None:
        """Per node: Σ measured throughput of its PS/worker containers ÷ the node's NIC (None:
        no container measured)."""
        rows = t.measured & (t.role != INFERENCE)
        if not rows.any():
            return None
        # (summed in row order: jobs as the snapshot lists them, each job's containers in order)
        return np.bincount(t.node[rows], t.net_gbps[rows], minlength=len(free.names)) / self._nic_cap

    def _nic_ok(self, free: FreeMap, expect_gbps: float = 0.0) -> np.ndarray | None:
        """Nodes whose NIC keeps headroom (last measurement + ``expect_gbps`` of the new
        container < ``net_saturation``), or None (no limit)."""
        if not self.cfg.nic_headroom:
            return None
        nic = self._nic_now()
        if nic is None:
            return None
        return nic + expect_gbps / self._nic_cap < self.cfg.net_saturation

    def _nic_now(self) -> np.ndarray | None:
        """Per node, the measured NIC utilization of the last telemetry (plus what additions
        since are expected to carry); None: nothing measured."""
        if self._nic_from is not None:
            table, free = self._nic_from
            self._nic_from = None
            self._nic = self._nic_util(table, free)
        return self._nic

    @staticmethod
    def _expected_gbps(job: JobView, role: Role, tel) -> float:
        """Traffic a new container of ``role`` will carry: a new PS shard takes its share of
        the job's PS traffic (p/(p+1) of one shard's), a new worker what a worker carries now."""
        if tel is None:
            return 0.0
        net = reading_by_container(tel.containers, "net_gbps")
        mine = [net[c.id] for c in job.of_role(role) if c.id in net]
        if not mine:
            return 0.0
        per = sum(mine) / len(mine)
        return per * len(mine) / (len(mine) + 1) if role is Role.PS else per

    def _start(self, snap: ClusterSnapshot, free: FreeMap) -> list[Decision]:
        out: list[Decision] = []
        thin_ok: np.ndarray | None | bool = False  # (False: not looked up yet)
        groups = self._queue
        for key, job in groups.scan(snap.queue, snap.nodes):
            s = job.spec
            for k, shape in enumerate(self._shapes(s)):
                if k > 0 and thin_ok is False:
                    thin_ok = self._nic_ok(free)
                placed = free.place_gang(shape, self.cfg.placement, thin_ok if k > 0 else None, self.cfg.gpu_fit,
                                         s.one_node, ordered=True, spec=s)
                if placed is not None:
                    out.append(StartJob(job.id, placed))
                    self.jobs.pop(job.id, None)  # a restarted job's state goes to the end, new
                    self.jobs[job.id] = _Job(snap.now, owed=k > 0)
                    break
            else:
                groups.miss(key)
        return out

    def _restore(self, snap: ClusterSnapshot, free: FreeMap) -> list[Decision]:
        """Give jobs that started thin or were squeezed their request back (FIFO by arrival),
        from the room free now: thin workers grow to the requested cores in place, missing
        workers are added at the requested size. Not an increment (never reclaimed as one)."""
        out: list[Decision] = []
        jobs = self.jobs
        owed = [j for j in snap.running if (st := jobs.get(j.id)) is not None and st.owed and st.pending is None]
        for job in sorted(owed, key=lambda j: (j.spec.arrival_s, j.id)):
            st = jobs[job.id]
            spec = job.spec
            want = spec.worker_res.cpu
            dec: list[Decision] = []
            short = False
            for c in job.of_role(Role.WORKER):
                if c.res.cpu >= want - 1e-9:
                    continue
                room = free.free[free.index[c.node]][0]
                cpu = min(want, c.res.cpu + math.floor(room / self.cfg.core_step + 1e-9) * self.cfg.core_step)
                short |= cpu < want - 1e-9
                if cpu > c.res.cpu:
                    new = Resources(cpu, c.res.mem_mib, c.res.gpu)
                    free.reserve(c.node, new - c.res)
                    dec.append(Resize(c.id, new))
            for _ in range(spec.workers - len(job.of_role(Role.WORKER))):
                p = free.place_one(Role.WORKER, spec.worker_res, self.cfg.placement, self._crowd, keep_gpus=True,
                                   allowed=free.home(job, Role.WORKER), gpu_fit=self.cfg.gpu_fit)
                if p is None:
                    short = True
                    break
                self._crowd[free.index[p.node]] += 1
                dec.append(AddContainer(job.id, p))
            if dec:
                self._reset(st, snap.now)
                out += dec
            st.owed = short
        return out

    def _reclaim(self, snap: ClusterSnapshot, running: dict[str, JobView] | None, free: FreeMap) -> list[Decision]:
        """Free room for the head of the queue (its smallest shape: 1 PS + 1 worker) on the
        node that needs the least taken back, revoking increments there, least gain per core first.
        ``running``: the running jobs by id, once synced (None: not yet this round)."""
        head = snap.queue[0].spec
        need = [(Role.PS, head.ps_res), (Role.WORKER, head.worker_res)]
        trial = free.place_gang(need, self.cfg.placement, gpu_fit=self.cfg.gpu_fit, one_node=head.one_node, spec=head)
        if trial is not None:
            for p in trial:
                free.release(p)
            return []
        if running is None:
            running = self._sync(snap, None)
        want, usable = self._room_wanted(head, free)
        if want[2] > 0 and not _gpu_room(free, want[2], usable).any():
            return self._reclaim_gpu(running, free, want, snap.now, usable)
        # what increments could give back, per node
        back: dict[str, list[tuple[float, str, _Change]]] = {}
        gives = {}  # node -> resources the increments there would give back
        for jid, st in self.jobs.items():
            if jid not in running or st.pending is not None or not st.increments:
                continue
            ch = st.increments[-1]  # only a job's latest increment can be undone cleanly
            undo = dict(ch.undo)
            for c in running[jid].containers:
                if c.id in ch.added:
                    r = np.array((c.res.cpu, c.res.mem_mib, c.res.gpu))
                elif c.id in undo:
                    r = np.array((c.res.cpu - undo[c.id].cpu, 0.0, 0.0))
                else:
                    continue
                back.setdefault(c.node, []).append((ch.gain_per_core, jid, ch))
                gives[c.node] = gives.get(c.node, 0.0) + r
        best: tuple[float, str] | None = None
        for node in back:
            i = free.index[node]
            if usable is not None and not usable[i]:
                continue
            missing = np.maximum(want - free.free[i], 0.0)
            if (missing > gives[node] + 1e-9).any():
                continue  # even all increments here would not make room
            cost = float(missing[0] / max(want[0], 1e-9) + missing[2])
            if best is None or cost < best[0]:
                best = (cost, node)
        if best is None:
            return self._squeeze(snap, running, free, want, usable)
        out: list[Decision] = []
        for _, jid, ch in sorted(back[best[1]], key=lambda x: x[0]):
            if jid not in self.jobs or not self.jobs[jid].increments or self.jobs[jid].increments[-1] is not ch:
                continue
            st = self.jobs[jid]
            st.increments.pop()
            out += self._revert(running[jid], st, ch, snap.now, free, block=False)
            i = free.index[best[1]]
            if (free.free[i] >= want - 1e-9).all():
                break
        return out

    @staticmethod
    def _room_wanted(head: TrainingJob, free: FreeMap) -> tuple[np.ndarray, np.ndarray | None]:
        """What room the head needs on one node, (cores, MiB, GPUs), and the nodes that may give
        it (None: any): a PS and a worker together, on a node both may use; or, when its PS and
        workers may use different nodes, the one of them that does not fit now, on its nodes."""
        ps, w = head.ps_res, head.worker_res
        if head.one_node or head.ps_nodes == head.worker_nodes:
            return (np.array((w.cpu + ps.cpu, w.mem_mib + ps.mem_mib, w.gpu)),
                    free.allowed(head, Role.PS, free.allowed(head, Role.WORKER)))
        alone = free.place_gang([(Role.PS, ps)], spec=head)
        if alone is None:
            return np.array((ps.cpu, ps.mem_mib, ps.gpu)), free.allowed(head, Role.PS)
        free.release(alone[0])
        return np.array((w.cpu, w.mem_mib, w.gpu)), free.allowed(head, Role.WORKER)

    def _reclaim_gpu(self, running: dict[str, JobView], free: FreeMap, want: np.ndarray, now: float,
                     usable: np.ndarray | None) -> list[Decision]:
        """The head waits for a GPU share no node has free: remove GPU workers that NEARCHUS
        added (any kept increment, not only the latest), least gain per core first, on the
        node where the fewest must go (of the ``usable`` nodes, None: all)."""
        cands: dict[str, list[tuple[float, str, _Change, str, np.ndarray]]] = {}
        for jid, st in self.jobs.items():
            if jid not in running:
                continue
            present = {c.id: c for c in running[jid].containers}
            for ch in st.increments + ([st.pending] if st.pending is not None else []):
                if ch.kind is not Action.ADD_WORKER:
                    continue
                for cid in ch.added:
                    c = present.get(cid)
                    if c is not None and c.res.gpu > 0:
                        cands.setdefault(c.node, []).append(
                            (ch.gain_per_core, jid, ch, cid, np.array((c.res.cpu, c.res.mem_mib, c.res.gpu))))
        best = None
        for node, items in cands.items():
            if usable is not None and not usable[free.index[node]]:
                continue
            items.sort(key=lambda x: x[0])
            have = free.free[free.index[node]].copy()
            for k, it in enumerate(items, 1):
                have += it[4]
                if (have >= want - 1e-9).all():
                    if best is None or k < best[0]:
                        best = (k, node)
                    break
        if best is None:
            return []
        out: list[Decision] = []
        for _, jid, ch, _cid, _ in cands[best[1]][:best[0]]:
            st = self.jobs[jid]
            if ch is st.pending:  # taken back before it could be judged
                st.pending = None
                out += self._revert(running[jid], st, ch, now, free, block=False)
            elif ch in st.increments:
                st.increments.remove(ch)
                out += self._revert(running[jid], st, ch, now, free, block=False)
        return out

    def _squeeze(self, snap: ClusterSnapshot, running: dict[str, JobView], free: FreeMap,
                 want: np.ndarray, usable: np.ndarray | None) -> list[Decision]:
        """No increments to undo: shrink workers live (a CPU resize needs no restart) on the
        node where the head lacks only CPU (of the ``usable`` nodes, None: all), down to
        ``min(start_fractions)`` of their request."""
        floor = min(self.cfg.start_fractions)
        fits_rest = (free.free[:, 1:] >= want[1:] - 1e-9).all(axis=1)
        if usable is not None:
            fits_rest &= usable
        best = None
        for i in np.flatnonzero(fits_rest):
            node = free.names[i]
            spare = [(jid, c) for jid, job in running.items() if self.jobs.get(jid) and self.jobs[jid].pending is None
                     for c in job.of_role(Role.WORKER) if c.node == node]
            room = sum(c.res.cpu - self._round(job_req * floor) for jid, c in spare
                       for job_req in (running[jid].spec.worker_res.cpu,) if c.res.cpu > self._round(job_req * floor))
            short = want[0] - free.free[i][0]
            if room >= short and (best is None or short < best[0]):
                best = (short, i, spare)
        if best is None:
            return []
        short, i, spare = best
        out: list[Decision] = []
        for jid, c in sorted(spare, key=lambda x: -x[1].res.cpu):
            if short <= 1e-9:
                break
            low = self._round(running[jid].spec.worker_res.cpu * floor)
            cut = min(c.res.cpu - low, math.ceil(short / self.cfg.core_step) * self.cfg.core_step)
            if cut <= 0:
                continue
            new = Resources(c.res.cpu - cut, c.res.mem_mib, c.res.gpu)
            free.reserve(c.node, new - c.res)
            out.append(Resize(c.id, new))
            short -= cut
            self._reset(self.jobs[jid], snap.now)
            self.jobs[jid].owed = True
        return out
