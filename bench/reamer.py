"""Cloud Reamer in the simulator: inference on the spare CPU of GPU training nodes.

    python bench/reamer.py --json bench-reamer.json [--quick] [--seeds 1 2 3] [--workers N]
        [--packings 70 85 95] [--loads 0.25 0.5] [--set SECTION.KEY=VALUE ...]

Cluster: an evenly spaced subset of the openb GPU nodes (``../shared/data``). Training: GPU
pods of the openb pod list, in a seeded random order, taken until their GPU requests reach
``packing_pct`` of the cluster's GPUs, all submitted at t = 0 and placed by ``static``
(kube-scheduler, bin-packing). Each pod lives its openb lifetime (deletion − creation; median
9 min, p90 1.7 h) and ends at it whatever its speed (``TrainingJob.duration_s``: a pod slowed by
a shared NIC or by CPU contention does less work, not longer — its slowdown is counted by
``training_slowdown_pct``); when it ends the next pod of the order with the same GPU shape
arrives, so GPU packing stays at the target (the realised ``gpu_alloc_pct`` is reported) while
the CPU requested and used on each node changes (new pods land on nodes whose spare CPU
inference may hold). An openb pod's shape is fixed: one PS,
its GPUs as workers; NEARCHUS may resize its CPU, not add workers or PS. An openb pod is one
pod (``TrainingJob.one_node``): its PS and workers are placed on one node, and their gradient
traffic stays in the host, off the NIC; the simulator runs in-host traffic at the node's link
rate, so GPU nodes get a ``--nic-gbps`` of 100 by default (a lower bound of in-host
bandwidth; DGX-1-class servers carry 4 × 100 Gb/s on their NICs alone). Inference: five services (ResNet-50,
MobileNet-v2, BERT-base, VGG-16, DeepSpeech2-style) on seeded diurnal rates whose peak needs,
as sized by the policies, ``peak_load`` × the GPU-node cores left unrequested at 70 % packing
(the same seed), split evenly. A dedicated CPU pool takes what is not harvested. Training's
CPU need is data-driven (docs/design.md#trainings-cpu-need): its level ``--need-scale``
(default ``pai2020``: every model's input cost scaled so that 15.51 % of the GPU jobs need more
CPU than they request, Alibaba PAI's share) and its variation ``--need-variation`` (default
``pai2020``: each job its own log-normal AR(1), fitted to PAI's mini-batch times), redrawn
each minute, so policies face a need that moves between their measurements. Every run is
made under each training CPU QoS of ``--training-qos`` (default both, side by side):
``guaranteed`` (limit = request: a GPU worker whose input pipeline needs more is input-bound
until a policy gives it more) and ``burstable`` (cpu.shares = the request, no limit: it runs on
its node's idle cores — the cores a harvester that counts requests takes). CPU contention on a
node is split by cpu.shares (:func:`reamer.backends.sim.inference.cfs_split`): both training
and inference can slow.

Policies (training + harvesting): ``dedicated``, ``naive``, ``usage-reclaim`` and
``static+reamer`` on ``static`` training; ``nearchus+reamer`` (the joint loop: NEARCHUS
allocates training's CPU and inference moves first; Reamer's slack uses the measured need —
p95 use — capped by NEARCHUS's limits) and ``nearchus+reamer-uncoordinated`` (the two loops
on their own, the harvester seeing training only through its measured use). NEARCHUS runs
with ``trim_ps: false`` here: on these GPU pods a PS trim slowed its job by more than 1 % in
70–79 % of the trims (median −4 to −6 %; 317 and 377 trims in the guaranteed runs at seed 1,
85 % packing, load 0.5 and seed 3, 95 %, load 0.25) — the PS update is on the step's
critical path — and the cores it frees only feed inference; on the CPU-bound embedded
default the trims free cores that other jobs start and grow on (without them mean JCT is
9–33 % higher, seeds 1–3), so the policy's default keeps them. Metrics per run:
the co-location keys of :mod:`reamer.backends.sim.inference`, the realised ``gpu_alloc_pct``,
``training_samples`` (trained within the horizon by every job: a job still running at its
end counts what it trained until then), ``training_samples_finished`` (by the jobs that ended
within it), ``training_speedup_vs_static_ratio`` (``training_samples`` ÷
``static+reamer``'s, same seed, packing and load) and, on ``nearchus+reamer`` runs,
``harvested_vs_uncoordinated_ratio`` (harvested core-hours ÷ ``nearchus+reamer-uncoordinated``'s).
Ratios: per policy, min and max over all runs of SLO attainment, training slowdown, harvested
share and the two ratios, and the two ratios pooled (Σ over all runs ÷ Σ over the paired runs).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress

# this file is named like the package: keep its own folder off the import path for ``reamer``
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.modules.pop("reamer", None) if getattr(sys.modules.get("reamer"), "__file__", "") == __file__ else None

from reamer.errors import InputError  # noqa: E402
from reamer.runtime import simulate  # noqa: E402
from reamer.runtime.policies import harvest_policy, training_policy  # noqa: E402
from reamer.config.scenario import Scenario, parse_scenario  # noqa: E402
from reamer.domain import Resources, TrainingJob  # noqa: E402
from reamer.models.inference import law_cache, share_results, size_service  # noqa: E402
from reamer.models.profiles import shipped_profiles  # noqa: E402
from reamer.models.zoo import ZOO  # noqa: E402
from reamer.policies.harvest import ReamerConfig  # noqa: E402
from reamer.reports.results import document, run_entry, write_json  # noqa: E402
from reamer.workloads.build import request_speed  # noqa: E402

sys.path.append(str(_HERE))
from _common import OPENB_NODES, OPENB_PODS, write_results_section  # noqa: E402

GIB = 1024.0
QOS = ("guaranteed", "burstable")  # training pods' CPU QoS (inference.training_qos)
SERVICES = [  # id, model, p99 SLO (ms)
    ("resnet50", "resnet50", 150.0),
    ("mobilenet", "mobilenet_v2", 50.0),
    ("bert", "bert_base", 600.0),
    ("vgg16", "vgg16", 800.0),
    ("speech", "deepspeech2", 1500.0),
]
POLICIES = {  # run name -> (training policy, harvesting policy, coordination of the two loops)
    "dedicated": ("static", "dedicated", "joint"),
    "naive": ("static", "naive", "joint"),
    "usage-reclaim": ("static", "usage-reclaim", "joint"),
    "static+reamer": ("static", "reamer", "joint"),
    "nearchus+reamer-uncoordinated": ("nearchus", "reamer", "none"),
    "nearchus+reamer": ("nearchus", "reamer", "joint"),
}
BASELINE = "static+reamer"  # training_speedup_vs_static_ratio: samples trained ÷ this run's (same seed, packing, load)
TRAIN_MODELS = ["resnet50", "vgg16", "inception_v3", "mobilenet_v2", "densenet121", "bert_base", "vit_b16"]
KEYS = ["slo_attainment_pct", "requests_within_slo_pct", "training_slowdown_pct", "harvested_share_pct",
        "harvested_core_hours", "dedicated_node_hours", "migrations", "evictions", "gpu_node_cpu_util_pct",
        "gpu_alloc_pct", "over_slack_core_hours", "pool_core_hours", "harvestable_share_pct"]
RESERVE = 2.0


def gpu_nodes(n: int, folder: Path) -> tuple[Path, float, float]:
    """Write an evenly spaced subset of ``n`` openb GPU nodes; return (csv, GPUs, cores)."""
    with OPENB_NODES.open() as f:
        rows = [r for r in csv.DictReader(f) if float(r["gpu"] or 0) > 0]
    rows = [rows[int(k * len(rows) / n)] for k in range(min(n, len(rows)))]
    out = folder / "gpu_nodes.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out, sum(float(r["gpu"]) for r in rows), sum(float(r["cpu_milli"]) / 1000 for r in rows)


@functools.cache
def gpu_pods() -> tuple[tuple[str, float, float, int, float, float], ...]:
    """(name, cores, MiB, GPUs, GPU milli, lifetime s) of every openb GPU pod (read once per
    process)."""
    with OPENB_PODS.open() as f:
        return tuple((r["name"], float(r["cpu_milli"]) / 1000, float(r["memory_mib"]), int(r["num_gpu"]),
                      float(r["gpu_milli"]), max(60.0, float(r["deletion_time"]) - float(r["creation_time"])))
                     for r in csv.DictReader(f) if int(r["num_gpu"] or 0) > 0)


def pick(pods, order: np.ndarray, gpus: float, packing: float) -> list:
    out, total = [], 0.0
    for i in order:
        p = pods[i]
        g = p[3] * p[4] / 1000.0
        if total + g > packing * gpus + 1e-9:
            continue  # skip pods that would overshoot the target
        out.append(p)
        total += g
        if total >= packing * gpus - 0.05:
            break
    return out


def churn(pods, order: np.ndarray, first: list, horizon_s: float) -> list[tuple[float, tuple]]:
    """(arrival s, pod) of the packed pods at t = 0 and of their successors: each pod lives its
    openb lifetime (deletion − creation); when it ends, the next pod of the seeded order with the
    same GPU shape arrives, so GPU packing stays at the target while CPU requests change."""
    by_shape: dict[tuple[int, float], list[int]] = {}
    for i in order:
        by_shape.setdefault((pods[i][3], pods[i][4]), []).append(int(i))
    used = {p[0] for p in first}
    nxt = {k: 0 for k in by_shape}
    out, slots = [], [(0.0, p) for p in first]
    while slots:
        t, p = slots.pop()
        out.append((t, p))
        end = t + p[5]
        if end >= horizon_s:
            continue
        key, cand = (p[3], p[4]), by_shape[(p[3], p[4])]
        k = nxt[key]
        while k < len(cand) and pods[cand[k]][0] in used:
            k += 1
        nxt[key] = k + 1
        q = pods[cand[k % len(cand)]]
        used.add(q[0])
        slots.append((end, q))
    return sorted(out, key=lambda x: (x[0], x[1][0]))


def jobs_of(arrivals, rng: np.random.Generator, nic_gbps: float) -> list[TrainingJob]:
    """Training jobs of the pods: an openb pod's shape is fixed (its GPUs, one PS), so NEARCHUS
    may resize its CPU but not add GPU workers or PS the pod did not have. Each runs for its
    openb lifetime (``duration_s``); ``samples`` is the work it would do then at its request speed."""
    cal = shipped_profiles().calibration
    jobs, seen = [], {}
    for t, (name, cpu, mem, ngpu, gmilli, life) in arrivals:
        workers = max(1, ngpu)
        w_res = Resources(cpu / workers, mem / workers, gmilli / 1000.0)
        p_res = Resources(1.0, 2.0 * GIB)
        model = TRAIN_MODELS[int(rng.integers(len(TRAIN_MODELS)))]
        speed = request_speed(model, cal, ZOO[model].batch, 1, workers, p_res, w_res, nic_gbps)
        seen[name] = seen.get(name, 0) + 1
        jid = name if seen[name] == 1 else f"{name}.{seen[name]}"
        jobs.append(TrainingJob(jid, model, t, speed * life, 1, workers, p_res, w_res,
                                ZOO[model].batch, max_ps=1, max_workers=workers, duration_s=life, one_node=True))
    return jobs


@functools.cache
def peak_rate(model: str, slo_ms: float, cores: float) -> float:
    """Rate whose sizing (as the policies size: headroom, quantile) needs about ``cores`` cores
    (the runs of one seed and load share it: found once per process)."""
    cfg = ReamerConfig()
    prof = dict(shipped_profiles().inference)[model]

    def need(rate: float) -> float:
        sz = size_service(rate, slo_ms / 1e3, prof, cfg.core_options, cfg.batch_options, cfg.wait_options,
                          headroom=cfg.headroom, quantile=cfg.quantile)
        return math.inf if sz is None else sz.total_cores

    lo, hi = 0.0, 1.0
    while need(hi) < cores:
        hi *= 2
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if need(mid) <= cores else (lo, mid)
    return lo


def scenario(seed: int, nodes_csv: Path, horizon_s: float, peak_cores: float, coordination: str,
             variation: float | str, scale: float | str, nic_gbps: float, qos: str,
             overrides: tuple[tuple[str, str, object], ...] = ()) -> Scenario:
    """The run's scenario; ``overrides`` (``--set``): (section, key, value), section ``inference``
    or a policy's name (its options)."""
    per = peak_cores / len(SERVICES)
    services = [{"id": sid, "model": m, "slo_p99_ms": slo, "peak_rate_per_s": max(0.01, peak_rate(m, slo, per)),
                 "rate": {"kind": "diurnal", "start_hour": 14.0 - horizon_s / 7200.0}} for sid, m, slo in SERVICES]
    pool_count = int(math.ceil(peak_cores * 1.6 / 30.0)) + 2
    options: dict[str, dict] = {"static": {"placement": "pack"}, "nearchus": {"placement": "pack", "trim_ps": False}}
    inference = {"services": services, "pool": {"count": pool_count, "cores": 32}, "system_reserve_cores": RESERVE,
                 "coordination": coordination, "need_variation": variation, "need_scale": scale, "training_qos": qos}
    for section, key, value in overrides:
        (inference if section == "inference" else options.setdefault(section, {}))[key] = value
    return parse_scenario({
        "name": "openb-gpu", "seed": seed, "horizon_s": horizon_s,
        "cluster": {"node_list": str(nodes_csv), "nic_gbps": nic_gbps},
        "workload": {"kind": "synthetic", "jobs": 1},  # replaced by the packed pods
        # NEARCHUS without PS trims on GPU pods (module docstring): their PS update is on the step's critical path
        "policy": {"options": options},
        "inference": inference,
    }, "bench/reamer.py --set" if overrides else "bench/reamer.py")


