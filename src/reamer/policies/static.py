"""``static``: the Kubernetes default. Each job gets exactly the user's request for its whole
life; FIFO order; a job starts only when all its containers fit (gang). With ``backfill``
(default, as kube-scheduler) later jobs that fit start ahead of a blocked head.

A round's cost does not grow with the queue: the policy sees the queue grouped by request
(:mod:`reamer.policies.queue`) and tries each group's jobs in FIFO order only until one does
not fit. The decisions are those of a scan of the whole queue in order, skipping a request
once it did not fit.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from reamer.domain import ClusterSnapshot, Decision, Role, StartJob, TrainingJob
from reamer.policies.placement import FreeMap, Strategy, gang_order
from reamer.policies.queue import RequestGroups


class StaticConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    backfill: bool = True
    placement: Strategy = "spread"  # kube-scheduler LeastAllocated


def request_of(spec: TrainingJob) -> list[tuple[Role, object]]:
    return [(Role.PS, spec.ps_res)] * spec.ps + [(Role.WORKER, spec.worker_res)] * spec.workers


def shape_of(spec: TrainingJob) -> tuple:
    """A job's request as plain numbers, whether it is one pod and the nodes it may use (jobs
    with the same place alike)."""
    p, w = spec.ps_res, spec.worker_res
    return (spec.ps, p.cpu, p.mem_mib, p.gpu, spec.workers, w.cpu, w.mem_mib, w.gpu, spec.one_node,
            spec.ps_nodes, spec.worker_nodes)


class Static:
    name = "static"
    interval_s: float | None = None

    def __init__(self, config: StaticConfig | None = None) -> None:
        self.cfg = config or StaticConfig()
        self._free: FreeMap | None = None
        self._queue = RequestGroups(shape_of)
        # a request's (cores, MiB, GPUs) summed over its containers, and its containers in the order
        # they are placed, by shape_of
        self._requests: dict[tuple, tuple[tuple[float, float, float], list[tuple[Role, object]]]] = {}

    def decide(self, snap: ClusterSnapshot) -> list[Decision]:
        if not snap.queue:
            return []
        free = self._free = FreeMap(snap, self._free)
        cpu, mem, gpu = (float(x) for x in free.sums())  # Σ free: a request above it cannot fit
        out: list[Decision] = []
        groups, requests = self._queue, self._requests
        for key, job in groups.scan(snap.queue, snap.nodes):
            got = requests.get(key)
            if got is None:
                req = job.spec.request
                got = requests[key] = ((req.cpu, req.mem_mib, req.gpu), gang_order(request_of(job.spec)))
            (c, m, g), wants = got
            placed = None
            if c <= cpu * (1 + 1e-9) + 1e-6 and m <= mem * (1 + 1e-9) + 1e-6 and g <= gpu * (1 + 1e-9) + 1e-6:
                placed = free.place_gang(wants, self.cfg.placement, one_node=job.spec.one_node, ordered=True,
                                         spec=job.spec)
            if placed is None:  # this request does not fit now, nor will it later this round
                groups.miss(key)
                if not self.cfg.backfill:
                    break
                continue
            out.append(StartJob(job.id, placed))
            cpu, mem, gpu = cpu - c, mem - m, gpu - g
        return out
