"""The training half of the shared cluster state: nodes and their free capacity, job and
container records with their ids, and the validation of every training decision.

:meth:`ClusterState.apply` checks a policy's decision against the state (it fits, CPU > 0,
a job keeps at least one PS and one worker, the job or container exists in the right
phase), books it, and returns the typed :data:`Effect` a backend carries out:

* :class:`Launch` — start these containers of a job that was queued;
* :class:`SetQuota` — change one running container's CPU/memory in place;
* :class:`Reshape` — the job's PS/worker set changed (a restart with a checkpoint in PS
  frameworks, whose cluster spec is fixed at start);
* :class:`Stop` — the job's containers are released (preempted back to the queue, or done).

A backend never books anything itself: the simulator turns effects into speeds and time
integrals, the local backend into processes and cgroups, a Kubernetes backend into pod
patches. What the harvesting side needs to know about training (containers, limits and
requests by node, the CPU a round's decisions are about to take) it reads here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from reamer.domain import (
    AddContainer,
    ClusterSnapshot,
    Container,
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
from reamer.domain.decisions import InvalidDecision, Placement, check_start
from reamer.domain.readings import ReadingTable
from reamer.domain.snapshot import ChunkedViews, FreeByNode

_new_view = tuple.__new__  # a JobView from its fields in order, without the named tuple's keyword handling


@dataclass
class JobRecord:
    """What the cluster knows about one job, whatever runs it."""

    spec: TrainingJob
    state: JobState = JobState.QUEUED
    containers: dict[str, Container] = field(default_factory=dict)
    next_id: int = 0  # the next container's number (ids are never reused)
    queued_since: float = 0.0
    order: int = 0  # its place in the FIFO queue: the number of its latest enqueue (submit or requeue)
    queue_s: float = 0.0  # total time queued before each start
    started_s: float | None = None  # first start
    finished_s: float | None = None
    last_change_s: float | None = None  # last time its allocation changed
    reconfigs: int = 0  # resizes and reshapes

    @property
    def id(self) -> str:
        return self.spec.id

    def count(self, role: Role) -> int:
        return sum(1 for c in self.containers.values() if c.role is role)

    def view(self, samples_done: float, progress_s: float) -> JobView:
        """The job as a policy sees it, with the progress a backend measured (made as a tuple:
        a backend makes one per running job and telemetry interval)."""
        return _new_view(JobView, (self.spec, self.state, tuple(self.containers.values()), samples_done, progress_s,
                                   self.started_s, self.last_change_s, self.order))


@dataclass(frozen=True, slots=True)
class Growth:
    """What a round's decisions will add on one node: CPU limits, CPU requests, memory."""

    cpu: float = 0.0
    request: float = 0.0
    mem_mib: float = 0.0


# ----------------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Launch:
    """Start ``containers``, the whole of a queued job (gang)."""

    job: str
    containers: tuple[Container, ...]


@dataclass(frozen=True, slots=True)
class SetQuota:
    """``container`` (as it is now) was resized in place from ``before``."""

    job: str
    container: Container
    before: Resources


@dataclass(frozen=True, slots=True)
class Reshape:
    """The job's PS/worker set changed by ``added`` / ``removed``: restart it in its new shape."""

    job: str
    added: tuple[Container, ...] = ()
    removed: tuple[Container, ...] = ()


@dataclass(frozen=True, slots=True)
class Stop:
    """The job's ``containers`` are released: back in the queue (``requeued``) or done."""

    job: str
    containers: tuple[Container, ...]
    requeued: bool


Effect = Launch | SetQuota | Reshape | Stop


def effect_nodes(e: Effect) -> set[str]:
    """The nodes whose containers an effect changes."""
    if isinstance(e, SetQuota):
        return {e.container.node}
    if isinstance(e, Reshape):
        return {c.node for c in (*e.added, *e.removed)}
    return {c.node for c in e.containers}


# ----------------------------------------------------------------------------- state