def one(args) -> dict:
    seed, packing, load, name, nodes_csv, horizon_s, peak_cores, variation, scale, nic, qos, overrides = args
    training, harvest, coordination = POLICIES[name]
    sc = scenario(seed, Path(nodes_csv), horizon_s, peak_cores, coordination, variation, scale, nic, qos, overrides)
    pods = gpu_pods()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pods))
    _, gpus, _ = _NODES
    jobs = jobs_of(churn(pods, order, pick(pods, order, gpus, packing / 100.0), horizon_s), rng, nic)
    r = simulate(sc, training, jobs=jobs, harvest=harvest)
    m = {k: r.metrics[k] for k in KEYS}
    m["wall_s"] = r.metrics["wall_s"]
    m["training_jobs"] = float(len(jobs))
    m["training_samples"] = r.samples_trained  # by every job within the horizon, finished or not
    m["training_samples_finished"] = sum(j.samples for j in r.jobs)  # by the jobs that ended within it
    params = {"packing_pct": packing, "peak_load": load, "need_variation": variation, "need_scale": scale,
              "nic_gbps": nic, "training_qos": qos}
    if overrides:
        params["set"] = " ".join(f"{sec}.{key}={json.dumps(v)}" for sec, key, v in overrides)
    return run_entry(sc.name, seed, name, m, params)


