"""Simulator throughput at cluster scale: wall time, events/s, jobs/s and peak memory of each
training policy at 2,000-20,000 jobs, with the growth exponent of wall time in jobs.

    python bench/sim_speed.py --json bench-sim_speed.json
    python bench/sim_speed.py --policies static --clusters pai6500 --jobs 2000 20000   # one line
    python bench/sim_speed.py --trace --json bench-sim_speed-trace.json   # the whole openb pod list

The jobs are the first N rows of ``../shared/data/pai_synthetic/jobs.csv`` (GPU jobs shaped
like the Alibaba PAI 2020 simulator's trace: groups of 1,000 every 60 s), on two clusters:
``pai6500`` (the workload's own 6,500 GPUs in 8-GPU nodes) and ``openb`` (the 1,523 nodes
of the openb node list). Each run is a fresh process (so its peak RSS is its own); wall time
is the ``simulate`` call, job list reading included. ``--limit-s`` stops a run that takes
longer: it is reported with ``timed_out`` and left out of the exponent. ``--nic-gbps`` sets
both clusters' NIC (default: the workload's 10 GbE); ``--nic-gbps 100000`` takes NIC sharing
out of the model (a job's speed then depends only on its own containers, as in the peer
simulator), so the runs show the simulator's cost without the re-timing it causes.
``--repeat N`` runs every configuration N times, in N passes over all of them, and keeps the
fastest: a busy or throttled machine only slows a run, so the minimum is the least disturbed
measure (the slope of a single pass moves with the machine's speed during it). Every repeat
must do the same work (events, re-timings), or the bench fails.

``--trace`` replays the whole openb pod list instead (``scenarios/openb.yaml``: 8,152 pods on
the 1,523 nodes), under each policy and under ``static-observed``: ``static`` given the
scenario's control interval, so that every running job is measured each interval while the
decisions, and so the results, stay static's. That is the floor of any policy that looks at
every running job each interval (``--policies static-observed`` runs it at the sizes too).

Runs: params ``jobs``, ``cluster``; metrics ``wall_s``, ``events_per_s``, ``jobs_per_s``,
``peak_rss_mib``, ``events``, ``rounds``, ``retimings``, ``job_intervals``, ``timed_out``,
``repeats`` (the runs the fastest was kept from) and ``wall_s_max`` (the slowest of them).
Ratios: ``growth_exponent_<policy>`` (least-squares slope of log wall time against log jobs
over every finished run of the policy, both clusters) and ``growth_exponent_<policy>_<cluster>``;
the same slopes of log events, ``events_growth_exponent_<policy>[_<cluster>]`` (the wall-time
exponent a simulator whose cost per event does not grow would show), and of the model's work:
``retimings_growth_exponent_…`` (re-timings that changed a job's step) and
``job_intervals_growth_exponent_…`` (running jobs measured, summed over telemetry rounds).
With ``--trace``: scenario ``openb``, params ``trace`` (``openb``), the same metrics; ratios
``trace_wall_vs_static_<policy>`` and ``trace_wall_vs_observed_<policy>``, the policy's wall
time over ``static``'s and over ``static-observed``'s (left out where a run was stopped).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import OPENB_NODES, OPENB_PODS, REPO, SHARED_DATA
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from reamer.reports.results import document, run_entry, write_json

PAI = SHARED_DATA / "pai_synthetic"
CLUSTERS = ("pai6500", "openb")
POLICIES = ("static", "nearchus", "optimus")
OBSERVED = "static-observed"  # static, its running jobs measured every control interval: the floor of looking
TRACE = REPO / "scenarios" / "openb.yaml"
SIZES = (2000, 5000, 10000, 20000)


def scenario_text(jobs_csv: Path, cluster: str, nic_gbps: float | None = None) -> str:
    """The scenario of ``cluster`` replaying ``jobs_csv``; ``nic_gbps``: its NIC (None: 10 GbE)."""
    if cluster == "pai6500":
        head = (PAI / "scenario.yaml").read_text().split("workload:")[0]
        text = head + f"workload: {{kind: joblist, path: {jobs_csv}}}\n"
    else:
        text = (f"name: pai-synthetic-on-openb\nseed: 1\ncluster: {{node_list: {OPENB_NODES}, nic_gbps: 10}}\n"
                f"workload: {{kind: joblist, path: {jobs_csv}}}\n")
    if nic_gbps is None:
        return text
    if text.count("nic_gbps: 10") != 1:
        raise ValueError(f"{PAI / 'scenario.yaml'}: expected one 'nic_gbps: 10' in its cluster")
    return text.replace("nic_gbps: 10", f"nic_gbps: {nic_gbps:g}")


def one(jobs: int, cluster: str, policy: str, nic_gbps: float | None = None) -> dict:
    """Run one simulation of the first ``jobs`` pai_synthetic jobs in this process and return its metrics."""
    from reamer.config.scenario import load_scenario

    with tempfile.TemporaryDirectory() as tmp:
        rows = (PAI / "jobs.csv").read_text().splitlines()[: jobs + 1]
        path = Path(tmp) / "jobs.csv"
        path.write_text("\n".join(rows) + "\n")
        sc_path = Path(tmp) / "scenario.yaml"
        sc_path.write_text(scenario_text(path, cluster, nic_gbps))
        return measure(load_scenario(sc_path), policy)


def one_trace(policy: str, nic_gbps: float | None = None) -> dict:
    """Replay the whole openb pod list (``scenarios/openb.yaml``) under ``policy`` in this
    process and return its metrics; ``nic_gbps``: its nodes' NIC (None: the scenario's)."""
    from reamer.config.scenario import load_scenario

    sc = load_scenario(TRACE)
    if nic_gbps is not None:
        sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"nic_gbps": nic_gbps})})
    return measure(sc, policy)


def measure(sc, policy: str) -> dict:
    """Simulate ``sc`` under ``policy`` (``static-observed``: ``static`` with the scenario's
    control interval) and return the metrics of the run; wall time is the ``simulate`` call."""
    from reamer.policies.static import Static
    from reamer.runtime import simulate

    pol: object = policy
    if policy == OBSERVED:  # every running job measured each interval; the decisions stay static's
        pol = Static()
        pol.interval_s = sc.policy.interval_s
    t0 = time.perf_counter()
    res = simulate(sc, pol)
    wall = time.perf_counter() - t0
    m = res.metrics
    return {"wall_s": wall, "events_per_s": m["events"] / wall, "jobs_per_s": m["jobs"] / wall,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "events": m["events"], "rounds": m["rounds"], "retimings": m["retimings"], "job_intervals": m["job_intervals"],
            "jobs_done": m["jobs"], "unfinished": res.unfinished,
            "timed_out": 0}


def exponent(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log value against log jobs (nan: fewer than two sizes, or a
    count of zero, e.g. no telemetry rounds under ``static``)."""
    if len({j for j, _ in points}) < 2 or any(w <= 0 for _, w in points):
        return math.nan
    x = np.log([j for j, _ in points])
    y = np.log([w for _, w in points])
    return float(np.polyfit(x, y, 1)[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_out", help="write results here (the docs/results-format.md shape)")
    ap.add_argument("--jobs", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--clusters", nargs="+", choices=CLUSTERS, default=list(CLUSTERS))
    ap.add_argument("--policies", nargs="+", choices=(*POLICIES, OBSERVED), default=list(POLICIES))
    ap.add_argument("--trace", action="store_true",
                    help="replay the whole openb pod list (scenarios/openb.yaml) instead of the pai_synthetic sizes")
    ap.add_argument("--limit-s", type=float, default=600.0, help="stop a run after this many seconds")
    ap.add_argument("--nic-gbps", type=float, help="both clusters' NIC (default: 10 GbE; 100000: no NIC sharing)")
    ap.add_argument("--repeat", type=int, default=1, help="run each configuration this many times, keep the fastest")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child run: JSON on stdout
    args = ap.parse_args()
    if args.nic_gbps is not None and not args.nic_gbps > 0:
        print(f"bench/sim_speed.py: --nic-gbps: expected a positive number, got {args.nic_gbps:g}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"bench/sim_speed.py: --repeat: expected a whole number ≥ 1, got {args.repeat}", file=sys.stderr)
        return 2
    for path, what, needed in ((PAI / "jobs.csv", "the pai_synthetic workload", not args.trace),
                               (OPENB_NODES, "the openb node list", args.trace or "openb" in args.clusters),
                               (OPENB_PODS, "the openb pod list", args.trace)):
        if needed and not path.is_file():
            print(f"bench/sim_speed.py: {path}: expected {what} (../shared/data)", file=sys.stderr)
            return 2
    if args.one:
        m = one_trace(args.policies[0], args.nic_gbps) if args.trace else one(
            args.jobs[0], args.clusters[0], args.policies[0], args.nic_gbps)
        print(json.dumps(m))
        return 0
    if args.trace:  # static and its observed floor first: the others' ratios are to them
        configs = [(p, "openb", 0) for p in dict.fromkeys(("static", OBSERVED, *args.policies))]
    else:
        configs = [(p, c, n) for p in args.policies for c in args.clusters for n in sorted(args.jobs)]
    got = _run_all(configs, args)
    if got is None:
        return 1
    kept: dict[tuple[str, str, int], dict] = {}
    for (policy, cluster, n), ms in got.items():
        done = [m for m in ms if not m["timed_out"]]
        if len({(m["events"], m["retimings"], m["job_intervals"]) for m in done}) > 1:
            print(f"bench/sim_speed.py: {_what(policy, cluster, n)}: the repeats did different work "
                  f"(events {sorted({m['events'] for m in done})})", file=sys.stderr)
            return 1
        m = min(done, key=lambda m: m["wall_s"]) if done else ms[0]
        kept[(policy, cluster, n)] = m | {"repeats": len(ms), "wall_s_max": max(x["wall_s"] for x in ms)}
    nic = {} if args.nic_gbps is None else {"nic_gbps": args.nic_gbps}
    runs, ratios = (_trace_report if args.trace else _sizes_report)(kept, args, nic)
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}", file=sys.stderr)
    if args.json_out:
        write_json(args.json_out, document("sim_speed", runs, ratios))
    return 0


def _what(policy: str, cluster: str, n: int) -> str:
    return f"{policy} on the openb pod list" if not n else f"{policy} on {cluster}, {n:,} jobs"


def _run_all(configs: list[tuple[str, str, int]], args: argparse.Namespace) -> dict | None:
    """Every configuration ``args.repeat`` times, each run a child process (its own peak RSS),
    in passes over all of them; None when one fails (said on stderr)."""
    got: dict[tuple[str, str, int], list[dict]] = {k: [] for k in configs}
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("simulations", total=len(configs) * args.repeat)
        for rep in range(args.repeat):
            for policy, cluster, n in configs:
                bar.update(task, description=_what(policy, cluster, n)
                           + (f" (pass {rep + 1} of {args.repeat})" if args.repeat > 1 else ""))
                cmd = [sys.executable, __file__, "--one", "--policies", policy]
                cmd += ["--trace"] if not n else ["--jobs", str(n), "--clusters", cluster]
                if args.nic_gbps is not None:
                    cmd += ["--nic-gbps", repr(args.nic_gbps)]
                try:
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.limit_s, check=True)
                    got[(policy, cluster, n)].append(json.loads(out.stdout.strip().splitlines()[-1]))
                except subprocess.TimeoutExpired:
                    got[(policy, cluster, n)].append({"wall_s": args.limit_s, "timed_out": 1})
                except subprocess.CalledProcessError as e:
                    print(f"bench/sim_speed.py: {_what(policy, cluster, n)} failed:\n{e.stderr}", file=sys.stderr)
                    return None
                bar.advance(task)
    return got


def _sizes_report(kept: dict, args: argparse.Namespace, nic: dict) -> tuple[list[dict], dict[str, float]]:
    """The pai_synthetic sizes' runs and growth exponents; their table on stderr."""
    runs = [run_entry(f"pai_synthetic-{n}", 1, policy, m, {"jobs": n, "cluster": cluster} | nic)
            for (policy, cluster, n), m in kept.items()]
    ratios = {}
    for policy in args.policies:
        for cluster in (None, *args.clusters):
            done = [r for r in runs if r["policy"] == policy and not r["metrics"]["timed_out"]
                    and cluster in (None, r["params"]["cluster"])]
            suffix = f"{policy}_{cluster}" if cluster else policy
            for metric, prefix in (("wall_s", "growth_exponent"), ("events", "events_growth_exponent"),
                                   ("retimings", "retimings_growth_exponent"),
                                   ("job_intervals", "job_intervals_growth_exponent")):
                x = exponent([(r["params"]["jobs"], r["metrics"][metric]) for r in done])
                if math.isfinite(x):  # (left out where it has no meaning)
                    ratios[f"{prefix}_{suffix}"] = x
    t = Table(title="Simulator throughput (pai_synthetic jobs)")
    for col in ("policy", "cluster", "jobs", "wall (s)", "events/s", "jobs/s", "peak RSS (MiB)"):
        t.add_column(col, justify="left" if col in ("policy", "cluster") else "right")
    for (policy, cluster, n), m in kept.items():
        if m["timed_out"]:
            t.add_row(policy, cluster, f"{n:,}", f"> {m['wall_s']:.0f}", "–", "–", "–")
        else:
            t.add_row(policy, cluster, f"{n:,}", f"{m['wall_s']:.1f}", f"{m['events_per_s']:,.0f}",
                      f"{m['jobs_per_s']:,.0f}", f"{m['peak_rss_mib']:.0f}")
    Console(stderr=True).print(t)
    return runs, ratios


def _trace_report(kept: dict, args: argparse.Namespace, nic: dict) -> tuple[list[dict], dict[str, float]]:
    """The openb pod list's runs, and each policy's wall time over ``static``'s and over its
    observed floor's (``trace_wall_vs_static_<policy>``, ``trace_wall_vs_observed_<policy>``;
    left out where either run was stopped at ``--limit-s``); their table on stderr."""
    from reamer.config.scenario import load_scenario

    seed = load_scenario(TRACE).seed
    runs = [run_entry("openb", seed, policy, m, {"trace": "openb"} | nic) for (policy, _, _), m in kept.items()]
    wall = {policy: m["wall_s"] for (policy, _, _), m in kept.items() if not m["timed_out"]}
    ratios = {}
    for policy in wall:
        for base, key in (("static", "trace_wall_vs_static"), (OBSERVED, "trace_wall_vs_observed")):
            if policy not in ("static", base) and base in wall:
                ratios[f"{key}_{policy}"] = wall[policy] / wall[base]
    t = Table(title="The whole openb pod list (scenarios/openb.yaml)")
    for col in ("policy", "wall (s)", "× static", "× observed", "job-intervals", "re-timings", "events",
                "peak RSS (MiB)"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for (policy, _, _), m in kept.items():
        if m["timed_out"]:
            t.add_row(policy, f"> {m['wall_s']:.0f}", *["–"] * 6)
            continue
        r = [f"{ratios[k]:.2f}" if k in ratios else "–"
             for k in (f"trace_wall_vs_static_{policy}", f"trace_wall_vs_observed_{policy}")]
        t.add_row(policy, f"{m['wall_s']:.1f}", *r, f"{m['job_intervals']:,}", f"{m['retimings']:,}",
                  f"{m['events']:,}", f"{m['peak_rss_mib']:.0f}")
    Console(stderr=True).print(t)
    return runs, ratios


if __name__ == "__main__":
    sys.exit(main())
