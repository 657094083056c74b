"""NEARCHUS vs Optimus vs static (and ablations), side by side, same seeds.

    python bench/nearchus.py --json docs/data/nearchus.json [--seeds 1 2 3] [--quick]
    python bench/nearchus.py --scenarios openb --policies nearchus --seeds 2   # iterate
    python bench/nearchus.py --json OUT --policies nearchus --no-sensitivity --set restore=true   # an ablation

Scenarios: ``default`` (the embedded one), ``paper`` (``scenarios/paper.yaml``: shaped like
NEARCHUS's testbed, docs/scenarios.md) and ``openb`` (16 evenly spaced openb nodes, the first
500 GPU pods of the openb pod list as jobs at offered GPU load 1.0, models from the zoo; needs
../shared/data). Every policy runs on the shipped profile (param ``parallel_fraction``:
``measured``, the per-model scaling curves); ``static`` and ``nearchus`` run again with one
Amdahl fraction for every model and the PS (params ``parallel_fraction``: the shipped profile's
machine-wide one, then 0.8, 0.9, 0.95): the sensitivity of the results to that one constant.
``--set KEY=VALUE`` (repeatable) also runs ``nearchus`` with that one option changed (run
``nearchus KEY=VALUE``; options in docs/nearchus.md). A subset of scenarios or policies, --set or
--no-sensitivity prints its table and writes its --json without ratios, and leaves
docs/results.md alone. Metrics per run: mean_jct_s, p95_jct_s,
mean_queue_s, makespan_s, cpu_util_pct, reconfigurations, speedup_vs_static_ratio (mean over
jobs of the job's speed under the policy ÷ its speed under static, same seed and fraction),
wall_s, extrapolated_models (models whose workers got more cores than their fraction was
measured at). Ratios: nearchus/static and nearchus/optimus of JCT, queueing and speed-up, min
and max over seeds; ``*_f<fraction>_*`` (``_f0p9``) the same against static at each what-if fraction. Also
writes docs/results.md (the NEARCHUS tables) unless --no-docs.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from _common import OPENB_NODES, OPENB_PODS, REPO, write_results_section
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from reamer.config.scenario import Scenario, load_scenario, parse_scenario
from reamer.errors import InputError
from reamer.models.profiles import shipped_profiles, with_parallel_fraction
from reamer.policies import make_policy
from reamer.reports.results import document, run_entry, write_json
from reamer.runtime import simulate

KEYS = ["mean_jct_s", "p95_jct_s", "mean_queue_s", "makespan_s", "cpu_util_pct", "reconfigurations"]
POLICIES = {  # run name -> (policy, options)
    "static": ("static", {}),
    "optimus": ("optimus", {}),
    "nearchus": ("nearchus", {}),
    "nearchus-no-outscale": ("nearchus", {"outscale": False}),
    "nearchus-no-stabilize": ("nearchus", {"stabilize": False}),
}
PAPER_CLAIMS = {"speedup": "+71.4% to +129.1%", "jct": "−35.6%", "queue": "−67.8%"}
SCENARIOS = ("default", "paper", "openb")
PAPER_SCENARIO = REPO / "scenarios" / "paper.yaml"
MEASURED = "measured"  # the parallel_fraction param of runs on the shipped profile's per-model curves
SENSITIVITY_POLICIES = ("static", "nearchus")  # what runs again at each what-if fraction


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
    out = [load_scenario(None), load_scenario(PAPER_SCENARIO)]
    if OPENB_NODES.is_file() and OPENB_PODS.is_file():
        out.append(openb_scenario(quick))
    else:
        print(f"openb scenario skipped: {OPENB_NODES.parent} not found", file=sys.stderr)
    return out


def one(task: tuple[Scenario, str | float, dict[str, tuple[str, dict]]]) -> tuple[str, int, str | float, dict]:
    """Every policy of ``task`` on one scenario and seed at one parallel fraction ("measured": the
    shipped profile's per-model curves); metrics per policy, speed-ups against its static run."""
    sc, fraction, chosen = task
    prof = shipped_profiles() if fraction == MEASURED else with_parallel_fraction(shipped_profiles(), float(fraction))
    res = {}
    for run_name, (pol, opts) in chosen.items():
        policy = make_policy(pol, opts, interval_s=sc.policy.interval_s)
        res[run_name] = simulate(sc, policy, profiles=prof)
    base_speed = {j.id: j.speed for j in res["static"].jobs}
    out = {}
    for run_name, r in res.items():
        ratios = [j.speed / base_speed[j.id] for j in r.jobs if j.id in base_speed]
        m = {k: r.metrics[k] for k in KEYS}
        m["speedup_vs_static_ratio"] = float(np.mean(ratios))
        m["jobs"] = r.metrics["jobs"]
        m["wall_s"] = r.metrics["wall_s"]
        m["extrapolated_models"] = len(r.extrapolated)
        out[run_name] = m
    return sc.name, sc.seed, fraction, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--quick", action="store_true", help="smaller openb subset, two seeds")
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                    help="run only these scenarios (while iterating; the docs need all)")
    ap.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES),
                    help="run only these policies (static always runs: speed-ups are relative to it)")
    ap.add_argument("--no-sensitivity", action="store_true", help="only the shipped profile's fractions")
    ap.add_argument("--set", dest="ablations", action="append", default=[], metavar="KEY=VALUE",
                    help="also run nearchus with this one option changed (VALUE as JSON, else a string)")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="simulations in parallel")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--from-json", help="rebuild the table and docs from an earlier --json file, without running")
    args = ap.parse_args()
    if args.from_json:
        doc = json.loads(Path(args.from_json).read_text())
        per = {(r["scenario"], r["seed"], r["policy"], r["params"].get("parallel_fraction", MEASURED)): r["metrics"]
               for r in doc["runs"]}
        seeds = sorted({k[1] for k in per})
        table(per, seeds)
        if not args.no_docs and doc["ratios"]:  # a subset's file has no ratios: no docs from it
            write_docs(per, seeds, compute_ratios(per, seeds))
        return 0
    seeds = args.seeds[:2] if args.quick else args.seeds
    scs = [sc for sc in scenarios(args.quick) if sc.name in args.scenarios]
    chosen = {k: v for k, v in POLICIES.items() if k == "static" or k in args.policies}
    for text in args.ablations:
        key, eq, raw = text.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        try:
            make_policy("nearchus", {key: value}, interval_s=60.0)  # a bad key or value: one line now
        except InputError as e:
            ap.error(f"--set {text!r}: {e}" if eq else f"--set {text!r}: expected KEY=VALUE (restore=true)")
        chosen[f"nearchus {key}={raw}"] = ("nearchus", {key: value})
    partial = (len(chosen) < len(POLICIES) or len(scs) < len(SCENARIOS) or args.no_sensitivity
               or bool(args.ablations))
    fractions = [] if args.no_sensitivity else sensitivity_fractions()
    tasks = [(base.model_copy(update={"seed": seed}), MEASURED, chosen) for base in scs for seed in seeds]
    tasks += [(base.model_copy(update={"seed": seed}), f, {k: POLICIES[k] for k in SENSITIVITY_POLICIES})
              for base in scs for seed in seeds for f in fractions]
    runs, per = [], {}
    restart_s = {sc.name: sc.cluster.restart_s for sc in scs}
    t0 = time.perf_counter()
    spawn = multiprocessing.get_context("spawn")  # fresh workers: the progress bar runs a thread
    with ProcessPoolExecutor(max(1, args.workers), mp_context=spawn) as ex, \
            Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("simulating", total=len(tasks))
        for name, seed, fraction, out in ex.map(one, tasks):
            for run_name, m in out.items():
                per[(name, seed, run_name, fraction)] = m
                runs.append(run_entry(name, seed, run_name, m, {"parallel_fraction": fraction, "restart_s": restart_s[name]}))
            bar.advance(task)
    print(f"{len(runs)} runs in {time.perf_counter() - t0:.0f} s ({args.workers} in parallel)", file=sys.stderr)
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