_NODES: tuple[Path, float, float] = (Path(), 0.0, 0.0)


# A worker's latency-law cache. At the default 256 MiB, 1,480 of the 7,977 laws seed 3's 108
# runs compute are recomputed after eviction; at 1 GiB, 162.
LAW_CACHE_BYTES = 2**30


def _init(nodes, results: Path | None = None) -> None:
    """A worker's set-up: the GPU nodes, the file through which the workers share their
    latency-model results (each would otherwise compute the same capacities and laws), and
    its law cache."""
    global _NODES
    _NODES = nodes
    share_results(results)
    law_cache(LAW_CACHE_BYTES)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--quick", action="store_true", help="12 nodes, 6 h, two seeds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--loads", type=float, nargs="+", default=[0.25, 0.5],
                    help="peak loads (× unrequested GPU-node cores at 70%% packing)")
    ap.add_argument("--packings", type=int, nargs="+", default=[70, 85, 95], help="GPU packing %% of the clusters")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a key of the scenario's inference section (inference.need_percentile=75) or a "
                         "policy's option (reamer.stable_s=60); VALUE is JSON; repeatable; implies --no-docs")
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite the Cloud Reamer table in docs/results.md")
    ap.add_argument("--need-variation", type=_number_or_pai, default="pai2020",
                    help="each job's per-window input-pipeline cost drift: a log-sd for every job, or pai2020 "
                         "(each job its own, fitted to PAI's mini-batch times)")
    ap.add_argument("--need-scale", type=_number_or_pai, default="pai2020",
                    help="every model's input cost × this, or pai2020 (calibrated so that 15.51%% of the GPU jobs "
                         "need more CPU than they request, PAI's share)")
    ap.add_argument("--nic-gbps", type=float, default=100.0,
                    help="GPU-node link rate (openb pods are single pods: their gradient traffic stays in the "
                         "host, at this rate; 100 Gb/s is a lower bound for that, DGX-1-class servers carry "
                         "4 x 100 Gb/s on their NICs alone)")
    ap.add_argument("--training-qos", choices=QOS, nargs="+", default=list(QOS),
                    help="training pods' CPU QoS, each run under every one given: guaranteed (limit = request) and "
                         "burstable (no CPU limit: an input-bound GPU worker runs on its node's idle cores)")
    a = ap.parse_args()
    overrides = tuple(_override(ap, x) for x in a.overrides)
    if not all(0 < p <= 100 for p in a.packings):
        ap.error(f"--packings {' '.join(map(str, a.packings))}: expected GPU packing percentages in (0, 100]")
    if not all(x > 0 for x in a.loads):
        ap.error(f"--loads {' '.join(map(str, a.loads))}: expected peak loads > 0")
    if not (OPENB_NODES.is_file() and OPENB_PODS.is_file()):
        print(f"needs the openb data in {OPENB_NODES.parent}", file=sys.stderr)
        return 2
    seeds = a.seeds or ([1, 2] if a.quick else [1, 2, 3])
    n_nodes, horizon = (12, 6 * 3600.0) if a.quick else (24, 12 * 3600.0)
    tmp_dir = tempfile.TemporaryDirectory(prefix="bench-reamer-")  # removed after the runs (or at exit)
    tmp = Path(tmp_dir.name)
    nodes = gpu_nodes(n_nodes, tmp)
    _init(nodes)
    if overrides:  # every override checked before any run: one line naming the bad one
        trainers, harvesters = {t for t, _, _ in POLICIES.values()}, {h for _, h, _ in POLICIES.values()}
        src = "bench/reamer.py --set"
        try:
            sc = scenario(1, nodes[0], horizon, 1.0, "joint", a.need_variation, a.need_scale, a.nic_gbps,
                          a.training_qos[0], overrides)
            for section in sorted({sec for sec, _, _ in overrides} - {"inference"}):
                if section in trainers:
                    training_policy(sc.policy, src, section)
                elif section in harvesters:
                    harvest_policy(sc.policy, src, shipped_profiles().inference, 60.0, section)
                else:
                    ap.error(f"--set {section}.…: expected a section among inference, "
                             f"{', '.join(sorted(trainers | harvesters))}")
        except InputError as e:
            ap.error(str(e).splitlines()[0])
    pods = gpu_pods()
    tasks = []
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(len(pods))
        ref = pick(pods, order, nodes[1], 0.70)
        unrequested = nodes[2] - sum(p[1] for p in ref)
        for qos in a.training_qos:
            for packing in a.packings:
                for load in a.loads:
                    for name in a.policies:
                        tasks.append((seed, packing, load, name, str(nodes[0]), horizon, load * unrequested,
                                      a.need_variation, a.need_scale, a.nic_gbps, qos, overrides))
    t0 = time.perf_counter()
    # the highest loads (the longest runs) first, so the workers end on short ones together;
    # the runs are reported in the order above
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i][2])
    done: dict[int, dict] = {}
    with ProcessPoolExecutor(a.workers, initializer=_init, initargs=(nodes, tmp / "latency-results")) as ex:
        results = ex.map(one, [tasks[i] for i in order])  # every run submitted: the workers start before the bar's thread
        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("simulating", total=len(tasks))
            for i, r in zip(order, results):
                done[i] = r
                bar.advance(task)
    runs = [done[i] for i in range(len(tasks))]
    tmp_dir.cleanup()
    speedups(runs)
    ratios: dict[str, float] = {}
    for qos in a.training_qos:
        same_qos = [r for r in runs if r["params"]["training_qos"] == qos]
        for name in a.policies:
            mine = [r["metrics"] for r in same_qos if r["policy"] == name]
            # snake_case keys; guaranteed's without the QoS (as before it was a parameter)
            key = name.replace("+", "_").replace("-", "_") + ("" if qos == "guaranteed" else f"_{qos}")
            for k, base, metric in (("training_speedup_vs_static", BASELINE, "training_samples"),
                                    ("harvested_vs_uncoordinated", "nearchus+reamer-uncoordinated",
                                     "harvested_core_hours")):
                vals = [m[f"{k}_ratio"] for m in mine if m.get(f"{k}_ratio") is not None]
                if vals:  # per run, and over all of them (Σ ÷ Σ)
                    ratios[f"{key}_{k}_min_ratio"] = min(vals)
                    ratios[f"{key}_{k}_max_ratio"] = max(vals)
                    ratios[f"{key}_{k}_pooled_ratio"] = pooled(same_qos, base, metric, name)
            for k in ("slo_attainment_pct", "training_slowdown_pct", "harvested_share_pct"):
                vals = [m[k] for m in mine if m[k] is not None]
                if vals:
                    ratios[f"{key}_{k[:-4]}_min_pct"] = min(vals)
                    ratios[f"{key}_{k[:-4]}_max_pct"] = max(vals)
    write_json(a.json_out, document("reamer", runs, ratios))
    if not (a.no_docs or overrides):
        write_docs(runs, seeds, a.quick)
    print(f"{len(runs)} runs in {time.perf_counter() - t0:.0f} s -> {a.json_out}")
    hdr = f"{'policy':16} {'qos':10} {'pack':>4} {'load':>5} " + " ".join(f"{k[:12]:>12}" for k in KEYS[:10])
    print(hdr)
    for r in runs:
        m = r["metrics"]
        vals = " ".join(f"{(m[k] if m[k] is not None else float('nan')):12.2f}" for k in KEYS[:10])
        print(f"{r['policy']:16} {r['params']['training_qos']:10} {r['params']['packing_pct']:>4} {r['params']['peak_load']:>5} {vals}  s{r['seed']}")
    return 0


