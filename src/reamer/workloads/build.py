"""Turn a scenario into nodes and training jobs (synthetic, openb trace, or a job list).

All randomness comes from the injected ``numpy.random.Generator``: same seed, same jobs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from reamer.config.scenario import JobList, Openb, Scenario, Synthetic
from reamer.domain import Node, Resources, TrainingJob
from reamer.errors import InputError
from reamer.models.training import Calibration, ModelProfile, Side, step
from reamer.models.zoo import ZOO
from reamer.workloads.csvio import integer, number, read_rows

GIB = 1024.0


def build_nodes(sc: Scenario) -> list[Node]:
    c = sc.cluster
    nodes: list[Node] = []
    for pool in c.node_pools:
        for k in range(pool.count):
            nodes.append(Node(f"{pool.name}-{k:04d}", pool.cores, pool.mem_gib * GIB, pool.gpus,
                              pool.gpu_model, pool.nic_gbps or c.nic_gbps, pool.name))
    if c.node_list is not None:
        nodes.extend(read_openb_nodes(c.node_list, c.nic_gbps, c.max_nodes))
    by_name = {n.name: i for i, n in enumerate(nodes)}
    if len(by_name) != len(nodes):
        raise InputError(sc.source, "cluster", "unique node names")
    for o in c.overrides:
        if o.node not in by_name:
            raise InputError(sc.source, "cluster.overrides.node", "the name of a node in the cluster", o.node)
        n = nodes[by_name[o.node]]
        nodes[by_name[o.node]] = Node(
            n.name,
            o.cores if o.cores is not None else n.cores,
            o.mem_gib * GIB if o.mem_gib is not None else n.mem_mib,
            o.gpus if o.gpus is not None else n.gpus,
            n.gpu_model,
            o.nic_gbps if o.nic_gbps is not None else n.nic_gbps,
            n.pool,
        )
    return nodes


def read_openb_nodes(path: Path, nic_gbps: float, limit: int | None = None) -> list[Node]:
    nodes = []
    for i, row in read_rows(path, ["sn", "cpu_milli", "memory_mib", "gpu", "model"]):
        cores = number(path, i, row, "cpu_milli", strict=True) / 1000.0
        mem = number(path, i, row, "memory_mib", strict=True)
        gpus = integer(path, i, row, "gpu")
        model = row["model"].strip()
        pool = f"gpu-{model or 'unknown'}" if gpus else "cpu"
        nodes.append(Node(row["sn"], cores, mem, float(gpus), model, nic_gbps, pool))
    if not nodes:
        raise InputError(str(path), "rows", "at least one node")
    if limit is not None and limit < len(nodes):  # evenly spaced rows keep the cluster's mix
        nodes = [nodes[int(k * len(nodes) / limit)] for k in range(limit)]
    return nodes


def request_speed(model: str, cal: Calibration, batch: int, ps: int, workers: int,
                  ps_res: Resources, worker_res: Resources, nic_gbps: float,
                  models: Mapping[str, ModelProfile] = ZOO) -> float:
    """Samples/s of a job at the user's request, each container on its own full link."""
    prof = models[model]
    w = [Side(worker_res.cpu, nic_gbps, worker_res.gpu)] * workers
    p = [Side(ps_res.cpu, nic_gbps)] * ps
    return step(prof, cal, batch, w, p).speed


def build_jobs(sc: Scenario, nodes: list[Node], cal: Calibration, rng: np.random.Generator,
               models: Mapping[str, ModelProfile] = ZOO) -> list[TrainingJob]:
    """``models``: training models by name (the calibrated profile's merged over the zoo)."""
    wl = sc.workload
    nic = sc.cluster.nic_gbps
    if isinstance(wl, Synthetic):
        _check_models(sc.source, "workload.models", wl.models, models)
        return _synthetic(wl, cal, rng, nic, models)
    if isinstance(wl, Openb):
        _check_models(sc.source, "workload.models", wl.models, models)
        return _openb(wl, nodes, cal, rng, nic, models)
    assert isinstance(wl, JobList)
    return read_joblist(wl.path, cal, nic, models, nodes)


def _check_models(source: str, where: str, names: list[str], models: Mapping[str, ModelProfile] = ZOO) -> None:
    bad = [m for m in names if m not in models]
    if bad or not names:
        raise InputError(source, f"field {where}", f"model names from {', '.join(sorted(models))}", bad or names)


