"""A PS job over tc-limited links, 1 and 2 PS shards, with two link queues side by side:
does the testbed's link behave like the speed model's (a NIC of the given rate)?

    python bench/experiments/ps_links.py --json OUT [--mbit 5] [--steps 60] [--rounds 2]

Real processes and TCP (``reamer.workloads.real.ps_training``, ``resnet_narrow``, batch 32,
one thread each) on three testbed hosts: the worker on an unlimited link, each PS shard on a
host whose link is limited to ``--mbit`` (``Testbed.set_bandwidth``). Two queues for the
limited links:

* ``nic``  — ``netns.QUEUE_BYTES`` (a NIC's default qdisc: 1000 full-size frames), the default;
* ``50ms`` — 50 ms of traffic plus the bucket (31,250 + 16,384 bytes at 5 Mbit/s), a
  queue sized by time, for comparison.

A worker's push reaches a PS host's link at veth speed, so the switch-side queue takes the
whole burst. Per (queue, shards, round): the worker's own telemetry (samples/s, network and
compute seconds per step) and the TCP counters of the three hosts over the run
(``nstat``: retransmitted segments, retransmission timeouts). ``model_samples_per_s``: the
speed model (``models.training.step``, shipped profile) for the same job. Ratios:
``speedup_2ps_<queue>`` (2 shards over 1, mean over rounds; the model's is
``speedup_2ps_model``) and ``real_over_model_<queue>_<shards>ps``. Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from rich.progress import Progress

from reamer.backends.local.netns import QUEUE_BYTES, Testbed, bucket_bytes, sweep
from reamer.backends.local.session import sigterm_as_interrupt
from reamer.models.profiles import load_profiles
from reamer.models.training import Side, step
from reamer.reports.results import document, run_entry, write_json

MODEL, BATCH, PORT = "resnet_narrow", 32, 7000
PREFIX = "rmpl"  # own prefix: the start-up sweep touches nothing else
COUNTERS = ("TcpRetransSegs", "TcpExtTCPTimeouts")


def queues(mbit: float) -> dict[str, int]:
    return {"nic": QUEUE_BYTES, "50ms": int(mbit * 1e6 / 8 * 0.050) + bucket_bytes(mbit)}


def tcp_counters(tb: Testbed, host: int) -> dict[str, int]:
    out = subprocess.run(tb.exec_argv(host, ["nstat", "-az", *COUNTERS]), capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return {f[0]: int(f[1]) for f in (line.split() for line in out.splitlines()) if f and f[0] in COUNTERS}


def run_job(shards: int, queue_bytes: int, mbit: float, steps: int) -> dict[str, float]:
    module = [sys.executable, "-m", "reamer.workloads.real.ps_training"]
    with Testbed(1 + shards, prefix=PREFIX) as tb:
        for k in range(shards):
            tb.set_bandwidth(1 + k, mbit, queue_bytes=queue_bytes)
        ps = [subprocess.Popen(tb.exec_argv(1 + k, [*module, "ps", "--host", tb.ip(1 + k), "--port", str(PORT),
                                                     "--shard", str(k), "--shards", str(shards), "--model", MODEL,
                                                     "--threads", "1"]),
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for k in range(shards)]
        try:
            for p in ps:
                p.stdout.readline()  # its first line: the thread sizing, once it is up
            before = [tcp_counters(tb, h) for h in range(1 + shards)]
            addrs = ",".join(f"{tb.ip(1 + k)}:{PORT}" for k in range(shards))
            w = subprocess.run(tb.exec_argv(0, [*module, "worker", "--ps", addrs, "--model", MODEL, "--batch", str(BATCH),
                                                "--steps", str(steps), "--threads", "1", "--report-every", "0",
                                                "--connect-timeout", "60"]),
                               capture_output=True, text=True, timeout=600)
            if w.returncode != 0:
                raise SystemExit(f"ps_links: the worker failed: {w.stderr.strip().splitlines()[-1:]}")
            after = [tcp_counters(tb, h) for h in range(1 + shards)]
        finally:
            for p in ps:
                p.terminate()
                p.wait(timeout=30)
    done = [json.loads(x) for x in w.stdout.splitlines() if x.startswith("{") and '"done"' in x][-1]
    m = {k: float(done[k]) for k in ("samples_per_s", "comm_s", "compute_s")}
    for c in COUNTERS:
        m[c] = float(sum(a.get(c, 0) - b.get(c, 0) for a, b in zip(after, before, strict=True)))
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--mbit", type=float, default=5.0, help="the PS hosts' link (default: the local scenario's 5)")
    ap.add_argument("--steps", type=int, default=60, help="steps with 1 shard (2 shards run twice as many)")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("ps_links: skipped: needs root to create network namespaces", file=sys.stderr)
        return 2
    sweep(PREFIX)
    prof = load_profiles(None)
    model = {k: step(prof.models[MODEL], prof.calibration, BATCH, [Side(1.0, 10.0, threads=1)],
                     [Side(1.0, a.mbit / 1e3, threads=1)] * k).speed for k in (1, 2)}
    runs, speeds = [], {}
    plan = [(q, qb, k, r) for r in range(a.rounds) for q, qb in queues(a.mbit).items() for k in (1, 2)]
    with Progress(transient=True) as bar:
        task = bar.add_task("PS job over limited links", total=len(plan))
        for q, qb, k, r in plan:  # queues and shard counts interleaved: drift hits them alike
            m = run_job(k, qb, a.mbit, a.steps * k)
            m["model_samples_per_s"] = model[k]
            speeds.setdefault((q, k), []).append(m["samples_per_s"])
            runs.append(run_entry("ps_links", r, q, m, {"shards": k, "queue_bytes": qb, "mbit": a.mbit, "round": r}))
            bar.console.print(f"{q:5s} {k} PS round {r}: {m['samples_per_s']:.1f} samples/s (model {model[k]:.1f}), "
                              f"network {m['comm_s']:.3f} s/step, {m['TcpRetransSegs']:.0f} retransmitted segments, "
                              f"{m['TcpExtTCPTimeouts']:.0f} timeouts", highlight=False)
            bar.advance(task)
    ratios = {"speedup_2ps_model": model[2] / model[1]}
    for q in queues(a.mbit):
        ratios[f"speedup_2ps_{q}"] = statistics.fmean(speeds[(q, 2)]) / statistics.fmean(speeds[(q, 1)])
        for k in (1, 2):
            ratios[f"real_over_model_{q}_{k}ps"] = statistics.fmean(speeds[(q, k)]) / model[k]
    write_json(a.json, document("ps_links", runs, ratios))
    print(json.dumps(ratios, indent=1))
    return 0


if __name__ == "__main__":
    with sigterm_as_interrupt():  # SIGTERM, like Ctrl-C, unwinds: the testbed's namespaces go
        sys.exit(main())