class ClusterState:
    """The one owner of the training side's bookkeeping. ``cpusets`` pins a node's containers
    to machine CPUs (the local backend's hosts); containers elsewhere carry none."""

    def __init__(self, nodes: Sequence[Node], cpusets: Mapping[str, tuple[int, ...] | None] | None = None) -> None:
        self.nodes = tuple(nodes)
        self.node_by_name = {n.name: n for n in self.nodes}
        if len(self.node_by_name) != len(self.nodes):
            raise ValueError("nodes: expected unique names")
        self.cpusets = dict(cpusets or {})
        self.free: dict[str, Resources] = {n.name: n.capacity for n in self.nodes}
        # the same free capacity as rows (cores, MiB, GPUs) in node order, for policies' placement
        self._row = {n.name: i for i, n in enumerate(self.nodes)}
        self._rows_of = MappingProxyType(self._row)  # snapshots read their free rows through it
        self._free_rows = np.array([(n.cores, n.mem_mib, n.gpus) for n in self.nodes], dtype=float).reshape(-1, 3)
        self._per_node = np.zeros(len(self.nodes))  # training containers per node, in node order
        self._enqueued = 0  # enqueues so far (JobRecord.order)
        self.jobs: dict[str, JobRecord] = {}
        self.queue: dict[str, None] = {}  # queued jobs in arrival order (an insertion-ordered set)
        self.running: dict[str, None] = {}
        self.owner: dict[str, str] = {}  # container id -> job id (running jobs only)
        # containers per node, insertion-ordered (not a set) so that sums over them are
        # reproducible across processes whatever the string-hash seed
        self.on_node: dict[str, dict[str, None]] = {n.name: {} for n in self.nodes}
        self._on: dict[str, tuple[Container, ...]] = {}  # containers_on, until a container of the node changes
        self._totals: dict[str, tuple[tuple[Container, ...], tuple[float, float, float]]] = {}  # node_totals
        self.cpu_alloc = self.gpu_alloc = 0.0  # Σ allocated over all nodes

    # ------------------------------------------------------------------ events
    def submit(self, spec: TrainingJob, now: float) -> JobRecord:
        if spec.id in self.jobs:
            raise InvalidDecision(f"job {spec.id} was submitted twice")
        rec = self.jobs[spec.id] = JobRecord(spec, queued_since=now)
        self._enqueue(rec)
        return rec

    def _enqueue(self, rec: JobRecord) -> None:
        self._enqueued += 1
        rec.order = self._enqueued
        self.queue[rec.spec.id] = None

    def restore(self, spec: TrainingJob, containers: Sequence[Container], *, next_id: int, queued_since: float,
                queue_s: float = 0.0, started_s: float | None = None, last_change_s: float | None = None,
                reconfigs: int = 0, force: bool = False, finished_s: float | None = None) -> JobRecord:
        """Book a job as a durable record describes it (a controller rebuilding its state from
        the cluster after a restart): done at ``finished_s`` when given (``containers`` must
        then be empty), else queued when ``containers`` is empty, else running on them. The
        containers must fit, as when they were decided — unless ``force``: what runs is booked
        even where a node is now overcommitted (its free capacity goes negative, so nothing
        new is placed there)."""
        if finished_s is not None and containers:
            raise InvalidDecision(f"restore {spec.id}: a finished job holds no containers")
        need: dict[str, Resources] = {}
        for c in containers:  # validated before anything is booked: a refusal changes nothing
            self._check_placement(Placement(c.role, c.node, c.res))
            need[c.node] = need.get(c.node, Resources()) + c.res
        for node, res in need.items():
            if not force and not res.fits_in(self.free[node]):
                raise InvalidDecision(f"restore {spec.id}: {res} does not fit on {node} (free {self.free[node]})")
        rec = self.submit(spec, queued_since)
        rec.queue_s, rec.started_s, rec.last_change_s, rec.reconfigs = queue_s, started_s, last_change_s, reconfigs
        if finished_s is not None:
            del self.queue[spec.id]
            rec.state, rec.finished_s = JobState.DONE, finished_s
        if containers:
            for c in containers:
                self._book(rec, c)
            del self.queue[spec.id]
            self.running[spec.id] = None
            rec.state = JobState.RUNNING
        rec.next_id = next_id
        return rec

    def apply(self, d: Decision, now: float) -> Effect:
        """Validate ``d``, book it and return what the backend must carry out. An invalid
        decision raises :class:`InvalidDecision` and changes nothing."""
        if isinstance(d, StartJob):
            return self._start(d, now)
        if isinstance(d, Resize):
            return self._resize(d, now)
        if isinstance(d, AddContainer):
            return self._add(d, now)
        if isinstance(d, RemoveContainer):
            return self._remove(d, now)
        if isinstance(d, Preempt):
            return self._release(self._job(d.job, JobState.RUNNING), now, requeue=True)
        raise InvalidDecision(f"unknown decision {d!r}")

    def finish(self, jid: str, now: float) -> Stop:
        """A running job completed: its containers are released."""
        return self._release(self._job(jid, JobState.RUNNING), now, requeue=False)

    def mark_changed(self, jid: str, at: float) -> None:
        """The job's change took effect at ``at`` (after a restart, later than decided)."""
        self.jobs[jid].last_change_s = at

    # ------------------------------------------------------------------ reads
    def container(self, cid: str) -> Container:
        return self.jobs[self.owner[cid]].containers[cid]

    def containers_on(self, node: str) -> tuple[Container, ...]:
        """The training containers on ``node``, in placement order."""
        got = self._on.get(node)
        if got is None:
            got = self._on[node] = tuple(self.jobs[self.owner[cid]].containers[cid] for cid in self.on_node[node])
        return got

    def cpu_limits(self, node: str) -> float:
        """Σ CPU limits of the training containers on ``node``."""
        return self.node_totals(node)[0]

    def node_totals(self, node: str) -> tuple[float, float, float]:
        """(Σ CPU limits, Σ requested CPU (:meth:`requested_cpu`), Σ memory) of the training
        containers on ``node``; kept while they are the same (:meth:`containers_on`)."""
        on = self.containers_on(node)
        got = self._totals.get(node)
        if got is None or got[0] is not on:
            got = self._totals[node] = (on, (sum(c.res.cpu for c in on), sum(self.requested_cpu(c) for c in on),
                                             sum(c.res.mem_mib for c in on)))
        return got[1]

    def requested_cpu(self, c: Container) -> float:
        """The CPU the job's user requested for a container of ``c``'s role (what a
        Kubernetes scheduler books)."""
        spec = self.jobs[c.owner].spec
        return (spec.worker_res if c.role is Role.WORKER else spec.ps_res).cpu

    def growth(self, decisions: Iterable[Decision]) -> dict[str, Growth]:
        """What ``decisions`` add per node once applied — what training is about to take: CPU
        limits, the requests of new containers, their memory. What they release counts only
        once it is freed."""
        grow: dict[str, Growth] = {}

        def add(node: str, cpu: float, request: float = 0.0, mem: float = 0.0) -> None:
            g = grow.get(node, Growth())
            grow[node] = Growth(g.cpu + cpu, g.request + request, g.mem_mib + mem)

        for d in decisions:
            if isinstance(d, StartJob | AddContainer) and d.job in self.jobs:
                spec = self.jobs[d.job].spec
                for p in d.placements if isinstance(d, StartJob) else (d.placement,):
                    req = (spec.worker_res if p.role is Role.WORKER else spec.ps_res).cpu
                    add(p.node, p.res.cpu, req, p.res.mem_mib)
            elif isinstance(d, Resize) and d.container in self.owner:
                c = self.container(d.container)
                add(c.node, max(0.0, d.res.cpu - c.res.cpu), mem=max(0.0, d.res.mem_mib - c.res.mem_mib))
        return grow

    def snapshot(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
                 telemetry: Mapping[str, JobTelemetry], readings: ReadingTable | None = None,
                 periodic: bool = True) -> ClusterSnapshot:
        """``readings``: ``telemetry`` as columns, where the backend measured it so; ``periodic``:
        :attr:`ClusterSnapshot.periodic`."""
        rows, per_node = self._free_rows.copy(), self._per_node.copy()
        rows.flags.writeable = per_node.flags.writeable = False
        running = running if isinstance(running, tuple | ChunkedViews) else tuple(running)  # immutable as it is
        return ClusterSnapshot(now, self.nodes, FreeByNode(self._rows_of, rows), tuple(queue), running,
                               MappingProxyType(telemetry), rows, per_node, readings, periodic)

    # ------------------------------------------------------------------ booking
    def _job(self, jid: str, state: JobState) -> JobRecord:
        j = self.jobs.get(jid)
        if j is None or j.state is not state:
            raise InvalidDecision(f"job {jid} is not {state.value}")
        return j

    def _running_container(self, cid: str) -> tuple[JobRecord, Container]:
        jid = self.owner.get(cid)
        if jid is None:
            raise InvalidDecision(f"unknown container {cid}")
        j = self.jobs[jid]
        return j, j.containers[cid]

    def _check_placement(self, p: Placement, spec: TrainingJob | None = None) -> None:
        """A valid training container; with ``spec`` (a new placement, not a restored one) also
        on a node the job allows its role."""
        if p.role not in (Role.PS, Role.WORKER):
            raise InvalidDecision(f"a training container is a PS or a worker, got {p.role.value}")
        if p.node not in self.free:
            raise InvalidDecision(f"unknown node {p.node}")
        if p.res.cpu <= 0:
            raise InvalidDecision(f"a container on {p.node} needs CPU > 0, got {p.res.cpu}")
        if spec is not None and (allowed := spec.nodes_for(p.role)) is not None and p.node not in allowed:
            raise InvalidDecision(f"job {spec.id}: a {p.role.value} may not run on {p.node} "
                                  f"(its nodes: {', '.join(sorted(allowed)[:5]) or 'none'}"
                                  f"{', ...' if len(allowed) > 5 else ''})")

    def _place(self, j: JobRecord, p: Placement) -> Container:
        c = Container(f"{j.spec.id}/{p.role.value}{j.next_id}", j.spec.id, p.role, p.node, p.res,
                      self.cpusets.get(p.node))
        j.next_id += 1
        self._book(j, c)
        return c

    def _book(self, j: JobRecord, c: Container) -> None:
        self.free[c.node] = self.free[c.node] - c.res
        self._free_rows[self._row[c.node]] -= (c.res.cpu, c.res.mem_mib, c.res.gpu)
        self._per_node[self._row[c.node]] += 1
        self.cpu_alloc += c.res.cpu
        self.gpu_alloc += c.res.gpu
        j.containers[c.id] = c
        self.owner[c.id] = j.spec.id
        self.on_node[c.node][c.id] = None
        self._on.pop(c.node, None)

    def _unplace(self, c: Container) -> None:
        self.free[c.node] = self.free[c.node] + c.res
        self._free_rows[self._row[c.node]] += (c.res.cpu, c.res.mem_mib, c.res.gpu)
        self._per_node[self._row[c.node]] -= 1
        self.cpu_alloc -= c.res.cpu
        self.gpu_alloc -= c.res.gpu
        self.on_node[c.node].pop(c.id, None)
        self._on.pop(c.node, None)
        del self.owner[c.id]

    def _changed(self, j: JobRecord, now: float) -> None:
        j.last_change_s = now
        j.reconfigs += 1

    def _start(self, d: StartJob, now: float) -> Launch:
        j = self._job(d.job, JobState.QUEUED)
        for p in d.placements:
            self._check_placement(p, j.spec)
        check_start(d, self.free, j.spec.one_node)
        containers = tuple(self._place(j, p) for p in d.placements)
        del self.queue[d.job]
        self.running[d.job] = None
        j.state = JobState.RUNNING
        j.queue_s += now - j.queued_since
        if j.started_s is None:
            j.started_s = now
        j.last_change_s = now
        return Launch(j.spec.id, containers)

    def _resize(self, d: Resize, now: float) -> SetQuota:
        j, c = self._running_container(d.container)
        free = self.free[c.node] + c.res
        if not d.res.fits_in(free) or d.res.cpu <= 0:
            raise InvalidDecision(f"resize {c.id} to {d.res}: does not fit on {c.node}")
        self._changed(j, now)
        self.free[c.node] = free - d.res
        row = self._free_rows[self._row[c.node]]
        row += (c.res.cpu, c.res.mem_mib, c.res.gpu)
        row -= (d.res.cpu, d.res.mem_mib, d.res.gpu)
        self.cpu_alloc += d.res.cpu - c.res.cpu
        self.gpu_alloc += d.res.gpu - c.res.gpu
        new = j.containers[c.id] = Container(c.id, c.owner, c.role, c.node, d.res, c.cpuset)
        self._on.pop(c.node, None)
        return SetQuota(j.spec.id, new, c.res)

    def _add(self, d: AddContainer, now: float) -> Reshape:
        j = self._job(d.job, JobState.RUNNING)
        p = d.placement
        self._check_placement(p, j.spec)
        if not p.res.fits_in(self.free[p.node]):
            raise InvalidDecision(f"{p.res} does not fit on {p.node} (free {self.free[p.node]})")
        if j.spec.one_node and p.node not in (home := {c.node for c in j.containers.values()}):
            raise InvalidDecision(f"add to {j.spec.id}: a one-node job's containers stay on {min(home)}, not {p.node}")
        self._changed(j, now)
        return Reshape(j.spec.id, added=(self._place(j, p),))

    def _remove(self, d: RemoveContainer, now: float) -> Reshape:
        j, c = self._running_container(d.container)
        if j.count(c.role) <= 1:
            raise InvalidDecision(f"remove {c.id}: a job keeps at least one {c.role.value}")
        self._changed(j, now)
        self._unplace(c)
        del j.containers[c.id]
        return Reshape(j.spec.id, removed=(c,))

    def _release(self, j: JobRecord, now: float, requeue: bool) -> Stop:
        released = tuple(j.containers.values())
        for c in released:
            self._unplace(c)
        j.containers = {}
        del self.running[j.spec.id]
        if requeue:
            j.state = JobState.QUEUED
            j.queued_since = now
            self._enqueue(j)
        else:
            j.state = JobState.DONE
            j.finished_s = now
        return Stop(j.spec.id, released, requeue)
