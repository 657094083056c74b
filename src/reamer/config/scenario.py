"""Scenario file (YAML): cluster, workload, policy options, seed, horizon.

Validated with pydantic; every error becomes one line naming the file, the field and
what was expected (:class:`reamer.errors.InputError`). Relative paths in a scenario are
resolved against the scenario file's folder.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, model_validator

from reamer.config.base import NonNeg, PolicySection, Pos, Strict, read_yaml, validate
from reamer.errors import InputError


class NodePool(Strict):
    """``count`` identical nodes."""

    name: str  # pool name; nodes are named after it
    count: Annotated[int, Field(ge=1)]  # nodes in the pool
    cores: Pos  # CPU cores per node
    mem_gib: Pos  # memory per node (GiB)
    gpus: NonNeg = 0  # GPUs per node
    gpu_model: str = ""  # GPU model label (informational)
    nic_gbps: Pos | None = None  # default: cluster.nic_gbps


class NodeOverride(Strict):
    """Per-node override of any pool default, by node name."""

    node: str  # the node's name
    cores: Pos | None = None  # None = the pool's value
    mem_gib: Pos | None = None  # None = the pool's value
    gpus: NonNeg | None = None  # None = the pool's value
    nic_gbps: Pos | None = None  # None = the pool's value


class Cluster(Strict):
    node_pools: list[NodePool] = []  # groups of identical nodes (with or instead of node_list)
    node_list: Path | None = None  # openb node list CSV (sn, cpu_milli, memory_mib, gpu, model)
    max_nodes: Annotated[int, Field(ge=1)] | None = None  # evenly spaced subset of node_list
    nic_gbps: Pos = 10.0  # NIC bandwidth of every node without its own; assumption: openb lists no NICs; 10 GbE default
    overrides: list[NodeOverride] = []  # per-node changes to the pool values
    # A job pauses this long when its PS/worker set changes (checkpoint + restart of PS
    # training); resizing a container's CPU is live. An assumption for the zoo's large models
    # (the local backend measures 3.2-8.5 s for its 78k-parameter job, docs/results.md).
    restart_s: NonNeg = 30.0

    @model_validator(mode="after")
    def _some_nodes(self) -> Cluster:
        if not self.node_pools and self.node_list is None:
            raise ValueError("a cluster needs node_pools or node_list")
        return self


Count = Annotated[int, Field(ge=1)]


class Synthetic(Strict):
    """Generated jobs (see docs/scenarios.md for the distributions)."""

    kind: Literal["synthetic"] = "synthetic"
    jobs: Annotated[int, Field(ge=1)] = 200  # number of jobs generated
    mean_interarrival_s: Pos = 120.0  # Poisson arrivals
    models: list[str] = ["resnet50", "vgg16", "inception_v3", "mobilenet_v2", "densenet121",
                         "nasnet_mobile", "bert_base", "vit_b16", "bilstm"]  # zoo models, uniform choice
    workers: tuple[Count, Count] = (1, 4)  # uniform integer range, inclusive
    ps: tuple[Count, Count] = (1, 2)  # uniform integer range, inclusive
    worker_cores: list[Pos] = [1.0, 2.0, 4.0]  # uniform choice
    ps_cores: list[Pos] = [1.0, 2.0]  # uniform choice
    container_mem_gib: Pos = 4.0  # memory of each PS / worker container
    gpus_per_worker: NonNeg = 0.0  # GPU share per worker (0 = CPU training)
    runtime_s: tuple[Pos, Pos] = (600.0, 7200.0)  # log-uniform runtime at the user's request

    @model_validator(mode="after")
    def _ranges(self) -> Synthetic:
        for name in ("workers", "ps", "runtime_s"):
            low, high = getattr(self, name)
            if low > high:
                raise ValueError(f"ranges [low, high] of workers, ps and runtime_s with low <= high "
                                 f"(got {name} [{low}, {high}])")
        return self


class Openb(Strict):
    """The Alibaba openb pod list turned into arrivals (see docs/scenarios.md)."""

    kind: Literal["openb"] = "openb"
    pod_list: Path  # openb pod list CSV
    load: Pos = 0.8  # offered GPU load relative to the cluster's GPUs (sets the arrival rate)
    max_jobs: Annotated[int, Field(ge=1)] | None = None  # only the first this many pods
    gpu_only: bool = False  # skip pods that request no GPU
    ps_cores: Pos = 1.0  # openb pods show no PS: each job gets one of this size
    ps_mem_gib: Pos = 2.0  # memory of that PS
    max_duration_s: Pos = 7 * 86400.0  # pod durations are clipped to [min_duration_s, max_duration_s]
    min_duration_s: Pos = 60.0  # lower clip of pod durations
    duration_s: Pos | None = None  # the duration of pods without recorded times (a packing-only list)
    qos: list[str] | None = None  # keep only pods of these QoS classes (None: all)
    pod_phases: list[str] | None = None  # keep only pods that ended in these phases (None: all)
    models: list[str] = ["resnet50", "vgg16", "inception_v3", "mobilenet_v2", "densenet121",
                         "bert_base", "vit_b16", "gpt2_small"]  # zoo models assigned to pods (seeded choice)

    @model_validator(mode="after")
    def _clip(self) -> Openb:
        if self.min_duration_s > self.max_duration_s:
            raise ValueError(f"min_duration_s <= max_duration_s (got {self.min_duration_s} > {self.max_duration_s})")
        return self


class JobList(Strict):
    """A user's own trace: CSV or JSONL, one job per row (docs/scenarios.md)."""

    kind: Literal["joblist"] = "joblist"
    path: Path  # the CSV or JSONL file


