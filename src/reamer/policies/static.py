"""``static``: the Kubernetes default. Each job gets exactly the user's request for its whole
life; FIFO order; a job starts only when all its containers fit (gang). With ``backfill``
(default, as kube-scheduler) later jobs that fit start ahead of a blocked head."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from reamer.domain import ClusterSnapshot, Decision, Role, StartJob, TrainingJob
from reamer.policies.placement import FreeMap, Strategy


class StaticConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    backfill: bool = True
    placement: Strategy = "spread"  # kube-scheduler LeastAllocated


def request_of(spec: TrainingJob) -> list[tuple[Role, object]]:
    return [(Role.PS, spec.ps_res)] * spec.ps + [(Role.WORKER, spec.worker_res)] * spec.workers


class Static:
    name = "static"
    interval_s: float | None = None

    def __init__(self, config: StaticConfig | None = None) -> None:
        self.cfg = config or StaticConfig()
        self._free: FreeMap | None = None

    def decide(self, snap: ClusterSnapshot) -> list[Decision]:
        if not snap.queue:
            return []
        free = self._free = FreeMap(snap, self._free)
        failed: set[tuple] = set()
        out: list[Decision] = []
        for job in snap.queue:
            s = job.spec
            p, w = s.ps_res, s.worker_res  # plain numbers: a tuple of them hashes in C
            shape = (s.ps, p.cpu, p.mem_mib, p.gpu, s.workers, w.cpu, w.mem_mib, w.gpu)
            if shape in failed:
                continue
            placed = free.place_gang(request_of(s), self.cfg.placement)
            if placed is None:
                failed.add(shape)
                if not self.cfg.backfill:
                    break
                continue
            out.append(StartJob(job.id, placed))
        return out
