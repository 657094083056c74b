"""``optimus`` baseline (Peng et al., EuroSys 2018; docs/design.md#baselines).

* Speed model per job, fitted online with non-negative least squares on observed
  (p, w, speed) points: synchronous ``steps/s = 1 / (θ0·M/w + θ1 + θ2·w/p + θ3·w + θ4·p)``
  with M the global batch (w × per-worker batch). Until a job has ``min_points`` distinct
  configurations, it walks through the small ``explore`` configurations, one per interval.
* Every interval (its time slot: a round between slots, on an arrival or a completion, changes
  nothing; a job that arrives waits for the next slot, as in the paper's scheduler): every job
  (running, then queued in FIFO order) gets 1 PS + 1 worker if it
  fits; then repeatedly the job whose next task (a PS or a worker, whichever gains more)
  gives the largest reduction of remaining time per unit of that task's dominant resource
  share gets it; stop when the gain is ≤ 0 or the best task no longer fits. A job has at most
  ``max_ps`` PS and ``max_workers`` workers (its spec).
* Tasks have the size of the user's request (Optimus scales counts, not container sizes);
  placement packs tasks onto the fewest nodes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from reamer.domain import (
    AddContainer,
    ClusterSnapshot,
    Container,
    Decision,
    JobView,
    RemoveContainer,
    Resources,
    Role,
    StartJob,
    TrainingJob,
)
from reamer.policies.placement import FreeMap, Strategy
from reamer.policies.queue import RequestGroups


class OptimusConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_points: int = Field(5, ge=5)
    explore: list[tuple[int, int]] = [(1, 1), (1, 2), (2, 2), (2, 3), (1, 3), (2, 4)]
    placement: Strategy = "pack"


class _Series:
    """A configuration's measured speeds, grown in place, and their mean (numpy's, kept up
    to date at every append; over a list it would convert the whole list each time)."""

    __slots__ = ("buf", "n", "mean")

    def __init__(self) -> None:
        self.buf = np.empty(8)
        self.n = 0
        self.mean = 0.0

    def append(self, x: float) -> None:
        if self.n == len(self.buf):
            self.buf = np.concatenate([self.buf, np.empty(self.n)])
        self.buf[self.n] = x
        self.n += 1
        self.mean = float(np.mean(self.buf[:self.n]))


@dataclass
class _Job:
    config: tuple[int, int] = (0, 0)
    since: float = 0.0
    points: dict[tuple[int, int], _Series] = field(default_factory=dict)
    theta: tuple[float, ...] | None = None
    chains: dict[tuple[float, float], _Chain] = field(default_factory=dict)  # _chain's memo (this theta)
    seen: tuple[Container, ...] | None = None  # the containers ``config`` was counted from


@dataclass(frozen=True)
class _Chain:
    steps: list[tuple[float, Role]]  # (gain per unit of remaining work, role) of each task in turn
    end: tuple[int, int]  # (PS, workers) once all are granted


def _features(p: int, w: int, batch: int) -> list[float]:
    return [batch, 1.0, w / p, w, p]  # M/w = per-worker batch


class Optimus:
    name = "optimus"

    def __init__(self, config: OptimusConfig | None = None, interval_s: float = 60.0) -> None:
        self.cfg = config or OptimusConfig()
        self.interval_s = interval_s
        self.jobs: dict[str, _Job] = {}
        self._free: FreeMap | None = None
        self._slot: float | None = None  # when the last slot's allocation was made
        # the queue by request: a request the pool did not have room for is skipped for the round
        self._queue = RequestGroups(lambda s: (s.ps_res, s.worker_res, s.ps_nodes, s.worker_nodes))

    # ------------------------------------------------------------- the model
    def _observe(self, job: JobView, st: _Job, snap: ClusterSnapshot) -> None:
        if job.containers != st.seen:  # (the same containers: the same count, compared item by item)
            st.seen = job.containers
            p, w = len(job.of_role(Role.PS)), len(job.of_role(Role.WORKER))
            if (p, w) != st.config:  # measured from the slot that changed it
                st.config, st.since = (p, w), snap.now if self._slot is None else self._slot
                return
        p, w = st.config
        tel = snap.telemetry.get(job.id)
        if tel is not None and tel.since_s >= st.since - 1e-9 and tel.speed > 0:
            pts = st.points.get((p, w))
            if pts is None:
                pts = st.points[(p, w)] = _Series()
            pts.append(tel.speed)
            st.chains.clear()
            if len(st.points) >= self.cfg.min_points:
                st.theta = self._fit(st.points, job.spec.batch)

    @staticmethod
    def _fit(points: dict[tuple[int, int], _Series], batch: int) -> tuple[float, ...]:
        """Fit θ to every configuration's mean speed (the model's time per step)."""
        a = [_features(p, w, batch) for p, w in points]
        y = [1.0 / (s.mean / (w * batch)) for (p, w), s in points.items()]
        from scipy.optimize import nnls  # deferred: scipy costs ~0.5 s at import

        theta, _ = nnls(np.array(a), np.array(y))
        return tuple(theta.tolist())

    def _chain(self, st: _Job, spec: TrainingJob, share_ps: float, share_w: float) -> _Chain:
        """The tasks the greedy would give the job from 1 PS + 1 worker, one at a time: at
        each step the one (a PS or a worker) whose gain per unit of remaining work, per unit
        of its dominant share, is larger; until no task gains or the job's maxima. Kept
        until its model is re-fitted."""
        key = (share_ps, share_w)
        chain = st.chains.get(key)
        if chain is not None:
            return chain
        # the model's time per sample at every (PS, workers) up to its maxima, in one array
        # program: inv[p - 1][w - 1]
        t0, t1, t2, t3, t4 = st.theta
        ps = np.arange(1, max(1, spec.max_ps) + 1)[:, None]
        ws = np.arange(1, max(1, spec.max_workers) + 1)[None, :]
        t = t0 * spec.batch + t1 + t2 * (ws / ps) + t3 * ws + t4 * ps
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(t > 0, ws * spec.batch / t, 0.0)
        inv = (1.0 / np.maximum(v, 1e-12)).tolist()
        p, w = 1, 1
        steps: list[tuple[float, Role]] = []
        while True:
            row = inv[p - 1]
            now_t = row[w - 1]
            out = None
            if p + 1 <= spec.max_ps:  # its maxima: spec.max_ps PS, spec.max_workers workers
                out = ((now_t - inv[p][w - 1]) / share_ps, Role.PS)
            if w + 1 <= spec.max_workers:
                gain = (now_t - row[w]) / share_w
                if out is None or gain > out[0]:
                    out = (gain, Role.WORKER)
            if out is None or out[0] <= 0:
                break
            steps.append(out)
            p, w = (p + 1, w) if out[1] is Role.PS else (p, w + 1)
        chain = st.chains[key] = _Chain(steps, (p, w))
        return chain

    # --------------------------------------------------------------- a round
    def decide(self, snap: ClusterSnapshot) -> list[Decision]:
        if not snap.periodic:
            return []  # between slots
        running = {j.id: j for j in snap.running}
        for jid in list(self.jobs):
            if jid not in running:
                del self.jobs[jid]
        for job in snap.running:
            st = self.jobs.get(job.id)
            if st is None:
                st = self.jobs[job.id] = _Job(since=snap.now)
            self._observe(job, st, snap)
        self._slot = snap.now
        if not snap.running and not snap.queue:
            return []
        free = self._free = FreeMap(snap, self._free)
        tc, tm, tg = (float(x) for x in free.cap.sum(axis=0))
        pool = [0.0, 0.0, 0.0]  # free now + what the running jobs hold (as Σ of each job's allocated)
        for job in snap.running:
            cpu = mem = gpu = 0.0
            for c in job.containers:
                cpu, mem, gpu = cpu + c.res.cpu, mem + c.res.mem_mib, gpu + c.res.gpu
            pool[0], pool[1], pool[2] = pool[0] + cpu, pool[1] + mem, pool[2] + gpu
        have = free.total_free()
        pool = [have.cpu + pool[0], have.mem_mib + pool[1], have.gpu + pool[2]]
        target: dict[str, list[int]] = {}

        def take(res: Resources) -> bool:
            if res.cpu <= pool[0] + 1e-9 and res.mem_mib <= pool[1] + 1e-9 and res.gpu <= pool[2] + 1e-9:
                pool[0] -= res.cpu
                pool[1] -= res.mem_mib
                pool[2] -= res.gpu
                return True
            return False

        def first(job: JobView) -> bool:  # 1 PS + 1 worker, if it fits
            s = job.spec
            if take(s.ps_res):
                if take(s.worker_res):
                    target[job.id] = [1, 1]
                    return True
                pool[0] += s.ps_res.cpu
                pool[1] += s.ps_res.mem_mib
                pool[2] += s.ps_res.gpu
            return False

        for job in snap.running:
            first(job)
        starting: list[JobView] = []  # queued jobs given 1 PS + 1 worker, in FIFO order
        groups = self._queue
        for key, job in groups.scan(snap.queue, snap.nodes):  # the pool only shrinks: a miss stands
            if first(job):
                starting.append(job)
            else:
                groups.miss(key)
        specs = {j.id: j.spec for j in (*snap.running, *starting)}
        remaining = {j.id: j.remaining for j in (*snap.running, *starting)}
        for jid in list(target):  # jobs still exploring walk their small configurations
            st = self.jobs.get(jid)
            if st is None or st.theta is not None:
                continue
            want = next((c for c in self.cfg.explore if c not in st.points), (1, 1))
            spec = specs[jid]
            while target[jid][0] < want[0] and take(spec.ps_res):
                target[jid][0] += 1
            while target[jid][1] < want[1] and take(spec.worker_res):
                target[jid][1] += 1

        def share(res: Resources) -> float:  # the task's dominant resource share
            return max(res.cpu / tc, res.mem_mib / max(tm, 1), res.gpu / tg if tg else 0.0)

        # Each job's next tasks, best first, with their gains per unit of remaining work: a
        # task's gain is remaining × (1 ÷ speed now − 1 ÷ speed with it) ÷ its dominant
        # share, so a job's order of tasks does not depend on its remaining work, only on
        # its model — and is remembered with it (_chain).
        chains = {}
        for jid in target:
            st = self.jobs.get(jid)
            if st is not None and st.theta is not None and remaining[jid] > 0:
                spec = specs[jid]
                chains[jid] = self._chain(st, spec, share(spec.ps_res), share(spec.worker_res))
        need = [0.0, 0.0, 0.0]
        for jid, chain in chains.items():
            spec = specs[jid]
            for res, n in ((spec.ps_res, chain.end[0] - 1), (spec.worker_res, chain.end[1] - 1)):
                need[0], need[1], need[2] = need[0] + n * res.cpu, need[1] + n * res.mem_mib, need[2] + n * res.gpu
        if all(n <= p - 1e-6 * max(1.0, abs(p)) for n, p in zip(need, pool, strict=True)):
            for jid, chain in chains.items():  # room for every task: the greedy grants them all
                target[jid] = list(chain.end)
            return self._diff(snap, target, free, starting)
        heap = []
        at: dict[str, int] = {}
        for jid, chain in chains.items():
            if chain.steps:
                at[jid] = 0
                heap.append((-remaining[jid] * chain.steps[0][0], jid, chain.steps[0][1]))
        heapq.heapify(heap)
        while heap:  # the job whose next task gains most per share gets it, while it fits
            _, jid, role = heapq.heappop(heap)
            spec = specs[jid]
            if not take(spec.ps_res if role is Role.PS else spec.worker_res):
                continue
            target[jid][0 if role is Role.PS else 1] += 1
            k = at[jid] = at[jid] + 1
            steps = chains[jid].steps
            if k < len(steps):
                heapq.heappush(heap, (-remaining[jid] * steps[k][0], jid, steps[k][1]))
        return self._diff(snap, target, free, starting)

    def _diff(self, snap: ClusterSnapshot, target: dict[str, list[int]], free: FreeMap,
              starting: list[JobView]) -> list[Decision]:
        out: list[Decision] = []
        adds: list[tuple[JobView, Role, int]] = []
        for job in snap.running:
            p, w = target.get(job.id, [1, 1])
            for role, want in ((Role.PS, p), (Role.WORKER, w)):
                have = job.of_role(role)
                for c in have[want:][::-1] if len(have) > want else ():
                    out.append(RemoveContainer(c.id))
                    free.reserve(c.node, Resources() - c.res)
                if want > len(have):
                    adds.append((job, role, want - len(have)))
        for job in starting:  # start waiting jobs before growing running ones
            p, w = target[job.id]
            s = job.spec
            placed = free.place_gang([(Role.PS, s.ps_res)] * p + [(Role.WORKER, s.worker_res)] * w, self.cfg.placement,
                                     one_node=s.one_node, spec=s)
            if placed is None:
                placed = free.place_gang([(Role.PS, s.ps_res), (Role.WORKER, s.worker_res)], self.cfg.placement,
                                         one_node=s.one_node, spec=s)
            if placed is not None:
                out.append(StartJob(job.id, placed))
                self.jobs[job.id] = _Job(since=snap.now)
        for job, role, n in adds:
            res = job.spec.ps_res if role is Role.PS else job.spec.worker_res
            for _ in range(n):
                pl = free.place_one(role, res, self.cfg.placement, allowed=free.home(job, role))
                if pl is None:
                    break
                out.append(AddContainer(job.id, pl))
        return out