Workload = Annotated[Synthetic | Openb | JobList, Field(discriminator="kind")]


class DiurnalRate(Strict):
    """A seeded day/night curve (:func:`reamer.workloads.rates.diurnal_rates`)."""

    kind: Literal["diurnal"] = "diurnal"
    trough_frac: Annotated[float, Field(ge=0, le=1)] = 0.3  # trough rate = peak × this
    peak_hour: Annotated[float, Field(ge=0, lt=24)] = 14.0  # hour of day of the peak rate
    start_hour: Annotated[float, Field(ge=0, lt=24)] = 8.0  # hour of day at t = 0
    noise: NonNeg = 0.05  # std-dev of the multiplicative noise per window


class GenaiRate(Strict):
    """The Alibaba GenAI request-rate trace, scaled to the service's peak."""

    kind: Literal["genai"] = "genai"
    path: Path  # the trace's qps CSV (timestamp_anon, value, container_ip, request_type)
    request_type: str | None = None  # only rows of this request type; None = all


RateSource = Annotated[DiurnalRate | GenaiRate, Field(discriminator="kind")]


class ServiceSpec(Strict):
    """One latency-SLO inference service."""

    id: str  # unique service id
    model: str  # a model of the profile's inference section (reamer/data/profiles.json)
    slo_p99_ms: Pos  # latency SLO: p99 per judging window (ms)
    peak_rate_per_s: Pos  # the rate curve's peak (requests/s)
    rate: RateSource = DiurnalRate()  # shape of the request rate over time
    mem_mib_per_replica: Pos = 2048.0  # memory each replica needs


class DedicatedPool(Strict):
    """CPU-only nodes that serve inference when it is not harvested (they cost node-hours)."""

    name: str = "inference"  # pool name
    count: Annotated[int, Field(ge=0)] = 16  # nodes available to the pool
    cores: Pos = 32.0  # CPU cores per pool node
    mem_gib: Pos = 128.0  # memory per pool node