def _override(ap: argparse.ArgumentParser, text: str) -> tuple[str, str, object]:
    """``SECTION.KEY=VALUE`` of ``--set`` as (section, key, value); VALUE as JSON, else as a string."""
    m = re.fullmatch(r"([\w-]+)\.(\w+)=(.*)", text)
    if m is None:
        ap.error(f"--set {text!r}: expected SECTION.KEY=VALUE (inference.need_percentile=75, reamer.stable_s=60)")
    try:
        value = json.loads(m[3])
    except json.JSONDecodeError:
        value = m[3]
    return m[1], m[2], value


def _number_or_pai(text: str) -> float | str:
    if text == "pai2020":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or pai2020, got {text!r}") from None


def _same(r: dict) -> tuple:
    return r["seed"], r["params"]["training_qos"], r["params"]["packing_pct"], r["params"]["peak_load"]


def _of(runs: list[dict], policy: str, metric: str) -> dict[tuple, float]:
    """``metric`` of each of ``policy``'s runs, by seed, training QoS, packing and load."""
    return {_same(r): r["metrics"][metric] for r in runs if r["policy"] == policy}


def versus(runs: list[dict], base_policy: str, metric: str, key: str, policies: tuple[str, ...] | None = None) -> None:
    """Each run's ``key``: its ``metric`` ÷ that of the ``base_policy`` run of the same seed,
    training QoS, packing and load (None without one, or where that one's is 0); only on the
    runs of ``policies`` (None: every run)."""
    base = _of(runs, base_policy, metric)
    for r in runs:
        if policies is None or r["policy"] in policies:
            b = base.get(_same(r))
            r["metrics"][key] = r["metrics"][metric] / b if b else None


