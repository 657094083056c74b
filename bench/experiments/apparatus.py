"""Does training on the load generator's CPU change the p99 it measures? The measuring
apparatus, not the system under test.

    python bench/experiments/apparatus.py --json OUT [--rounds 2] [--duration 45] [--rate 60]

The real inference server (``--model``, 1-core quota, pinned to the last CPU, dynamic
batching as deployed) under open-loop Poisson load from the load generator as deployed (its
own cgroup, pinned to CPU 0). Per round, three conditions side by side:

* ``alone`` — nothing else on CPU 0 (as the serving calibration measures);
* ``training`` — a PyTorch training loop (``resnet_narrow``, batch 32, one thread) in its
  own cgroup on CPU 0, one step every ``--step-period`` s: the burst pattern of the
  local scenario's network-bound PS worker (about one step of 32 samples per second);
* ``training+weight`` — the same, with the load generator's cgroup at
  ``LOAD_CPU_WEIGHT`` (what the local backend and the serving calibration give it).

Metrics per run: ``p50_ms``, ``p99_ms``, ``mean_ms`` and ``requests`` as the load generator
measured them; from the server's own metrics (``/metrics``, before and after): the ONNX
Runtime time per batch (``server_run_ms_per_batch``) and per sample, the mean batch, the
mean latency inside the server (``server_latency_ms``: queue, batch, run); and
``training_cpu_s``. What the server sees tells the two effects apart: training slowing the
model on the server's CPU (shared caches, memory, a host's SMT sibling) raises the run time;
training delaying the load generator raises only what the client measures. Ratios: per
round, the p99 of each training condition over ``alone``. Needs root and writable cgroups.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

CONDITIONS = ("alone", "training", "training+weight")
console = Console(stderr=True)


def burn(period_s: float) -> None:
    """One training step every ``period_s`` seconds, forever (the child side)."""
    import torch

    from reamer.workloads.real.nets import build_model, synthetic_batch

    torch.set_num_threads(1)
    model, (x, y) = build_model("resnet_narrow"), synthetic_batch(32, 0)
    opt, loss = torch.optim.SGD(model.parameters(), lr=0.01), torch.nn.CrossEntropyLoss()
    while True:
        t = time.perf_counter()
        opt.zero_grad()
        loss(model(x), y).backward()
        opt.step()
        time.sleep(max(0.0, period_s - (time.perf_counter() - t)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=45.0, help="seconds of load per condition")
    ap.add_argument("--rate", type=float, default=60.0, help="requests/s")
    ap.add_argument("--model", default="vgg_cifar")
    ap.add_argument("--step-period", type=float, default=1.0, help="seconds between training steps")
    ap.add_argument("--burn", type=float, default=None, help=argparse.SUPPRESS)  # child mode
    a = ap.parse_args()
    if a.burn is not None:
        burn(a.burn)
        return 0

    from reamer.backends.local.inference import LOAD_CPU_WEIGHT, LOAD_MAX_INFLIGHT, LOADGEN_MODULE
    from reamer.backends.local.procs import Proc
    from reamer.calibration.worker import open_cgroups
    from reamer.reports.results import document, run_entry, write_json
    from reamer.workloads.real.serving_metrics import fetch_metrics, served_stats

    ex, reason = open_cgroups()
    if ex is None:
        print(f"apparatus: skipped: {reason}", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) < 2:
        print("apparatus: skipped: needs 2 CPUs (the server's and the load generator's)", file=sys.stderr)
        return 2
    last = (os.cpu_count() or 2) - 1
    runs, ratios = [], {}
    try:
        with tempfile.TemporaryDirectory(prefix="reamer-apparatus-") as tmp:
            log = Path(tmp)
            ex.create("srv")
            ex.set_cpu("srv", 1.0)
            ex.set_cpuset("srv", [last])
            srv = Proc([sys.executable, "-m", "reamer.workloads.real.inference_server", "--model", a.model,
                        "--max-batch", "8", "--max-wait-ms", "0"], cgroup="srv", executor=ex, log=log / "srv.log")
            port = int(srv.wait_for("listening", 180)["port"])
            with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TimeElapsedColumn(), console=console) as progress:  # fmt: skip
                task = progress.add_task("apparatus", total=a.rounds * len(CONDITIONS))
                for rnd in range(1, a.rounds + 1):
                    p99 = {}
                    for k, cond in enumerate(CONDITIONS):
                        progress.update(task, description=f"round {rnd}: {cond}")
                        tr, cg_t, cg_l = None, f"train{rnd}.{k}", f"load{rnd}.{k}"
                        if cond != "alone":
                            ex.create(cg_t)
                            ex.set_cpu(cg_t, 1.0)
                            ex.set_cpuset(cg_t, [0])
                            tr = Proc([sys.executable, __file__, "--json", "-", "--burn", f"{a.step_period:g}"],
                                      cgroup=cg_t, executor=ex, log=log / "train.log")
                            time.sleep(8)  # torch imported, steps under way
                        ex.create(cg_l)
                        ex.set_cpuset(cg_l, [0])
                        if cond == "training+weight":
                            ex.set_cpu_weight(cg_l, LOAD_CPU_WEIGHT)
                        m0 = fetch_metrics(port)
                        gen = Proc([sys.executable, "-m", LOADGEN_MODULE, "--url", f"http://127.0.0.1:{port}/infer",
                                    "--rate", f"{a.rate:g}", "--duration", f"{a.duration:g}", "--seed", str(rnd),
                                    "--max-inflight", str(LOAD_MAX_INFLIGHT)],
                                   cgroup=cg_l, executor=ex, log=log / "load.log")
                        try:
                            rep = gen.wait_for("done", a.duration + 120)
                        finally:
                            gen.kill()
                            gen.close()
                        st = served_stats(fetch_metrics(port), m0)
                        server = {f"server_{k}": st[k] for k in ("run_ms_per_batch", "run_ms_per_sample",
                                                                 "batch_mean", "latency_ms")}
                        train_s = 0.0
                        if tr is not None:
                            train_s = ex.read_stats(cg_t).usage_s
                            tr.kill()
                            ex.remove(cg_t, kill=True)
                        ex.remove(cg_l, kill=True)
                        q = rep["latency_ms"]
                        p99[cond] = q["p99"]
                        runs.append(run_entry("apparatus", rnd, cond, {"p50_ms": q["p50"], "p99_ms": q["p99"],
                                                                       "mean_ms": q["mean"], "requests": float(rep["ok"]),
                                                                       "training_cpu_s": train_s, **server},
                                              {"round": rnd, "model": a.model, "rate_per_s": a.rate,
                                               "duration_s": a.duration, "step_period_s": a.step_period,
                                               "load_cpu_weight": LOAD_CPU_WEIGHT if cond == "training+weight" else 100}))
                        console.print(f"round {rnd} {cond}: p50 {q['p50']} ms, p99 {q['p99']} ms, mean {q['mean']} ms; "
                                      f"server: run {server['server_run_ms_per_batch']:.2f} ms/batch of "
                                      f"{server['server_batch_mean']:.2f}, latency {server['server_latency_ms']:.2f} ms; "
                                      f"training {train_s:.1f} CPU-s", highlight=False)
                        progress.advance(task)
                    for cond in CONDITIONS[1:]:
                        ratios[f"p99_{cond.replace('+', '_')}_over_alone_r{rnd}"] = p99[cond] / p99["alone"]
            srv.kill()
    finally:
        ex.sweep()
    write_json(a.json, document("apparatus", runs, ratios))
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    return 0


if __name__ == "__main__":
    from reamer.backends.local.session import sigterm_as_interrupt

    with sigterm_as_interrupt():  # SIGTERM, like Ctrl-C, still removes the cgroups (the sweep in main)
        sys.exit(main())