def sensitivity_fractions() -> list[float]:
    """The shipped profile's machine-wide fraction (what a model without its own curve gets),
    then 0.8, 0.9 and 0.95, toward the published many-core curves (docs/calibration.md: 0.88–0.98
    over 8–32 cores)."""
    return [shipped_profiles().calibration.parallel_fraction, 0.8, 0.9, 0.95]


def ratio_key(label: str, other: str, name: str, fraction: str | float, end: str) -> str:
    """``LABEL_nearchus_over_OTHER_SCENARIO[_fFRACTION]_{min,max}_ratio``; a what-if fraction
    is written with ``p`` for its point (``_f0p9``), keys staying snake_case."""
    tag = "" if fraction == MEASURED else "_f" + f"{fraction:g}".replace(".", "p")
    return f"{label}_nearchus_over_{other}_{name}{tag}_{end}_ratio"


def compute_ratios(per: dict, seeds: list[int]) -> dict[str, float]:
    """nearchus ÷ static and ÷ optimus, min and max over seeds (inf where the baseline is 0);
    at each what-if fraction, nearchus ÷ static."""
    ratios = {}
    combos = dict.fromkeys((s, f, o) for s, _, _, f in per for o in (("static", "optimus") if f == MEASURED
                                                                     else ("static",)))
    for name, fraction, other in combos:
        for key, label in (("mean_jct_s", "jct"), ("mean_queue_s", "queue"), ("speedup_vs_static_ratio", "speedup")):
            vals = []
            for seed in seeds:
                a, b = per[(name, seed, "nearchus", fraction)][key], per[(name, seed, other, fraction)][key]
                vals.append(a / b if b > 0 else (1.0 if a == b else math.inf))
            ratios[ratio_key(label, other, name, fraction, "min")] = min(vals)
            ratios[ratio_key(label, other, name, fraction, "max")] = max(vals)
    return ratios