class InferenceSection(Strict):
    """Inference services co-located on GPU training nodes; harvest round every ``interval_s``."""

    services: Annotated[list[ServiceSpec], Field(min_length=1)]  # the inference services
    pool: DedicatedPool = DedicatedPool()  # overflow capacity when slack is short
    interval_s: Pos = 60.0  # harvest round and SLO judging window
    system_reserve_cores: NonNeg = 2.0  # per training node
    # Where the training need for slack comes from: ``usage`` = Σ measured use of the training
    # containers on the node; ``limits`` = their CPU limits. Either way the policy also sees the
    # limits (``NodeUsage.training_limit``): training can never take back more than them.
    training_need: Literal["usage", "limits"] = "usage"
    need_percentile: Annotated[float, Field(gt=0, le=100)] = 95.0  # ``usage``: this percentile of ...
    need_window_s: Pos = 1800.0  # ... the per-window measured use over this long, of the containers there now
    # Time-varying training need: each GPU job's input-pipeline cost per sample is multiplied by
    # a mean-one log-normal AR(1) factor redrawn every window (stationary std-dev
    # ``need_variation``, correlation ``need_corr``); 0 = constant (the zoo's cost); ``pai2020``:
    # each job its own log-sd and correlation, drawn from those fitted to Alibaba PAI's
    # mini-batch times (reamer.workloads.need).
    need_variation: NonNeg | Literal["pai2020"] = 0.0
    need_corr: Annotated[float, Field(ge=0, lt=1)] = 0.9  # window-to-window correlation of that factor
    # The level of training's need: every model's input-pipeline cost per sample × this;
    # ``pai2020``: the scale at which 15.51 % of the run's GPU jobs need more CPU than they
    # request (Alibaba PAI's share of tasks, cluster-trace-gpu-v2020; reamer.workloads.need).
    need_scale: Pos | Literal["pai2020"] = 1.0
    # The training pods' CPU QoS. ``guaranteed``: a container's CPU limit is its request.
    # ``burstable``: no limit (cpu.shares = the request): a GPU worker whose input pipeline is
    # short of CPU at its request runs on the cores its node leaves idle, up to what keeps its
    # GPU fed, so co-located inference takes from training what it holds of them (the
    # harvester's cap at the training limits is then off: training can take more).
    training_qos: Literal["guaranteed", "burstable"] = "guaranteed"
    # ``joint``: each SLO window's round, and each round between windows in which training is
    # about to take cores a replica holds, is the joint loop (training decides, inference moves
    # first, training then takes its cores; the harvester caps training's need by its CPU
    # limits). ``none``: the two loops run on their own, each on the state it measured (the
    # harvest round, then training's: the harvester learns of a growth at its next window), and
    # the harvester sees training only through its measured use (no limits).
    coordination: Literal["joint", "none"] = "joint"
    # Interference coefficients: training slowdown per co-located inference core busy (share of
    # node cores), and inference latency inflation per unit of training CPU load (share of node
    # cores). Unset: the profile's (``reamer calibrate``'s interference part; 0 in the shipped one).
    training_interference: NonNeg = 0.0
    inference_interference: NonNeg = 0.0  # inference latency inflation per training CPU load share

    @model_validator(mode="after")
    def _unique_ids(self) -> InferenceSection:
        ids = [s.id for s in self.services]
        if len(set(ids)) != len(ids):
            raise ValueError(f"inference service ids must be unique (got {ids})")
        return self


class Scenario(Strict):
    name: str = "scenario"  # shown in outputs
    seed: Annotated[int, Field(ge=0)] = 0  # seeds the workload, noise and rates (overridden by --seed)
    horizon_s: Pos | None = None  # stop at this simulated time; None = when every job is done (inference rates: 1 day)
    cluster: Cluster  # the nodes
    workload: Workload = Synthetic()  # the training jobs
    policy: PolicySection = PolicySection()  # which policies run, with their options
    inference: InferenceSection | None = None  # None = training only (no harvesting)
    source: str = "<inline>"  # where it was read from (for error messages)


def parse_scenario(data: Any, source: str, base: Path | None = None) -> Scenario:
    if not isinstance(data, dict):
        raise InputError(source, "(top level)", "a YAML mapping with keys cluster, workload, ...")
    sc = validate(Scenario, {**data, "source": source}, source)
    if base is not None:
        sc = _resolve_paths(sc, base)
    return sc


def _resolve_paths(sc: Scenario, base: Path) -> Scenario:
    def fix(p: Path | None) -> Path | None:
        return p if p is None or p.is_absolute() else (base / p)

    cluster = sc.cluster.model_copy(update={"node_list": fix(sc.cluster.node_list)})
    wl = sc.workload
    if isinstance(wl, Openb):
        wl = wl.model_copy(update={"pod_list": fix(wl.pod_list)})
    elif isinstance(wl, JobList):
        wl = wl.model_copy(update={"path": fix(wl.path)})
    inf = sc.inference
    if inf is not None:
        svcs = [s.model_copy(update={"rate": s.rate.model_copy(update={"path": fix(s.rate.path)})})
                if isinstance(s.rate, GenaiRate) else s for s in inf.services]
        inf = inf.model_copy(update={"services": svcs})
    return sc.model_copy(update={"cluster": cluster, "workload": wl, "inference": inf})


def load_embedded(name: str) -> Scenario:
    """A scenario shipped inside the package (``default``, ``colocation``)."""
    text = resources.files("reamer.data").joinpath(f"{name}.yaml").read_text()
    return parse_scenario(yaml.safe_load(text), f"{name}.yaml")


def load_scenario(path: str | Path | None) -> Scenario:
    """Load a scenario file, or the embedded default when ``path`` is None."""
    if path is None:
        return load_embedded("default")
    p = Path(path)
    return parse_scenario(read_yaml(p, "an existing scenario YAML file"), str(p), p.parent)