def _synthetic(wl: Synthetic, cal: Calibration, rng: np.random.Generator, nic: float,
               models: Mapping[str, ModelProfile] = ZOO) -> list[TrainingJob]:
    jobs = []
    t = 0.0
    lo, hi = (math.log(x) for x in wl.runtime_s)
    for k in range(wl.jobs):
        t += float(rng.exponential(wl.mean_interarrival_s))
        model = wl.models[int(rng.integers(len(wl.models)))]
        workers = int(rng.integers(wl.workers[0], wl.workers[1] + 1))
        ps = int(rng.integers(wl.ps[0], wl.ps[1] + 1))
        mem = wl.container_mem_gib * GIB
        w_res = Resources(float(rng.choice(wl.worker_cores)), mem, wl.gpus_per_worker)
        p_res = Resources(float(rng.choice(wl.ps_cores)), mem)
        runtime = math.exp(float(rng.uniform(lo, hi)))
        batch = models[model].batch
        speed = request_speed(model, cal, batch, ps, workers, p_res, w_res, nic, models)
        jobs.append(TrainingJob(f"job-{k:05d}", model, t, runtime * speed, ps, workers, p_res, w_res, batch))
    return jobs


def _gpu_nodes(spec: str, nodes: Sequence[Node], memo: dict[str, frozenset[str]], path: Path,
               where: str) -> frozenset[str] | None:
    """The nodes whose GPU model is one of ``spec``'s (models separated by ``|``; empty: None,
    any node); a list naming none of the cluster's models is refused."""
    spec = spec.strip()
    if not spec:
        return None
    if spec not in memo:
        wanted = {m.strip() for m in spec.split("|")} - {""}
        memo[spec] = frozenset(n.name for n in nodes if n.gpu_model in wanted)
        if not memo[spec]:
            have = ", ".join(sorted({n.gpu_model for n in nodes if n.gpu_model})) or "none"
            raise InputError(str(path), where, f"GPU models separated by '|', at least one of this cluster's ({have})",
                             spec)
    return memo[spec]