def speedups(runs: list[dict]) -> None:
    """Each run's ``training_speedup_vs_static_ratio``: the samples its training jobs trained
    within the horizon ÷ those of the :data:`BASELINE` run of the same seed, training QoS,
    packing and load (None without one); and each joint ``nearchus+reamer`` run's
    ``harvested_vs_uncoordinated_ratio``: its harvested core-hours ÷ those of the
    ``nearchus+reamer-uncoordinated`` run of the same seed, training QoS, packing and load."""
    versus(runs, BASELINE, "training_samples", "training_speedup_vs_static_ratio")
    versus(runs, "nearchus+reamer-uncoordinated", "harvested_core_hours", "harvested_vs_uncoordinated_ratio",
           ("nearchus+reamer",))


def pooled(runs: list[dict], base_policy: str, metric: str, policy: str) -> float | None:
    """Σ ``metric`` over ``policy``'s runs ÷ Σ over the ``base_policy`` runs of the same seeds,
    training QoS, packings and loads (the runs both have; None without any, or a zero sum)."""
    base, mine = _of(runs, base_policy, metric), _of(runs, policy, metric)
    pairs = [(v, base[k]) for k, v in mine.items() if k in base]
    den = sum(b for _, b in pairs)
    return sum(a for a, _ in pairs) / den if pairs and den else None


