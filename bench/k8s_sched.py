"""The reamer scheduler at cluster scale: decision latency of its policy on the 1,523 openb
nodes, and bind latency end to end against a real kube-apiserver holding 1,523 Node objects.

    python bench/k8s_sched.py --json bench-k8s_sched.json [--trials 300] [--pods 60] [--seed 1]

Cluster: every node of ``../shared/data/openb_node_list_all_node.csv``. Training load: the
pods of ``openb_pod_list_default.csv`` alive at the list's median creation time, placed
first-fit in list order by their CPU, memory and GPU requests (as a default scheduler would
book them; a GPU pod only on a node with free GPUs); each node's training need and limit are
the sum of its pods' CPU requests (static shapes).

* **decision**: a fresh ``reamer`` policy decides one round for one service whose rate (seeded,
  uniform 5–200 req/s of ResNet-50 at a 250 ms SLO) needs new replicas; the per-pod decision
  latency is the round's ``decide`` time ÷ the replicas it places (``--trials`` rounds).
* **bind**: a real kube-apiserver 1.20.2 (``tools/k8s/build.sh``) holds the 1,523 Nodes and one
  fresh NodeSlack per node as the agents would publish it; the scheduler's backend runs its
  full round (list-watch caches, rebuild of the shared state, the policy, create + bind) while
  the service's rate grows each round; per pod: the create + ``pods/binding`` time
  (``bind_*``) and the whole round's time ÷ the pods it bound (``round_per_pod_*``).

Goal: decision p99 < 10 ms.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OPENB_NODES, OPENB_PODS

from reamer.backends.k8s.cluster import Informers
from reamer.backends.k8s.devcluster import DevCluster, add_node, find_binaries
from reamer.backends.k8s.inference import K8sInference
from reamer.backends.k8s.kube import Kube, custom
from reamer.cli.k8s import crds
from reamer.domain import Node
from reamer.domain.inference import (
    HarvestSnapshot,
    NodeUsage,
    PlaceReplica,
    ServiceState,
)
from reamer.models.profiles import shipped_profiles
from reamer.policies import make_policy
from reamer.reports.results import document, run_entry, write_json
from reamer.workloads.build import read_openb_nodes

MODEL, SLO_S = "resnet50", 0.25


def training_load(nodes_: list[Node]) -> dict[str, float]:
    """CPU requested per node by the openb pods alive at the median creation time, first fit."""
    with OPENB_PODS.open() as f:
        rows = list(csv.DictReader(f))
    t = float(np.median([float(r["creation_time"]) for r in rows]))
    free = {n.name: [n.cores, n.mem_mib, n.gpus] for n in nodes_}
    used = {n.name: 0.0 for n in nodes_}
    for r in rows:
        if not float(r["creation_time"]) <= t < float(r["deletion_time"] or "inf"):
            continue
        cpu, mem = float(r["cpu_milli"]) / 1e3, float(r["memory_mib"])
        gpu = float(r["num_gpu"]) * float(r["gpu_milli"]) / 1e3
        for n in nodes_:
            f_ = free[n.name]
            if cpu <= f_[0] and mem <= f_[1] and gpu <= f_[2] and (gpu == 0 or n.gpus > 0):
                f_[0] -= cpu
                f_[1] -= mem
                f_[2] -= gpu
                used[n.name] += cpu
                break
    return used


def decisions(nodes_: list[Node], load: dict[str, float], trials: int, rng: np.random.Generator) -> list[float]:
    prof = shipped_profiles().inference
    usage = {n.name: NodeUsage(n.name, n.cores, 1.0, load[n.name], load[n.name], 0.0, training_used=load[n.name],
                               training_limit=load[n.name]) for n in nodes_}
    per_pod = []
    for _ in range(trials):
        pol = make_policy("reamer", None, kind="harvest", interval_s=10.0, profiles=prof)
        svc = ServiceState("svc", MODEL, SLO_S, float(rng.uniform(5, 200)), ())
        snap = HarvestSnapshot(1.0, tuple(nodes_), usage, (svc,))
        t0 = time.perf_counter()
        out = pol.decide(snap)
        dt = time.perf_counter() - t0
        placed = sum(isinstance(d, PlaceReplica) for d in out)
        if placed:
            per_pod.append(dt / placed * 1e3)
    return per_pod


def binds(nodes_: list[Node], load: dict[str, float], pods: int, workdir: Path) -> dict[str, list[float]]:
    bin_dir, why = find_binaries()
    if bin_dir is None:
        raise SystemExit(f"no kube-apiserver: {why}")
    prof = shipped_profiles()
    with DevCluster(bin_dir, workdir, controller_manager=False) as dc:
        kube = Kube.connect(str(dc.kubeconfig()))
        for c in crds():
            kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", c)
        time.sleep(2)
        kube.create("/api/v1/namespaces", {"metadata": {"name": "bench"}})
        t0 = time.perf_counter()
        for i, n in enumerate(nodes_):
            alloc = {"cpu": str(n.cores), "memory": f"{int(n.mem_mib)}Mi", "nvidia.com/gpu": str(int(n.gpus))}
            add_node(kube, n.name, alloc)
            kube.create(custom("nodeslacks"), {"apiVersion": "reamer.io/v1alpha1", "kind": "NodeSlack",
                                               "metadata": {"name": n.name}, "spec": {}})
            if i % 250 == 0:
                print(f"  {i}/{len(nodes_)} nodes ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        svc = {"apiVersion": "reamer.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "svc"},
               "spec": {"model": MODEL, "sloP99Ms": SLO_S * 1e3, "ratePerSecond": 20.0, "maxReplicas": 10_000}}
        kube.create(custom("inferenceservices", "bench"), svc)
        inf = Informers(kube, "bench").start(timeout_s=120)
        be = K8sInference(kube, inf, "bench", prof.models, list(prof.inference), stale_s=600.0)
        pol = make_policy("reamer", {"stale_s": 600.0}, kind="harvest", interval_s=10.0, profiles=prof.inference)
        out: dict[str, list[float]] = {"bind": [], "round": []}
        rate, done = 20.0, 0
        now = time.time()
        for n in nodes_:  # the agents' reports (fresh for the whole run: stale_s 600 s)
            kube.merge_patch(custom("nodeslacks", name=n.name) + "/status", {"status": {
                "reportedAt": now, "windowSeconds": 10.0, "cores": n.cores, "systemReserved": 1.0,
                "trainingUsed": load[n.name], "trainingNeed": load[n.name]}})
        while done < pods:
            inf.sync()
            t0 = time.perf_counter()
            snap = be.observe(time.time())
            ds = pol.decide(snap)
            t1 = time.perf_counter()
            be.actuate(ds, time.time())
            t2 = time.perf_counter()
            placed = sum(isinstance(d, PlaceReplica) for d in ds)
            if placed:
                out["bind"] += [(t2 - t1) / placed * 1e3] * placed
                out["round"] += [(t2 - t0) / placed * 1e3] * placed
                done += placed
                print(f"  {done}/{pods} pods bound", file=sys.stderr)
            rate *= 1.15
            kube.merge_patch(custom("inferenceservices", "bench", "svc"), {"spec": {"ratePerSecond": rate}})
        inf.stop()
        out["bound"] = [float(sum(1 for p in kube.list("/api/v1/namespaces/bench/pods")[0]
                                  if (p.get("spec") or {}).get("nodeName")))]
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_out", help="write results here")
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--pods", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    nodes_ = read_openb_nodes(OPENB_NODES, 10.0)
    load = training_load(nodes_)
    print(f"{len(nodes_)} nodes, {sum(load.values()):.0f} training cores requested", file=sys.stderr)
    dec = decisions(nodes_, load, args.trials, np.random.default_rng(args.seed))
    print(f"decision: {len(dec)} rounds placed pods", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="reamer-k8s-bench-") as tmp:
        b = binds(nodes_, load, args.pods, Path(tmp))
    pct = lambda xs, q: float(np.percentile(xs, q))
    metrics = {"decision_p50_ms": pct(dec, 50), "decision_p99_ms": pct(dec, 99), "bind_p50_ms": pct(b["bind"], 50),
               "bind_p99_ms": pct(b["bind"], 99), "round_per_pod_p50_ms": pct(b["round"], 50),
               "round_per_pod_p99_ms": pct(b["round"], 99), "nodes": len(nodes_), "pods": len(b["bind"]),
               "pods_bound": b["bound"][0], "decision_trials": len(dec)}
    for k, v in metrics.items():
        print(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}", file=sys.stderr)
    if args.json_out:
        write_json(args.json_out, document("k8s_sched", [run_entry("openb", args.seed, "reamer", metrics, vars(args))],
                                           {"decision_p99_over_goal": metrics["decision_p99_ms"] / 10.0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
