"""Simulator throughput at cluster scale: wall time, events/s, jobs/s and peak memory of each
training policy at 2,000-20,000 jobs, with the growth exponent of wall time in jobs.

    python bench/sim_speed.py --json bench-sim_speed.json
    python bench/sim_speed.py --policies static --clusters pai6500 --jobs 2000 20000   # one line

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

Runs: params ``jobs``, ``cluster``; metrics ``wall_s``, ``events_per_s``, ``jobs_per_s``,
``peak_rss_mib``, ``events``, ``rounds``, ``retimings``, ``job_intervals``, ``timed_out``,
``repeats`` (the runs the fastest was kept from) and ``wall_s_max`` (the slowest of them).
Ratios: ``growth_exponent_<policy>`` (least-squares slope of log wall time against log jobs
over every finished run of the policy, both clusters) and ``growth_exponent_<policy>_<cluster>``;
the same slopes of log events, ``events_growth_exponent_<policy>[_<cluster>]`` (the wall-time
exponent a simulator whose cost per event does not grow would show), and of the model's work:
``retimings_growth_exponent_…`` (re-timings that changed a job's step) and
``job_intervals_growth_exponent_…`` (running jobs measured, summed over telemetry rounds).
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
from _common import OPENB_NODES, SHARED_DATA
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from reamer.reports.results import document, run_entry, write_json

PAI = SHARED_DATA / "pai_synthetic"
CLUSTERS = ("pai6500", "openb")
POLICIES = ("static", "nearchus", "optimus")
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
    """Run one simulation in this process and return its metrics."""
    from reamer.config.scenario import load_scenario
    from reamer.runtime import simulate

    with tempfile.TemporaryDirectory() as tmp:
        rows = (PAI / "jobs.csv").read_text().splitlines()[: jobs + 1]
        path = Path(tmp) / "jobs.csv"
        path.write_text("\n".join(rows) + "\n")
        sc_path = Path(tmp) / "scenario.yaml"
        sc_path.write_text(scenario_text(path, cluster, nic_gbps))
        sc = load_scenario(sc_path)
        t0 = time.perf_counter()
        res = simulate(sc, policy)
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
    ap.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
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
    if not (PAI / "jobs.csv").is_file():
        print(f"bench/sim_speed.py: {PAI / 'jobs.csv'}: expected the pai_synthetic workload (../shared/data)",
              file=sys.stderr)
        return 2
    if "openb" in args.clusters and not OPENB_NODES.is_file():
        print(f"bench/sim_speed.py: {OPENB_NODES}: expected the openb node list (../shared/data)", file=sys.stderr)
        return 2
    if args.one:
        print(json.dumps(one(args.jobs[0], args.clusters[0], args.policies[0], args.nic_gbps)))
        return 0
    configs = [(p, c, n) for p in args.policies for c in args.clusters for n in sorted(args.jobs)]
    got: dict[tuple[str, str, int], list[dict]] = {k: [] for k in configs}
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("simulations", total=len(configs) * args.repeat)
        for rep in range(args.repeat):
            for policy, cluster, n in configs:
                bar.update(task, description=f"{policy} on {cluster}, {n:,} jobs"
                           + (f" (pass {rep + 1} of {args.repeat})" if args.repeat > 1 else ""))
                cmd = [sys.executable, __file__, "--one", "--jobs", str(n), "--clusters", cluster, "--policies", policy]
                if args.nic_gbps is not None:
                    cmd += ["--nic-gbps", repr(args.nic_gbps)]
                try:
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.limit_s, check=True)
                    got[(policy, cluster, n)].append(json.loads(out.stdout.strip().splitlines()[-1]))
                except subprocess.TimeoutExpired:
                    got[(policy, cluster, n)].append({"wall_s": args.limit_s, "timed_out": 1})
                except subprocess.CalledProcessError as e:
                    print(f"bench/sim_speed.py: {policy} on {cluster} with {n} jobs failed:\n{e.stderr}",
                          file=sys.stderr)
                    return 1
                bar.advance(task)
    runs, table = [], []
    for (policy, cluster, n), ms in got.items():
        done = [m for m in ms if not m["timed_out"]]
        if len({(m["events"], m["retimings"], m["job_intervals"]) for m in done}) > 1:
            print(f"bench/sim_speed.py: {policy} on {cluster} with {n} jobs: the repeats did different work "
                  f"(events {sorted({m['events'] for m in done})})", file=sys.stderr)
            return 1
        m = min(done, key=lambda m: m["wall_s"]) if done else ms[0]
        m = m | {"repeats": len(ms), "wall_s_max": max(x["wall_s"] for x in ms)}
        params = {"jobs": n, "cluster": cluster} | ({} if args.nic_gbps is None else {"nic_gbps": args.nic_gbps})
        runs.append(run_entry(f"pai_synthetic-{n}", 1, policy, m, params))
        table.append((policy, cluster, n, m))
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
    for policy, cluster, n, m in table:
        if m["timed_out"]:
            t.add_row(policy, cluster, f"{n:,}", f"> {m['wall_s']:.0f}", "–", "–", "–")
        else:
            t.add_row(policy, cluster, f"{n:,}", f"{m['wall_s']:.1f}", f"{m['events_per_s']:,.0f}",
                      f"{m['jobs_per_s']:,.0f}", f"{m['peak_rss_mib']:.0f}")
    Console(stderr=True).print(t)
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}", file=sys.stderr)
    if args.json_out:
        write_json(args.json_out, document("sim_speed", runs, ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