def _mean(per: dict, seeds: list[int], name: str, run_name: str, fraction: str | float) -> dict[str, float]:
    ms = [per[(name, s, run_name, fraction)] for s in seeds]
    return {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}


def table(per: dict, seeds: list[int]) -> None:
    t = Table(title="NEARCHUS benchmark (mean over seeds)")
    for c in ("scenario", "parallel fraction", "policy", "mean JCT (h)", "p95 JCT (h)", "queue (min)", "speed-up ×",
              "CPU %", "reconfigs"):
        t.add_column(c)
    for (name, run_name, fraction) in dict.fromkeys((s, p, f) for s, _, p, f in per):
        avg = _mean(per, seeds, name, run_name, fraction)
        t.add_row(name, str(fraction), run_name, f"{avg['mean_jct_s'] / 3600:.2f}", f"{avg['p95_jct_s'] / 3600:.2f}",
                  f"{avg['mean_queue_s'] / 60:.1f}", f"{avg['speedup_vs_static_ratio']:.2f}",
                  f"{avg['cpu_util_pct']:.1f}", f"{avg['reconfigurations']:.0f}")
    Console(width=160).print(t)


def write_docs(per: dict, seeds: list[int], ratios: dict) -> None:
    def rng(name, label, other, fraction=MEASURED):
        lo = ratios[ratio_key(label, other, name, fraction, "min")]
        hi = ratios[ratio_key(label, other, name, fraction, "max")]
        if not (math.isfinite(lo) and math.isfinite(hi)):  # a zero baseline: no ratio
            key = {"jct": "mean_jct_s", "queue": "mean_queue_s", "speedup": "speedup_vs_static_ratio"}[label]
            pairs = [f"{per[(name, s, 'nearchus', fraction)][key]:.0f} s vs {per[(name, s, other, fraction)][key]:.0f} s"
                     for s in seeds]
            return "no ratio (baseline 0): " + "; ".join(pairs)
        return f"{(lo - 1) * 100:+.1f}% to {(hi - 1) * 100:+.1f}%"

    names = list(dict.fromkeys(s for s, _, _, _ in per))
    lines = ["## NEARCHUS",
             "", (f"Seeds {', '.join(map(str, seeds))}; values are min–max over seeds, against `static` "
                  "(same seed, same workload). Regenerate: `python bench/nearchus.py --json docs/data/nearchus.json`."), "",
             "| scenario | claim | paper | nearchus vs static | nearchus vs optimus |", "|---|---|---|---|---|"]
    for name in names:
        for label, claim in (("speedup", "per-job training speed"), ("jct", "mean JCT"), ("queue", "mean queueing time")):
            paper = PAPER_CLAIMS[label]
            lines.append(f"| {name} | {claim} | {paper} | {rng(name, label, 'static')} | {rng(name, label, 'optimus')} |")
    lines += ["", "| scenario | policy | mean JCT (h) | p95 JCT (h) | mean queue (min) | speed-up vs static | CPU used % | reconfigurations |",
              "|---|---|---|---|---|---|---|---|"]
    for (name, run_name) in dict.fromkeys((s, p) for s, _, p, f in per if f == MEASURED):
        avg = _mean(per, seeds, name, run_name, MEASURED)
        lines.append(f"| {name} | {run_name} | {avg['mean_jct_s'] / 3600:.2f} | {avg['p95_jct_s'] / 3600:.2f} | "
                     f"{avg['mean_queue_s'] / 60:.1f} | {avg['speedup_vs_static_ratio']:.2f} | {avg['cpu_util_pct']:.1f} | "
                     f"{avg['reconfigurations']:.0f} |")
    fractions = list(dict.fromkeys(f for _, _, _, f in per))
    if len(fractions) > 1:
        lines += ["", ("Sensitivity to the parallel fraction: `nearchus` against `static` with the per-model curves "
                       "of the shipped profile (`measured`) and with one Amdahl fraction for every model and the PS."), "",
                  "| scenario | parallel fraction | per-job speed | mean JCT | mean queueing |", "|---|---|---|---|---|"]
        for name in names:
            for f in fractions:
                lines.append(f"| {name} | {f if f == MEASURED else f'{f:g}'} | {rng(name, 'speedup', 'static', f)} | "
                             f"{rng(name, 'jct', 'static', f)} | {rng(name, 'queue', 'static', f)} |")
    write_results_section("NEARCHUS", lines)

if __name__ == "__main__":
    sys.exit(main())
