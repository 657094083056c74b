"""Simulator throughput: 10,000 synthetic jobs on 1,523 nodes (the openb cluster) under `static`.

    python bench/sim_speed.py --json bench-sim_speed.json
Metrics: events_per_s, jobs_per_s, wall_s (plus events and jobs).
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import OPENB_NODES, openb_cluster
from rich.console import Console
from rich.progress import Progress

from reamer.runtime import simulate
from reamer.config.scenario import parse_scenario
from reamer.reports.results import document, run_entry, write_json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_out", help="write results here (the docs/results-format.md shape)")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--policy", default="static")
    args = ap.parse_args()
    sc = parse_scenario({
        "name": "sim_speed", "seed": args.seed,
        "cluster": openb_cluster(),
        # ≈70% offered CPU load: mean job ≈ 8 cores × ≈4,000 s on ≈125k cores
        "workload": {"kind": "synthetic", "jobs": args.jobs, "mean_interarrival_s": 0.37,
                     "runtime_s": [900, 10800]},
    }, "bench/sim_speed.py")
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"{args.jobs} jobs on 1,523 nodes", total=args.jobs)
        t0 = time.perf_counter()
        res = simulate(sc, args.policy, progress=lambda d, n: bar.update(task, completed=d))
        wall = time.perf_counter() - t0
    m = res.metrics
    metrics = {"events_per_s": m["events"] / wall, "jobs_per_s": m["jobs"] / wall, "wall_s": wall,
               "events": m["events"], "jobs": m["jobs"], "rounds": m["rounds"]}
    params = {"nodes": 1523, "node_source": "openb" if OPENB_NODES.is_file() else "openb-like pools"}
    print(f"{m['jobs']:.0f} jobs, {m['events']:.0f} events in {wall:.1f} s: "
          f"{metrics['events_per_s']:,.0f} events/s, {metrics['jobs_per_s']:,.0f} jobs/s", file=sys.stderr)
    if args.json_out:
        write_json(args.json_out, document("sim_speed", [run_entry(sc.name, args.seed, args.policy, metrics, params)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
