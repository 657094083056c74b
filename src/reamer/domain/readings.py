"""One round's telemetry as columns: the readings of every running job's containers in a few
arrays, so that a policy that screens every job each interval (NEARCHUS's diagnosis) does so
as one array program instead of one mapping per job and container.

A backend may hand its snapshot a table it measured that way (the simulator does); for any
other, :func:`readings_of` builds it from the snapshot's per-job telemetry, so the two forms
always agree (a test checks that the simulator's table is the one its telemetry gives).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from reamer.domain.cluster import Role
from reamer.domain.jobs import JobView
from reamer.domain.snapshot import ClusterSnapshot, ContainerTelemetry, JobTelemetry

# role codes of the ``role`` column
PS, WORKER, INFERENCE = 0, 1, 2
ROLE_CODE = {Role.PS: PS, Role.WORKER: WORKER, Role.INFERENCE: INFERENCE}
# the reading columns, in ContainerTelemetry's field order
READINGS = ContainerTelemetry._fields


@dataclass(frozen=True, slots=True, eq=False)
class ReadingTable:
    """The jobs that reported this round (``jobs``, with their telemetry's ``since`` and
    ``speed``) and their containers, one row each: a job's rows are its view's containers in
    order (``start[i]:start[i + 1]`` for ``jobs[i]``), each with what its container is (role
    code, GPUs, CPU limit as allocated, node index into the snapshot's nodes, -1 if unknown) and
    its readings where it has any (``measured``; 0 elsewhere)."""

    jobs: tuple[str, ...]
    since: np.ndarray  # per job: JobTelemetry.since_s
    speed: np.ndarray  # per job: JobTelemetry.speed
    start: np.ndarray  # int, len(jobs) + 1
    ids: tuple[str, ...]  # container id per row
    job: np.ndarray  # int: the row's job (index into ``jobs``)
    role: np.ndarray  # int: PS / WORKER / INFERENCE
    gpus: np.ndarray  # the container's GPUs
    cores: np.ndarray  # the container's CPU limit as allocated (its view's ``res.cpu``)
    node: np.ndarray  # int: index into the snapshot's nodes (-1: unknown)
    measured: np.ndarray  # bool: the row has readings
    cpu_used: np.ndarray
    cpu_limit: np.ndarray
    throttled_ratio: np.ndarray
    net_gbps: np.ndarray
    net_capacity_gbps: np.ndarray
    mem_used_mib: np.ndarray
    gpu_util: np.ndarray

    @property
    def index(self) -> dict[str, int]:
        """Job id -> its index in ``jobs``."""
        return {jid: i for i, jid in enumerate(self.jobs)}

    @classmethod
    def of(cls, running: Sequence[JobView], telemetry: Mapping[str, JobTelemetry],
           node_index: Mapping[str, int] | None = None) -> ReadingTable:
        """The table of the jobs among ``running`` that have telemetry, in that order
        (``node_index``: node name -> index; None: -1)."""
        jobs, start, ids, meta, vals, measured, rates = [], [0], [], [], [], [], []
        zero = (0.0,) * len(READINGS)
        for v in running:
            tel = telemetry.get(v.id)
            if tel is None:
                continue
            jobs.append(v.id)
            rates.append((tel.since_s, tel.speed))
            get = tel.containers.get
            for c in v.containers:
                t = get(c.id)
                ids.append(c.id)
                meta.append((len(jobs) - 1, ROLE_CODE[c.role], c.res.gpu, c.res.cpu,
                             -1 if node_index is None else node_index.get(c.node, -1)))
                measured.append(t is not None)
                vals.append(zero if t is None else tuple(t))
            start.append(len(ids))
        m = np.array(meta, dtype=float).reshape(-1, 5)
        r = np.array(vals, dtype=float).reshape(-1, len(READINGS))
        since, speed = np.array(rates, dtype=float).reshape(-1, 2).T
        job, role, gpus, cores, node = m.T
        return cls(tuple(jobs), since, speed, np.array(start), tuple(ids), job.astype(int), role.astype(int), gpus,
                   cores, node.astype(int), np.array(measured, dtype=bool), *r.T)


class TableReadings(Mapping[str, ContainerTelemetry]):
    """One job's readings (its measured rows of a :class:`ReadingTable`) as the mapping
    :class:`JobTelemetry` carries, built when first read: a policy that reads the table, or only
    job speeds, does not pay for one named tuple per container."""

    __slots__ = ("_table", "_i", "_d")

    def __init__(self, table: ReadingTable, i: int) -> None:
        self._table, self._i = table, i
        self._d: dict[str, ContainerTelemetry] | None = None

    def _built(self) -> dict[str, ContainerTelemetry]:
        if self._d is None:
            t = self._table
            s, e = int(t.start[self._i]), int(t.start[self._i + 1])
            cols = [getattr(t, f)[s:e].tolist() for f in READINGS]
            keep = t.measured[s:e].tolist()
            self._d = {cid: ContainerTelemetry(*row) for cid, row, k in zip(t.ids[s:e], zip(*cols), keep) if k}
        return self._d

    def column(self, name: str) -> dict[str, float]:
        """One reading (a ``READINGS`` name) of each measured container, by id, read from the
        table's column (no named tuple per container)."""
        t = self._table
        s, e = int(t.start[self._i]), int(t.start[self._i + 1])
        return {cid: v for cid, v, k in zip(t.ids[s:e], getattr(t, name)[s:e].tolist(), t.measured[s:e].tolist()) if k}

    def __getitem__(self, cid: str) -> ContainerTelemetry:
        return self._built()[cid]

    def get(self, cid: str, default: ContainerTelemetry | None = None) -> ContainerTelemetry | None:
        return self._built().get(cid, default)

    def __contains__(self, cid: object) -> bool:
        return cid in self._built()

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


class TableTelemetry(Mapping[str, JobTelemetry]):
    """A :class:`ReadingTable` as the per-job telemetry a snapshot carries, each job's
    :class:`JobTelemetry` made when first read."""

    __slots__ = ("table", "_index", "_made")

    def __init__(self, table: ReadingTable) -> None:
        self.table = table
        self._index: dict[str, int] | None = None
        self._made: dict[str, JobTelemetry] = {}

    def get(self, jid: str, default: JobTelemetry | None = None) -> JobTelemetry | None:
        tel = self._made.get(jid)
        if tel is None:
            if self._index is None:
                self._index = self.table.index
            i = self._index.get(jid)
            if i is None:
                return default
            t = self.table
            tel = self._made[jid] = JobTelemetry(float(t.since[i]), float(t.speed[i]), TableReadings(t, i))
        return tel

    def __getitem__(self, jid: str) -> JobTelemetry:
        tel = self.get(jid)
        if tel is None:
            raise KeyError(jid)
        return tel

    def __contains__(self, jid: object) -> bool:
        if self._index is None:
            self._index = self.table.index
        return jid in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self.table.jobs)

    def __len__(self) -> int:
        return len(self.table.jobs)


def reading_by_container(containers: Mapping[str, ContainerTelemetry], name: str) -> dict[str, float]:
    """``{id: reading.<name>}`` of a job's container readings; from the table's column where
    they are a table's (:meth:`TableReadings.column`)."""
    if isinstance(containers, TableReadings):
        return containers.column(name)
    return {cid: getattr(c, name) for cid, c in containers.items()}


def readings_of(snap: ClusterSnapshot) -> ReadingTable:
    """The snapshot's readings as a table: the one its backend measured, else built from its
    per-job telemetry (node indexes into ``snap.nodes``)."""
    if snap.readings is not None:
        return snap.readings
    return ReadingTable.of(snap.running, snap.telemetry, {n.name: i for i, n in enumerate(snap.nodes)})