def write_docs(runs: list[dict], seeds: list[int], quick: bool) -> None:
    cols = [("slo_attainment_pct", "SLO met % of service-minutes"), ("training_slowdown_pct", "training slowdown %"),
            ("harvested_share_pct", "harvested %"), ("harvested_core_hours", "harvested core-hours"),
            ("dedicated_node_hours", "pool node-hours"), ("gpu_alloc_pct", "realised GPU alloc %"),
            ("training_speedup_vs_static_ratio", "training speed-up vs static+reamer")]
    lines = ["## Cloud Reamer", "",
             f"Seeds {', '.join(map(str, seeds))}, min–max over seeds; {'--quick: 12 GPU nodes, 6 h' if quick else '24 GPU nodes, 12 h'}."
             " Regenerate: `python bench/reamer.py --json bench-reamer.json" + (" --quick" if quick else "")
             + " --seeds " + " ".join(map(str, seeds))
             + " --loads " + " ".join(str(x) for x in sorted({r["params"]["peak_load"] for r in runs})) + "`.", "",
             "| training QoS | policy | packing % | peak load | " + " | ".join(c for _, c in cols) + " |",
             "|---|---|---|---|" + "---|" * len(cols)]
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        p = r["params"]
        groups.setdefault((QOS.index(p["training_qos"]), p["packing_pct"], p["peak_load"], r["policy"]),
                          []).append(r["metrics"])
    for (qos, packing, load, name), ms in sorted(groups.items()):
        cells = []
        for key, _ in cols:
            vals = [m[key] for m in ms if m.get(key) is not None]
            f = "{:.3f}" if key.endswith("_ratio") else "{:.2f}"
            cells.append(f"{f.format(min(vals))}–{f.format(max(vals))}" if vals else "n/a")
        lines.append(f"| {QOS[qos]} | {name} | {packing} | {load} | " + " | ".join(cells) + " |")
    write_results_section("Cloud Reamer", lines)


if __name__ == "__main__":
    raise SystemExit(main())
