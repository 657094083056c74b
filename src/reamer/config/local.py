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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from reamer.config.scenario import read_yaml
from reamer.errors import InputError

Pos = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HostSpec(_Strict):
    """One testbed host = one node: its declared cores (the sum of its containers' quotas may
    not exceed them), the machine CPUs its containers run on, and its link limit."""

    name: str
    cores: Pos
    cpus: list[Annotated[int, Field(ge=0)]] | None = None  # None = all CPUs
    link_mbit: Pos | None = None  # None = unlimited (nic_gbps)
    nic_gbps: Pos = 10.0
    mem_gib: Pos = 4.0


class LocalJobSpec(_Strict):
    id: str
    model: str  # a real-workload model (reamer.workloads.real.nets.MODELS)
    samples: Pos
    batch: Annotated[int, Field(ge=1)] = 32
    arrival_s: NonNeg = 0.0
    ps: Annotated[int, Field(ge=1)] = 1
    workers: Annotated[int, Field(ge=1)] = 1
    ps_cores: Pos = 0.5
    worker_cores: Pos = 1.0
    max_ps: Annotated[int, Field(ge=1)] = 2
    max_workers: Annotated[int, Field(ge=1)] = 2


class LocalServiceSpec(_Strict):
    id: str
    model: str  # a real-workload model with an inference profile
    slo_p99_ms: Pos
    rates: Annotated[list[NonNeg], Field(min_length=1)]  # requests/s, one per window
    window_s: Pos = 10.0


class LocalPolicies(_Strict):
    training: str = "nearchus"
    harvest: str | None = "reamer"  # None: no inference harvesting
    interval_s: Pos = 3.0
    options: dict[str, dict[str, Any]] = {}  # per-policy settings, by policy name


class LocalScenario(_Strict):
    name: str = "local"
    seed: int = 0
    max_s: Pos = 180.0
    hosts: Annotated[list[HostSpec], Field(min_length=1)]
    jobs: list[LocalJobSpec] = []
    services: list[LocalServiceSpec] = []
    system_reserve_cores: NonNeg = 0.25  # per host, for the controller and the load generator
    policy: LocalPolicies = LocalPolicies()
    source: str = "<inline>"

    @model_validator(mode="after")
    def _check(self) -> LocalScenario:
        from reamer.workloads.real.nets import MODELS

        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique (got {names})")
        for j in self.jobs:
            if j.model not in MODELS:
                raise ValueError(f"job {j.id}: model must be one of {sorted(MODELS)} (got {j.model!r})")
        for s in self.services:
            if s.model not in MODELS:
                raise ValueError(f"service {s.id}: model must be one of {sorted(MODELS)} (got {s.model!r})")
        return self


def parse_local(data: Any, source: str) -> LocalScenario:
    if not isinstance(data, dict):
        raise InputError(source, "(top level)", "a YAML mapping with keys hosts, jobs, services, policy")
    try:
        return LocalScenario.model_validate({**data, "source": source})
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise InputError(source, f"field {where}", err["msg"].lower()) from None


def load_local(path: str | Path | None = None) -> LocalScenario:
    """A local scenario file, or the embedded ``local.yaml``."""
    if path is None:
        return parse_local(yaml.safe_load(resources.files("reamer.data").joinpath("local.yaml").read_text()),
                           "local.yaml")
    p = Path(path)
    return parse_local(read_yaml(p, "an existing local scenario YAML file"), str(p))
