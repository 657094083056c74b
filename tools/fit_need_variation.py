"""Fit the time variation of GPU jobs' CPU need to Alibaba PAI's mini-batch times.

    python tools/fit_need_variation.py [--data ../shared/data/pai2020_minibatch] [--out src/reamer/data/need_variation.json]

Input: ``job_N_norm.csv`` of cluster-trace-gpu-v2020/mini-batch-time (Xiao et al., "AntMan",
OSDI 2020): per worker of 4 distributed PAI jobs, its mini-batch time every 10 iterations,
normalised to 0-1000. Per worker series (40 of them) the fit keeps the two parameters of a
log-normal AR(1) process (:class:`reamer.workloads.need.Ar1`): the log standard deviation at
which the process has the series' coefficient of variation, ``√ln(1 + CoV²)`` (a series with
stragglers is skewed: the standard deviation of its log would give a smaller CoV), and the
lag-1 autocorrelation of its log; and the series' CoV and largest value over its mean, which
the generator is tested against. Writes
derived statistics only, never trace rows.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = ("Alibaba cluster-trace-gpu-v2020 mini-batch-time (Xiao et al., AntMan, OSDI 2020): job_1..4_norm.csv, "
          "one series per worker, a sample every 10 iterations; fit by tools/fit_need_variation.py")


def series(folder: Path) -> list[tuple[str, list[float]]]:
    """(``job_N/wK``, the worker's normalised mini-batch times in iteration order) per worker."""
    out = []
    for path in sorted(folder.glob("job_*_norm.csv")):
        by: dict[int, list[tuple[int, float]]] = {}
        with path.open() as f:
            for r in csv.DictReader(f):
                by.setdefault(int(r["worker"]), []).append((int(r["time"]), float(r["batch_time_norm"])))
        for w, rows in sorted(by.items()):
            rows.sort()
            out.append((f"{path.stem.removesuffix('_norm')}/w{w}", [b for _, b in rows]))
    return out


def fit(x: list[float]) -> dict[str, float]:
    """Log-normal AR(1) parameters of one series, and the statistics a generator must match."""
    logs = [math.log(v) for v in x]
    m = statistics.fmean(logs)
    dev = [v - m for v in logs]
    var = sum(d * d for d in dev)
    rho = sum(a * b for a, b in itertools.pairwise(dev)) / var if var > 0 else 0.0
    mean = statistics.fmean(x)
    cov = statistics.pstdev(x) / mean
    return {"sd_log": math.sqrt(math.log1p(cov * cov)), "corr": min(max(rho, 0.0), 0.999),
            "cov": cov, "max_over_mean": max(x) / mean, "samples": len(x)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "pai2020_minibatch")
    ap.add_argument("--out", type=Path, default=REPO / "src" / "reamer" / "data" / "need_variation.json")
    a = ap.parse_args()
    rows = series(a.data)
    if not rows:
        raise SystemExit(f"error: {a.data}: no job_*_norm.csv files (expected cluster-trace-gpu-v2020 mini-batch-time)")
    doc = {"source": SOURCE, "step": "one sample per 10 iterations",
           "series": [{"id": sid, **{k: round(v, 6) if isinstance(v, float) else v for k, v in fit(x).items()}}
                      for sid, x in rows]}
    rows_json = ",\n".join("  " + json.dumps(r) for r in doc["series"])
    a.out.write_text(f'{{"source": {json.dumps(doc["source"])},\n "step": {json.dumps(doc["step"])},\n'
                     f' "series": [\n{rows_json}\n ]}}\n')  # a series per line
    covs = [s["cov"] for s in doc["series"]]
    print(f"{len(rows)} series -> {a.out}: CoV median {statistics.median(covs):.3f}, mean {statistics.fmean(covs):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
