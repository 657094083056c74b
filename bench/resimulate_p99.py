"""Re-simulate the inference p99 of stored ``sim_vs_real`` runs, two ways side by side:

    python bench/resimulate_p99.py --json OUT --rate 60 docs/data/sim_vs_real_run2*.json ...

* ``seeded`` — the method of those runs: the serving path fitted on a seeded Poisson sample
  per calibration load, the replica fed a seeded numpy sample of the run's rate trace;
* ``replayed`` — the method ``sim_vs_real`` uses now: both fed the very arrival times the
  load generator sent (``loadgen.schedule_of``). Calibrations stored before ``load_args``
  existed get theirs rebuilt from the record (rate to 3 decimals, the load's duration rounded
  from requests ÷ rate, seed 1, as ``calibration.serving`` sent them).

No real run: it reads each file's two calibrations and its measured p99. ``--rate`` and
``--scenario`` must be the ones the runs had (the embedded local scenario, one rate in every
window). Per run: ``real_p99_ms``, ``stored_sim_p99_ms``, ``seeded_sim_p99_ms`` (the check
that the old method is reproduced), ``replayed_sim_p99_ms`` and both errors, signed
(sim − real) / real; ``valid`` = the run passed sim_vs_real's rules (steal ≤ 0.1 %, drift ≤ 15 %).
``--group K`` (3) also judges the valid attempts in consecutive groups of K, in the order the
files are given, as ``sim_vs_real --trials K`` does (mean simulated against mean real p99):
ratios ``replayed_groups_of_K``, ``..._within_15pct_share``, ``..._max_abs_error_pct``.
These files hold one attempt each (``sim_vs_real`` before ``--trials``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from sim_vs_real import MAX_DRIFT, MAX_STEAL_PCT, console, with_service  # the bench's own fit and rules

from reamer.backends.local.inference import load_schedule_args
from reamer.backends.local.session import local_services
from reamer.calibration.serving import load_args
from reamer.config.local import load_local
from reamer.errors import InputError
from reamer.models.inference import arrivals_for_rates, simulate_replica
from reamer.models.profiles import load_profiles
from reamer.reports.results import document, run_entry, write_json
from reamer.workloads.real.loadgen import schedule_of


def _with_load_args(entry: dict) -> dict:
    loads = [x if "load_args" in x else {**x, "load_args": load_args(x["rate_per_s"],
                                                                     round(x["requests"] / x["rate_per_s"] / 5) * 5)}
             for x in entry["serving"]["loads"]]
    return {**entry, "serving": {**entry["serving"], "loads": loads}}


def _without_load_args(entry: dict) -> dict:
    loads = [{k: v for k, v in x.items() if k != "load_args"} for x in entry["serving"]["loads"]]
    return {**entry, "serving": {**entry["serving"], "loads": loads}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--rate", type=float, required=True, help="the runs' --rate")
    ap.add_argument("--scenario", type=Path, default=None, help="the runs' local scenario (default: the embedded one)")
    ap.add_argument("--group", type=int, default=3,
                    help="also judge the valid attempts in consecutive groups of this many (file order), as "
                         "sim_vs_real --trials does: mean simulated p99 against mean real p99")
    ap.add_argument("files", nargs="+", type=Path)
    a = ap.parse_args()
    sc = load_local(a.scenario)
    svc = local_services(sc)[0]
    svc = dataclasses.replace(svc, rates=tuple([a.rate] * len(svc.rates)))  # as sim_vs_real --rate
    base = load_profiles(None)
    runs, signed = [], {"seeded": [], "replayed": []}
    pairs: list[tuple[float, float]] = []  # valid attempts: (real, replayed sim) p99
    for f in a.files:
        try:
            r = json.loads(f.read_text())["runs"][0]
            m, p, cal = r["metrics"], r["params"], r["calibrations"]
            entries, real = [cal["before"], cal["after"]], float(m["real_p99_ms"])
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise SystemExit(f"resimulate_p99: {f}: expected a sim_vs_real result with both calibrations ({e!r})")
        batch, cores = int(p["max_batch"]), float(p["replica_cores"])
        out = {"real_p99_ms": real, "stored_sim_p99_ms": float(m["sim_p99_ms"])}
        for how, fix, arr in (
            ("seeded", _without_load_args, arrivals_for_rates(svc.rates, svc.window_s, np.random.default_rng(sc.seed))),
            ("replayed", _with_load_args, np.asarray(schedule_of(load_schedule_args(svc, sc.seed)))),
        ):
            prof = with_service(base, svc.model, [fix(e) for e in entries], batch).inference[svc.model]
            sim = float(np.percentile(simulate_replica(arr, prof, cores, batch, float(p["max_wait_ms"]) / 1e3), 99)) * 1e3
            out[f"{how}_sim_p99_ms"] = sim
            out[f"{how}_signed_error_pct"] = 100.0 * (sim - real) / real
        valid = m.get("cpu_steal_pct", 100.0) <= MAX_STEAL_PCT and m.get("calib_drift_pct", 100.0) <= 100.0 * MAX_DRIFT
        out["valid"] = 1.0 if valid else 0.0
        if valid:
            for how in signed:
                signed[how].append(out[f"{how}_signed_error_pct"])
            pairs.append((real, out["replayed_sim_p99_ms"]))
        runs.append(run_entry(sc.name, sc.seed, "resimulated", out, {"file": f.name}))
        console.print(f"{f.name}: real {real:.1f} ms, seeded {out['seeded_sim_p99_ms']:.1f} "
                      f"({out['seeded_signed_error_pct']:+.1f} %), replayed {out['replayed_sim_p99_ms']:.1f} "
                      f"({out['replayed_signed_error_pct']:+.1f} %){'' if valid else ' (invalid attempt)'}", highlight=False)
    ratios = {}
    for how, v in signed.items():
        if v:
            ratios[f"{how}_mean_signed_error_pct_valid"] = statistics.fmean(v)
            ratios[f"{how}_within_15pct_share_valid"] = sum(abs(x) <= 15.0 for x in v) / len(v)
    k = a.group
    groups = [pairs[i:i + k] for i in range(0, len(pairs) - k + 1, k)]  # a last, incomplete group is left out
    if k > 1 and groups:
        errs = [100.0 * (statistics.fmean(s for _, s in g) - statistics.fmean(r for r, _ in g))
                / statistics.fmean(r for r, _ in g) for g in groups]
        console.print(f"replayed, valid attempts in groups of {k}: signed errors of the means "
                      f"{[round(e, 1) for e in errs]} %", highlight=False)
        ratios[f"replayed_groups_of_{k}"] = float(len(groups))
        ratios[f"replayed_groups_of_{k}_within_15pct_share"] = sum(abs(e) <= 15.0 for e in errs) / len(errs)
        ratios[f"replayed_groups_of_{k}_max_abs_error_pct"] = max(abs(e) for e in errs)
    write_json(a.json, document("resimulate_p99", runs, ratios))
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as e:
        raise SystemExit(f"resimulate_p99: {e}") from None
