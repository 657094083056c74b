"""Local scenario file (YAML): a real run on this machine — testbed hosts (network
namespaces with ``tc``-limited links, each a cgroup CPU set), PS training jobs of the
real-workload models, inference services with a rate trace, and the policies.

Validated with pydantic; every error is one line naming the file and field
(:class:`reamer.errors.InputError`). The embedded default is ``reamer/data/local.yaml``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, model_validator

from reamer.config.base import NonNeg, PolicySection, Pos, Strict, read_yaml, validate
from reamer.config.scenario import Scenario, parse_scenario
from reamer.domain import Resources, TrainingJob
from reamer.errors import InputError


class HostSpec(Strict):
    """One testbed host = one node: its declared cores (the sum of its containers' quotas may
    not exceed them), the machine CPUs its containers run on, and its link limit."""

    name: str  # host name (one network namespace)
    cores: Pos  # declared cores of the host
    cpus: list[Annotated[int, Field(ge=0)]] | None = None  # None = all CPUs
    link_mbit: Pos | None = None  # None = unlimited (nic_gbps)
    nic_gbps: Pos = 10.0  # the host's NIC bandwidth, used when link_mbit is unset
    mem_gib: Pos = 4.0  # memory of the host (for placement)


class LocalJobSpec(Strict):
    id: str  # unique job id
    model: str  # a real-workload model (reamer.workloads.real.nets.MODELS)
    samples: Pos  # training samples until the job is done
    batch: Annotated[int, Field(ge=1)] = 32  # per-worker batch
    arrival_s: NonNeg = 0.0  # submit time after the run starts
    ps: Annotated[int, Field(ge=1)] = 1  # PS shards requested
    workers: Annotated[int, Field(ge=1)] = 1  # workers requested
    ps_cores: Pos = 0.5  # CPU request of each PS
    worker_cores: Pos = 1.0  # CPU request of each worker
    max_ps: Annotated[int, Field(ge=1)] = 2  # the policy may add PS up to this
    max_workers: Annotated[int, Field(ge=1)] = 2  # ... and workers up to this


class LocalServiceSpec(Strict):
    id: str  # unique service id
    model: str  # a real-workload model with an inference profile
    slo_p99_ms: Pos  # latency SLO: p99 per window (ms)
    rates: Annotated[list[NonNeg], Field(min_length=1)]  # requests/s, one per window
    window_s: Pos = 10.0  # length of each rate window


class LocalPolicySection(PolicySection):
    """The shared ``policy:`` section with a real run's defaults: NEARCHUS every 3 s."""

    training: str = "nearchus"  # the training policy
    interval_s: Pos = 3.0  # control interval of the policies


class LocalScenario(Strict):
    name: str = "local"  # shown in outputs
    seed: Annotated[int, Field(ge=0)] = 0  # seeds the load generator
    max_s: Pos = 180.0  # the run stops after this long
    hosts: Annotated[list[HostSpec], Field(min_length=1)]  # the testbed hosts
    jobs: list[LocalJobSpec] = []  # PS training jobs
    services: list[LocalServiceSpec] = []  # inference services
    system_reserve_cores: NonNeg = 0.25  # per host, for the controller and the load generator
    policy: LocalPolicySection = LocalPolicySection()  # which policies run, with their options
    source: str = "<inline>"

    @model_validator(mode="after")
    def _check(self) -> LocalScenario:
        from reamer.workloads.real.nets import MODELS

        for what, ids in (("host names", [h.name for h in self.hosts]), ("job ids", [j.id for j in self.jobs]),
                          ("service ids", [s.id for s in self.services])):
            if len(set(ids)) != len(ids):
                raise ValueError(f"{what} must be unique (got {ids})")
        for j in self.jobs:
            if j.model not in MODELS:
                raise ValueError(f"job {j.id}: model must be one of {sorted(MODELS)} (got {j.model!r})")
        for s in self.services:
            if s.model not in MODELS:
                raise ValueError(f"service {s.id}: model must be one of {sorted(MODELS)} (got {s.model!r})")
        return self

    def training_jobs(self) -> list[TrainingJob]:
        """The jobs as the backends and policies see them (a container may grow to a host's cores)."""
        top = max(h.cores for h in self.hosts)
        return [TrainingJob(j.id, j.model, j.arrival_s, j.samples, j.ps, j.workers, Resources(j.ps_cores, 512),
                            Resources(j.worker_cores, 1024), batch=j.batch, max_ps=j.max_ps, max_workers=j.max_workers,
                            max_cores_per_container=top) for j in self.jobs]

    def as_simulation(self, restart_s: float) -> Scenario:
        """The same hosts (one node each, a host's link limit as its NIC), seed and policies as a
        simulator scenario whose reshapes pause a job ``restart_s``; its jobs are
        :meth:`training_jobs` (pass them to the simulator)."""
        pools = [{"name": h.name, "count": 1, "cores": h.cores, "mem_gib": h.mem_gib,
                  "nic_gbps": h.link_mbit / 1e3 if h.link_mbit else h.nic_gbps} for h in self.hosts]
        return parse_scenario({"name": f"{self.name}-sim", "seed": self.seed,
                               "cluster": {"node_pools": pools, "restart_s": restart_s},
                               "policy": self.policy.model_dump()}, self.source)


def parse_local(data: Any, source: str) -> LocalScenario:
    if not isinstance(data, dict):
        raise InputError(source, "(top level)", "a YAML mapping with keys hosts, jobs, services, policy")
    return validate(LocalScenario, {**data, "source": source}, source)


def load_local(path: str | Path | None = None) -> LocalScenario:
    """A local scenario file, or the embedded ``local.yaml``."""
    if path is None:
        return parse_local(yaml.safe_load(resources.files("reamer.data").joinpath("local.yaml").read_text()),
                           "local.yaml")
    p = Path(path)
    return parse_local(read_yaml(p, "an existing local scenario YAML file"), str(p))
