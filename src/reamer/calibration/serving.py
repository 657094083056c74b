"""The serving path around the model: what a request costs in the real inference server
besides the ONNX Runtime run, measured through the server (and the router) as deployed.

The server (:mod:`reamer.workloads.real.inference_server`, ``max_batch`` 1) runs in a cgroup
with a 1-core quota pinned to the last CPU; requests go one at a time (a new connection
each, as the load generator sends them) through a :class:`~reamer.workloads.real.router.Router`.
With one request in flight, its latency is the server's CPU time for it plus a delay outside
that CPU (loopback, router, client stack):

* ``delay_ms``   = mean latency − server CPU per request — a fixed delay per request.

Then, under open-loop Poisson load at about half the replica's capacity (dynamic batching on,
``max_batch`` as deployed), the serving path's CPU per request as it is when requests overlap
(handler threads, the interpreter lock, the batcher):

* ``request_ms`` = (server CPU − the model's CPU by the ``inference`` fit at the batch sizes
  the server ran, from its ``reamer_infer_batch_size`` metric) ÷ requests — it occupies the
  replica's cores like the model does. The one-at-a-time value is kept in ``serving``.
"""

from __future__ import annotations

import http.client
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from reamer.backends.local.cgroups import CgroupExecutor
from reamer.backends.local.procs import Proc


def measure(ex: CgroupExecutor, name: str, entry: dict, nproc: int, n: int, tmp: Path,
            tick: Callable[[], None], max_batch: int = 8, load_s: float = 10.0) -> dict:  # fmt: skip
    from reamer.workloads.real import loadgen
    from reamer.workloads.real.inference_server import parse_prometheus
    from reamer.workloads.real.router import Router

    cg = f"serve-{name}"
    ex.create(cg)
    ex.set_cpu(cg, 1.0)
    if nproc >= 2:
        ex.set_cpuset(cg, [nproc - 1])
    router = Router()
    p = Proc([sys.executable, "-m", "reamer.workloads.real.inference_server", "--model", name, "--max-batch",
              str(max_batch), "--max-wait-ms", "0"], cgroup=cg, executor=ex, log=tmp / f"{cg}.log")
    try:
        port = int(p.wait_for("listening", 180)["port"])
        router.start()
        router.set_backends([("127.0.0.1", port, 1.0)])
        host, rport = router.server_address[:2]
        body = loadgen.default_payload(0)

        def one() -> float:
            t = time.perf_counter()
            c = http.client.HTTPConnection(host, rport, timeout=30)
            try:
                c.request("POST", "/infer", body=body, headers={"Content-Type": "application/octet-stream"})
                r = c.getresponse()
                r.read()
                if r.status != 200:
                    raise RuntimeError(f"inference server ({name}) answered {r.status}")
            finally:
                c.close()
            return time.perf_counter() - t

        def metrics() -> dict[str, float]:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                c.request("GET", "/metrics")
                return parse_prometheus(c.getresponse().read().decode())
            finally:
                c.close()

        for _ in range(max(10, n // 10)):  # warm-up
            one()
        st0 = ex.read_stats(cg)
        lat = [one() for _ in range(n)]
        cpu = (ex.read_stats(cg).usage_s - st0.usage_s) / n
        # under load: half the one-at-a-time capacity, open loop
        rate = 0.5 / cpu
        m0, c0 = metrics(), ex.read_stats(cg).usage_s
        rep = loadgen.run_load(router.url, rates=[rate], duration_s=load_s, seed=1, payload=body)
        m1, c1 = metrics(), ex.read_stats(cg).usage_s
        done = rep["ok"]
        run_s = m1.get("reamer_infer_run_seconds_sum", 0.0) - m0.get("reamer_infer_run_seconds_sum", 0.0)
        batches = m1.get("reamer_infer_batch_size_count", 0.0) - m0.get("reamer_infer_batch_size_count", 0.0)
        model_cpu = (entry["a_ms"] * batches + entry["b_ms"] * done) / 1e3  # the fit, at the batches served
        loaded = max(0.0, (c1 - c0) - model_cpu) / max(1, done)
    finally:
        p.kill()
        router.server_close()
        ex.remove(cg, kill=True)
    tick()
    model_s = (entry["a_ms"] + entry["b_ms"]) / 1e3  # batch 1 at one core (E(1) = 1)
    mean = statistics.fmean(lat)
    return {"request_ms": round(loaded * 1e3, 4), "delay_ms": round(max(0.0, mean - cpu) * 1e3, 4),
            "serving": {"requests": n, "server_cpu_ms_per_request": round(cpu * 1e3, 4),
                        "one_at_a_time_request_ms": round(max(0.0, cpu - model_s) * 1e3, 4),
                        "load_rate_per_s": round(rate, 3), "load_requests": done,
                        "load_mean_batch": round(done / batches, 3) if batches else None,
                        "load_p99_ms": rep["latency_ms"]["p99"],
                        "load_run_ms_per_request": round(run_s / max(1, done) * 1e3, 4),
                        "latency_ms_mean": round(mean * 1e3, 4), "latency_ms_p50": round(float(np.median(lat)) * 1e3, 4),
                        "model_batch1_ms": round(model_s * 1e3, 4)}}
