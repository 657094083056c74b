"""NEARCHUS vs Optimus vs static (and ablations), side by side, same seeds.

    python bench/nearchus.py --json bench-nearchus.json [--seeds 1 2 3] [--quick]
    python bench/nearchus.py --scenarios openb --policies nearchus --seeds 2   # iterate

Scenarios: ``default`` (the embedded one) and ``openb`` (16 evenly spaced openb nodes, the
first 500 GPU pods of the openb pod list as jobs at offered GPU load 1.0, models from the
zoo; needs ../shared/data). A subset of scenarios or policies prints its table and writes
its --json without ratios, and leaves docs/results.md alone. Metrics per run: mean_jct_s, p95_jct_s, mean_queue_s, makespan_s,
cpu_util_pct, reconfigurations, speedup_vs_static_ratio (mean over jobs of the job's speed
under the policy ÷ its speed under static, same seed). Ratios: nearchus/static and
nearchus/optimus of JCT, queueing and speed-up, min and max over seeds. Also writes
docs/results.md (the NEARCHUS table) unless --no-docs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from _common import OPENB_NODES, OPENB_PODS, write_results_section
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from reamer.runtime import simulate
from reamer.config.scenario import Scenario, load_scenario, parse_scenario
from reamer.models.profiles import shipped_profiles
from reamer.policies import make_policy
from reamer.reports.results import document, run_entry, write_json

KEYS = ["mean_jct_s", "p95_jct_s", "mean_queue_s", "makespan_s", "cpu_util_pct", "reconfigurations"]
POLICIES = {  # run name -> (policy, options)
    "static": ("static", {}),
    "optimus": ("optimus", {}),
    "nearchus": ("nearchus", {}),
    "nearchus-no-outscale": ("nearchus", {"outscale": False}),
    "nearchus-no-stabilize": ("nearchus", {"stabilize": False}),
}
PAPER = {"speed": "+71.4% to +129.1%", "jct": "−35.6%", "queue": "−67.8%"}


# The openb scenario: 16 evenly spaced nodes of the openb node list (13 GPU nodes, 64 GPUs),
# the first OPENB_JOBS GPU pods of the pod list, arrivals at an offered GPU load of 1.0 (the
# pods' GPU-seconds equal the GPUs' capacity over the arrival span). The size is the smallest
# tried (150, 300, 500, 700, 1,000) at which static queues on every seed: with 300 pods the
# long-tail pods keep arriving into a cluster with room (static never queues); with 500 GPU
# shares run out and static queues on every seed.
OPENB_JOBS = 500


def openb_scenario(quick: bool) -> Scenario:
    return parse_scenario({
        "name": "openb",
        "cluster": {"node_list": str(OPENB_NODES), "max_nodes": 16, "nic_gbps": 10},
        "workload": {"kind": "openb", "pod_list": str(OPENB_PODS), "gpu_only": True,
                     "max_jobs": 150 if quick else OPENB_JOBS, "load": 1.0, "max_duration_s": 86400},
    }, "bench/nearchus.py")


def scenarios(quick: bool) -> list[Scenario]:
    out = [load_scenario(None)]
    if OPENB_NODES.is_file() and OPENB_PODS.is_file():
        out.append(openb_scenario(quick))
    else:
        print(f"openb scenario skipped: {OPENB_NODES.parent} not found", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--quick", action="store_true", help="smaller openb subset, two seeds")
    ap.add_argument("--scenarios", nargs="+", choices=["default", "openb"], default=["default", "openb"],
                    help="run only these scenarios (while iterating; the docs need both)")
    ap.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES),
                    help="run only these policies (static always runs: speed-ups are relative to it)")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--from-json", help="rebuild the table and docs from an earlier --json file, without running")
    args = ap.parse_args()
    if args.from_json:
        doc = json.loads(Path(args.from_json).read_text())
        per = {(r["scenario"], r["seed"], r["policy"]): r["metrics"] for r in doc["runs"]}
        seeds = sorted({s for _, s, _ in per})
        table(per, seeds)
        if not args.no_docs:
            write_docs(per, seeds, compute_ratios(per, seeds))
        return 0
    seeds = args.seeds[:2] if args.quick else args.seeds
    cal = shipped_profiles().calibration
    runs, per = [], {}
    scs = [sc for sc in scenarios(args.quick) if sc.name in args.scenarios]
    chosen = {k: v for k, v in POLICIES.items() if k == "static" or k in args.policies}
    partial = len(chosen) < len(POLICIES) or len(scs) < 2
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("simulating", total=len(scs) * len(seeds) * len(chosen))
        for base in scs:
            for seed in seeds:
                sc = base.model_copy(update={"seed": seed})
                res = {}
                for run_name, (pol, opts) in chosen.items():
                    policy = make_policy(pol, opts, interval_s=sc.policy.interval_s)
                    res[run_name] = simulate(sc, policy, cal)
                    bar.advance(task)
                base_speed = {j.id: j.speed for j in res["static"].jobs}
                for run_name, r in res.items():
                    ratios = [j.speed / base_speed[j.id] for j in r.jobs if j.id in base_speed]
                    m = {k: r.metrics[k] for k in KEYS}
                    m["speedup_vs_static_ratio"] = float(np.mean(ratios))
                    m["jobs"] = r.metrics["jobs"]
                    per[(sc.name, seed, run_name)] = m
                    runs.append(run_entry(sc.name, seed, run_name, m, {"restart_s": sc.cluster.restart_s}))
    if partial:  # a subset: print it, no ratios, no docs
        table(per, seeds)
        if args.json_out:
            write_json(args.json_out, document("nearchus", runs, {}))
        return 0
    ratios = compute_ratios(per, seeds)
    doc = document("nearchus", runs, ratios)
    if args.json_out:
        write_json(args.json_out, doc)
    table(per, seeds)
    if not args.no_docs:
        write_docs(per, seeds, ratios)
    return 0


def compute_ratios(per: dict, seeds: list[int]) -> dict[str, float]:
    """nearchus ÷ static and ÷ optimus, min and max over seeds (inf where the baseline is 0)."""
    ratios = {}
    for name in dict.fromkeys(s for s, _, _ in per):
        for other in ("static", "optimus"):
            for key, label in (("mean_jct_s", "jct"), ("mean_queue_s", "queue"), ("speedup_vs_static_ratio", "speedup")):
                vals = []
                for seed in seeds:
                    a, b = per[(name, seed, "nearchus")][key], per[(name, seed, other)][key]
                    vals.append(a / b if b > 0 else (1.0 if a == b else math.inf))
                ratios[f"{label}_nearchus_over_{other}_{name}_min_ratio"] = min(vals)
                ratios[f"{label}_nearchus_over_{other}_{name}_max_ratio"] = max(vals)
    return ratios


def table(per: dict, seeds: list[int]) -> None:
    t = Table(title="NEARCHUS benchmark (mean over seeds)")
    for c in ("scenario", "policy", "mean JCT (h)", "p95 JCT (h)", "queue (min)", "speed-up ×", "CPU %", "reconfigs"):
        t.add_column(c)
    for (name, run_name) in dict.fromkeys((s, p) for s, _, p in per):
        ms = [per[(name, s, run_name)] for s in seeds]
        avg = {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}
        t.add_row(name, run_name, f"{avg['mean_jct_s'] / 3600:.2f}", f"{avg['p95_jct_s'] / 3600:.2f}",
                  f"{avg['mean_queue_s'] / 60:.1f}", f"{avg['speedup_vs_static_ratio']:.2f}",
                  f"{avg['cpu_util_pct']:.1f}", f"{avg['reconfigurations']:.0f}")
    Console(width=140).print(t)


def write_docs(per: dict, seeds: list[int], ratios: dict) -> None:
    lines = ["## NEARCHUS",
             "", f"Seeds {', '.join(map(str, seeds))}; values are min–max over seeds, against `static` "
             "(same seed, same workload). Regenerate: `python bench/nearchus.py --json bench-nearchus.json`.", "",
             "| scenario | claim | paper | nearchus vs static | nearchus vs optimus |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(s for s, _, _ in per):
        def rng(label, other):
            lo = ratios[f"{label}_nearchus_over_{other}_{name}_min_ratio"]
            hi = ratios[f"{label}_nearchus_over_{other}_{name}_max_ratio"]
            if not (math.isfinite(lo) and math.isfinite(hi)):  # a zero baseline: no ratio
                key = {"jct": "mean_jct_s", "queue": "mean_queue_s"}[label]
                pairs = [f"{per[(name, s, 'nearchus')][key]:.0f} s vs {per[(name, s, other)][key]:.0f} s" for s in seeds]
                return "no ratio (baseline 0): " + "; ".join(pairs)
            return f"{(lo - 1) * 100:+.1f}% to {(hi - 1) * 100:+.1f}%"
        lines.append(f"| {name} | per-job training speed | {PAPER['speed']} | {rng('speedup', 'static')} | {rng('speedup', 'optimus')} |")
        lines.append(f"| {name} | mean JCT | {PAPER['jct']} | {rng('jct', 'static')} | {rng('jct', 'optimus')} |")
        lines.append(f"| {name} | mean queueing time | {PAPER['queue']} | {rng('queue', 'static')} | {rng('queue', 'optimus')} |")
    lines += ["", "| scenario | policy | mean JCT (h) | p95 JCT (h) | mean queue (min) | speed-up vs static | CPU used % | reconfigurations |",
              "|---|---|---|---|---|---|---|---|"]
    for (name, run_name) in dict.fromkeys((s, p) for s, _, p in per):
        ms = [per[(name, s, run_name)] for s in seeds]
        avg = {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}
        lines.append(f"| {name} | {run_name} | {avg['mean_jct_s'] / 3600:.2f} | {avg['p95_jct_s'] / 3600:.2f} | "
                     f"{avg['mean_queue_s'] / 60:.1f} | {avg['speedup_vs_static_ratio']:.2f} | {avg['cpu_util_pct']:.1f} | "
                     f"{avg['reconfigurations']:.0f} |")
    write_results_section("NEARCHUS", lines)

if __name__ == "__main__":
    sys.exit(main())
