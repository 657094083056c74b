"""Training-only simulations as JSON, to diff before and after a change of the simulator.

    python tools/sim_golden.py --cases full --out before.json      # on the old revision
    python tools/sim_golden.py --cases full --check before.json    # on the new one: exit 1 on any difference

Each run is what ``reamer simulate --json`` writes (the metrics, without ``wall_s``) plus a
digest of its per-job records and time series, so a change that moves any job shows. Cases:
``quick`` (what ``tests/runtime/test_sim_golden.py`` checks against
``tests/runtime/data/sim_training_golden.json``: the default scenario under every training
policy, openb's first 60 pods under ``static``), ``full`` (the default scenario and the whole
openb pod list under ``static`` and ``nearchus``; ``optimus`` on openb's first 300 pods: it
takes more than ten minutes per seed on the whole list). Seeds 1-3 each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from reamer.runtime import simulate
from reamer.config.scenario import Scenario, load_scenario

REPO = Path(__file__).resolve().parents[1]
OPENB = REPO / "scenarios" / "openb.yaml"
SEEDS = (1, 2, 3)
POLICIES = ("static", "optimus", "nearchus")


def cases(kind: str) -> list[tuple[Scenario, str]]:
    default = load_scenario(None)
    openb = load_scenario(OPENB)

    def capped(sc: Scenario, n: int) -> Scenario:
        return sc.model_copy(update={"name": f"{sc.name}-{n}", "workload": sc.workload.model_copy(update={"max_jobs": n})})

    out = [(default, p) for p in POLICIES]
    if kind == "quick":
        out += [(capped(openb, 60), "static")]
    else:
        out += [(openb, "static"), (openb, "nearchus"), (capped(openb, 300), "optimus")]
    return [(sc.model_copy(update={"seed": s}), p) for sc, p in out for s in SEEDS]


def digest(res) -> str:
    h = hashlib.sha256()
    for r in res.jobs:
        h.update(repr((r.id, r.model, r.arrival_s, r.start_s, r.end_s, r.queue_s, r.samples, r.reconfigs)).encode())
    for k in sorted(res.series):
        h.update(k.encode() + repr(res.series[k]).encode())
    return h.hexdigest()[:16]


def run(kind: str, log=print) -> list[dict]:
    runs = []
    for sc, policy in cases(kind):
        res = simulate(sc, policy)
        metrics = {k: v for k, v in res.metrics.items() if k != "wall_s"}
        runs.append({"scenario": res.scenario, "seed": res.seed, "policy": res.policy, "metrics": metrics,
                     "digest": digest(res)})
        log(f"{res.scenario} seed {res.seed} {res.policy}: {res.metrics['wall_s']:.1f} s", file=sys.stderr)
    return runs


def differences(a: list[dict], b: list[dict]) -> list[str]:
    key = lambda r: (r["scenario"], r["seed"], r["policy"])  # noqa: E731
    old, new = {key(r): r for r in a}, {key(r): r for r in b}
    out = [f"{k}: missing" for k in old if k not in new] + [f"{k}: new" for k in new if k not in old]
    for k in (k for k in old if k in new):
        for field in ("metrics", "digest"):
            if old[k][field] != new[k][field]:
                out.append(f"{k}: {field} differ: {old[k][field]} != {new[k][field]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", choices=("quick", "full"), default="quick")
    ap.add_argument("--out", type=Path, help="write the runs here")
    ap.add_argument("--check", type=Path, help="compare with this earlier output; exit 1 on any difference")
    args = ap.parse_args()
    runs = run(args.cases)
    if args.out:
        args.out.write_text(json.dumps({"cases": args.cases, "runs": runs}, indent=1) + "\n")
    if args.check:
        diff = differences(json.loads(args.check.read_text())["runs"], runs)
        for line in diff:
            print(line)
        print(f"{len(runs)} runs, {len(diff)} differences")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