def _openb(wl: Openb, nodes: list[Node], cal: Calibration, rng: np.random.Generator, nic: float,
           models: Mapping[str, ModelProfile] = ZOO) -> list[TrainingJob]:
    path = wl.pod_list
    pods = []
    pinned: dict[str, frozenset[str]] = {}  # gpu_spec -> the nodes of its GPU models
    for i, row in read_rows(path, ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"]):
        where = f"line {i}" if path.suffix == ".jsonl" else f"row {i}"
        cpu = number(path, i, row, "cpu_milli", strict=True) / 1000.0
        mem = number(path, i, row, "memory_mib")
        ngpu = integer(path, i, row, "num_gpu")
        gmilli = number(path, i, row, "gpu_milli")
        if wl.gpu_only and ngpu == 0:
            continue
        if wl.qos is not None and row.get("qos", "").strip() not in wl.qos:
            continue
        if wl.pod_phases is not None and row.get("pod_phase", "").strip() not in wl.pod_phases:
            continue
        gpu_nodes = _gpu_nodes(row.get("gpu_spec", ""), nodes, pinned, path, f"{where}, field gpu_spec")
        if row.get("deletion_time", "").strip():
            created = number(path, i, row, "creation_time")
            deleted = number(path, i, row, "deletion_time")
            sched = number(path, i, row, "scheduled_time", default=created)
            dur = min(max(deleted - sched, wl.min_duration_s), wl.max_duration_s)
        elif wl.duration_s is not None:
            dur = wl.duration_s
        else:
            raise InputError(str(path), f"{where}, field deletion_time",
                             "a pod's recorded times (creation_time, deletion_time), or workload.duration_s "
                             "for a list without them")
        pods.append((row["name"], cpu, mem, ngpu, gmilli, dur, gpu_nodes))
        if wl.max_jobs is not None and len(pods) >= wl.max_jobs:
            break
    if not pods:
        raise InputError(str(path), "rows", "at least one pod")
    total_gpu = sum(n.gpus for n in nodes)
    if total_gpu > 0:
        demand = np.mean([ng * gm / 1000.0 * d for _, _, _, ng, gm, d, _ in pods])
        capacity = total_gpu
    else:
        demand = np.mean([c * d for _, c, _, _, _, d, _ in pods])
        capacity = sum(n.cores for n in nodes)
    mean_gap = demand / (wl.load * capacity) if demand > 0 else 1.0
    speeds: dict[tuple, float] = {}
    jobs = []
    t = 0.0
    for name, cpu, mem, ngpu, gmilli, dur, gpu_nodes in pods:
        t += float(rng.exponential(mean_gap))
        workers = max(1, ngpu)
        gpu_each = (ngpu * gmilli / 1000.0) / workers
        w_res = Resources(cpu / workers, mem / workers, gpu_each)
        p_res = Resources(wl.ps_cores, wl.ps_mem_gib * GIB)
        model = wl.models[int(rng.integers(len(wl.models)))]
        batch = models[model].batch
        key = (model, workers, w_res)
        if key not in speeds:
            speeds[key] = request_speed(model, cal, batch, 1, workers, p_res, w_res, nic, models)
        jobs.append(TrainingJob(name, model, t, dur * speeds[key], 1, workers, p_res, w_res, batch,
                                max_workers=max(16, workers), worker_nodes=gpu_nodes))
    return jobs


JOBLIST_COLUMNS = ["id", "model", "arrival_s", "ps", "workers", "ps_cpu", "worker_cpu"]
JOBLIST_OPTIONAL = ["ps_mem_mib", "worker_mem_mib", "worker_gpu", "gpu_models", "batch", "samples", "duration_s"]


def read_joblist(path: Path, cal: Calibration, nic: float, models: Mapping[str, ModelProfile] = ZOO,
                 nodes: Sequence[Node] = ()) -> list[TrainingJob]:
    """Generic job list (CSV or JSONL); see docs/scenarios.md for the columns. ``nodes``: the
    cluster's, which ``gpu_models`` selects from."""
    jobs = []
    pinned: dict[str, frozenset[str]] = {}  # gpu_models -> the nodes of those GPU models
    seen: set[str] = set()
    speeds: dict[tuple, float] = {}
    known = set(JOBLIST_COLUMNS + JOBLIST_OPTIONAL)
    for i, row in read_rows(path, JOBLIST_COLUMNS):
        where = f"line {i}" if path.suffix == ".jsonl" else f"row {i}"
        # a misspelt optional column would silently take its default (an unnamed, empty one is a
        # spreadsheet's trailing comma)
        unknown = {k for k in row.keys() - known if k or row[k].strip()}
        if unknown:
            raise InputError(str(path), where if path.suffix == ".jsonl" else "header",
                             f"columns among {', '.join(JOBLIST_COLUMNS + JOBLIST_OPTIONAL)}",
                             ", ".join(sorted(k or "(a column without a name)" for k in unknown)))
        jid = row["id"].strip()
        if not jid or jid in seen:
            raise InputError(str(path), f"{where}, field id", "a unique, non-empty job id", jid)
        seen.add(jid)
        model = row["model"].strip()
        if model not in models:
            raise InputError(str(path), f"{where}, field model", f"one of {', '.join(sorted(models))}", model)
        arrival = number(path, i, row, "arrival_s")
        ps = integer(path, i, row, "ps", minimum=1)
        workers = integer(path, i, row, "workers", minimum=1)
        p_res = Resources(number(path, i, row, "ps_cpu", strict=True),
                          number(path, i, row, "ps_mem_mib", default=2048.0))
        w_res = Resources(number(path, i, row, "worker_cpu", strict=True),
                          number(path, i, row, "worker_mem_mib", default=4096.0),
                          number(path, i, row, "worker_gpu", default=0.0))
        batch = integer(path, i, row, "batch", minimum=1, default=models[model].batch)
        if row.get("samples", "").strip():
            samples = number(path, i, row, "samples", strict=True)
        elif row.get("duration_s", "").strip():
            dur = number(path, i, row, "duration_s", strict=True)
            key = (model, batch, ps, workers, p_res, w_res)  # a trace repeats few requests
            if key not in speeds:
                speeds[key] = request_speed(model, cal, batch, ps, workers, p_res, w_res, nic, models)
            samples = dur * speeds[key]
        else:
            raise InputError(str(path), f"{where}, field samples", "samples or duration_s (a number > 0)")
        gpu_nodes = _gpu_nodes(row.get("gpu_models", ""), nodes, pinned, path, f"{where}, field gpu_models")
        jobs.append(TrainingJob(jid, model, arrival, samples, ps, workers, p_res, w_res, batch,
                                max_ps=max(8, ps), max_workers=max(16, workers), worker_nodes=gpu_nodes))
    if not jobs:
        raise InputError(str(path), "rows", "at least one job")
    jobs.sort(key=lambda j: j.arrival_s)
    return jobs
