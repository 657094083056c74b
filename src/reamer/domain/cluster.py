"""Nodes, containers and resource vectors."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource vector: CPU cores, memory (MiB) and GPUs (fractions allowed, e.g. 0.46)."""

    cpu: float = 0.0
    mem_mib: float = 0.0
    gpu: float = 0.0

    def __add__(self, o: Resources) -> Resources:
        return Resources(self.cpu + o.cpu, self.mem_mib + o.mem_mib, self.gpu + o.gpu)

    def __sub__(self, o: Resources) -> Resources:
        return Resources(self.cpu - o.cpu, self.mem_mib - o.mem_mib, self.gpu - o.gpu)

    def scale(self, k: float) -> Resources:
        return Resources(self.cpu * k, self.mem_mib * k, self.gpu * k)

    def fits_in(self, free: Resources, eps: float = 1e-9) -> bool:
        return (
            self.cpu <= free.cpu + eps
            and self.mem_mib <= free.mem_mib + eps
            and self.gpu <= free.gpu + eps
        )


class Role(StrEnum):
    PS = "ps"
    WORKER = "worker"
    INFERENCE = "inference"


@dataclass(frozen=True, slots=True)
class Node:
    """A machine. ``pool`` groups nodes that share defaults (e.g. ``gpu-v100``)."""

    name: str
    cores: float
    mem_mib: float
    gpus: float = 0.0
    gpu_model: str = ""
    nic_gbps: float = 10.0
    pool: str = "default"

    @property
    def capacity(self) -> Resources:
        return Resources(self.cores, self.mem_mib, self.gpus)


@dataclass(frozen=True, slots=True)
class Container:
    """A resource container (pod/cgroup) of a job or service, placed on a node.

    ``res.cpu`` is the CPU limit (CFS quota in cores); ``cpuset`` optionally pins it.
    """

    id: str
    owner: str
    role: Role
    node: str
    res: Resources
    cpuset: tuple[int, ...] | None = None
