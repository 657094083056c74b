"""ONNX Runtime HTTP inference server with dynamic batching and Prometheus metrics.

    python -m reamer.workloads.real.inference_server --host 127.0.0.1 --port 0 \\
        --model small_cnn --max-batch 16 --max-wait-ms 5

At start the model (a PyTorch definition from :mod:`reamer.workloads.real.nets`) is
exported to ONNX in a temporary directory (dynamic batch axis) and loaded into an
ONNX Runtime session whose intra-op threads are sized to the container
(:func:`reamer.backends.local.launcher.ort_session_options`).

Endpoints (stdlib ``ThreadingHTTPServer``, one thread per connection):

- ``POST /infer``: body ``application/octet-stream`` = ``n`` samples of raw little-endian
  float32, ``n * 3*32*32`` values; or ``application/json`` ``{"inputs": [[...3072 floats], ...]}``.
  Answers JSON ``{"outputs": [[10 logits], ...], "argmax": [...], "batch": B}`` where B is
  the size of the batch the request ran in.
- ``GET /metrics``: Prometheus text format (requests, latency and batch-size histograms).
- ``GET /healthz``: ``ok``.

Requests queue for a single batcher thread: it takes the first waiting request, then
keeps collecting until ``max_batch`` samples or ``max_wait_ms`` after the first arrived,
runs one ``session.run`` and hands every request its slice.

On start it prints one JSON line ``{"event": "listening", "port": ...}`` on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

F32 = np.dtype("<f4")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
MAX_BODY = 64 * 1024 * 1024


# --------------------------------------------------------------------------- metrics
class Histogram:
    """A Prometheus-style cumulative histogram (thread-safe)."""

    def __init__(self, buckets: Sequence[float]):
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * len(self.buckets)
        self.count = 0
        self.sum = 0.0
        self.lock = threading.Lock()

    def observe(self, v: float) -> None:
        with self.lock:
            self.count += 1
            self.sum += v
            for i, b in enumerate(self.buckets):
                if v <= b:
                    self.counts[i] += 1

    def snapshot(self) -> tuple[list[tuple[float, int]], int, float]:
        with self.lock:
            return list(zip(self.buckets, self.counts, strict=True)), self.count, self.sum


def _fmt(v: float) -> str:
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return str(int(v))
    return repr(float(v))


def render_histogram(name: str, help_text: str, hist: Histogram) -> list[str]:
    buckets, count, total = hist.snapshot()
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{_fmt(b)}"}} {c}' for b, c in buckets]
    lines += [f'{name}_bucket{{le="+Inf"}} {count}', f"{name}_sum {_fmt(total)}", f"{name}_count {count}"]
    return lines


def parse_prometheus(text: str) -> dict[str, float]:
    """``{"name{labels}": value}`` for every sample line (enough for tests and probes)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out


def fetch_metrics(port: int, host: str = "127.0.0.1", timeout_s: float = 10.0) -> dict[str, float]:
    """A running server's ``/metrics``, parsed (:func:`parse_prometheus`)."""
    import urllib.request

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as r:
        return parse_prometheus(r.read().decode())


def served_stats(after: dict[str, float], before: dict[str, float] | None = None) -> dict[str, float]:
    """What the server measured itself between two :func:`fetch_metrics` (or since its start):
    ONNX Runtime ms per batch and per sample, mean batch, mean latency inside the server (ms)."""
    d = {k: after.get(f"reamer_infer_{k}", 0.0) - (before or {}).get(f"reamer_infer_{k}", 0.0)
         for k in ("run_seconds_sum", "run_seconds_count", "samples_total", "request_latency_seconds_sum",
                   "request_latency_seconds_count")}
    batches = max(1.0, d["run_seconds_count"])
    return {"run_ms_per_batch": 1e3 * d["run_seconds_sum"] / batches,
            "run_ms_per_sample": 1e3 * d["run_seconds_sum"] / max(1.0, d["samples_total"]),
            "batch_mean": d["samples_total"] / batches, "batches": d["run_seconds_count"],
            "latency_ms": 1e3 * d["request_latency_seconds_sum"] / max(1.0, d["request_latency_seconds_count"])}


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch = Histogram(BATCH_BUCKETS)
        self.infer_s = Histogram(LATENCY_BUCKETS)
        self.samples = 0
        self.queue_depth = 0

    def count(self, code: int) -> None:
        with self.lock:
            self.requests[str(code)] = self.requests.get(str(code), 0) + 1

    def render(self, threads: int, max_batch: int, max_wait_ms: float) -> str:
        with self.lock:
            reqs = dict(self.requests)
            samples, depth = self.samples, self.queue_depth
        lines = ["# HELP reamer_infer_requests_total Inference requests by HTTP status code.",
                 "# TYPE reamer_infer_requests_total counter"]
        lines += [f'reamer_infer_requests_total{{code="{c}"}} {n}' for c, n in sorted(reqs.items())] or [
            'reamer_infer_requests_total{code="200"} 0'
        ]
        lines += ["# HELP reamer_infer_samples_total Samples inferred.", "# TYPE reamer_infer_samples_total counter",
                  f"reamer_infer_samples_total {samples}"]
        lines += render_histogram("reamer_infer_request_latency_seconds",
                                  "Time from request body read to response ready (queue + batch + run).", self.latency)
        lines += render_histogram("reamer_infer_batch_size", "Samples per executed batch.", self.batch)
        lines += render_histogram("reamer_infer_run_seconds", "ONNX Runtime session.run time per batch.", self.infer_s)
        lines += ["# HELP reamer_infer_queue_depth Requests waiting for the batcher.",
                  "# TYPE reamer_infer_queue_depth gauge", f"reamer_infer_queue_depth {depth}",
                  "# HELP reamer_infer_threads ONNX Runtime intra-op threads.", "# TYPE reamer_infer_threads gauge",
                  f"reamer_infer_threads {threads}",
                  "# HELP reamer_infer_max_batch Dynamic batching: most samples per batch.",
                  "# TYPE reamer_infer_max_batch gauge", f"reamer_infer_max_batch {max_batch}",
                  "# HELP reamer_infer_max_wait_seconds Dynamic batching: longest wait for a batch to fill.",
                  "# TYPE reamer_infer_max_wait_seconds gauge", f"reamer_infer_max_wait_seconds {_fmt(max_wait_ms / 1e3)}"]
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- model
def export_onnx(model_name: str, path: Path, seed: int = 0, opset: int = 17) -> Path:
    """Export ``model_name`` (eval mode) to ``path`` with a dynamic batch axis."""
    import torch

    from reamer.workloads.real.nets import INPUT_SHAPE, build_model

    model = build_model(model_name, seed).eval()
    dummy = torch.zeros((1, *INPUT_SHAPE))
    with warnings.catch_warnings():  # the TorchScript exporter (dynamo=False) is deprecated, on purpose here
        warnings.simplefilter("ignore")  # incl. TracerWarnings from GroupNorm tracing
        _export(torch, model, dummy, path, opset)
    return path


def _export(torch: Any, model: Any, dummy: Any, path: Path, opset: int) -> None:
    torch.onnx.export(
        model, (dummy,), str(path), input_names=["input"], output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=opset, dynamo=False,
    )


class _Pending:
    __slots__ = ("x", "done", "out", "batch", "error")

    def __init__(self, x: np.ndarray):
        self.x = x
        self.done = threading.Event()
        self.out: np.ndarray | None = None
        self.batch = 0
        self.error: str | None = None


class Batcher:
    """Dynamic batching in front of one ONNX Runtime session."""

    def __init__(self, session: Any, metrics: Metrics, max_batch: int, max_wait_ms: float):
        if max_batch < 1:
            raise ValueError(f"max_batch: expected >= 1, got {max_batch!r}")
        self.session = session
        self.input_name = session.get_inputs()[0].name
        self.metrics = metrics
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1e3
        self.q: queue.Queue[_Pending | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self.stopping = False

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping = True
        self.q.put(None)
        self.thread.join(timeout=5.0)

    def submit(self, x: np.ndarray, timeout_s: float = 30.0) -> _Pending:
        p = _Pending(x)
        with self.metrics.lock:
            self.metrics.queue_depth += 1
        self.q.put(p)
        if not p.done.wait(timeout_s):
            p.error = "timed out waiting for the batcher"
        return p

    def _loop(self) -> None:
        carry: _Pending | None = None
        while True:
            first = carry if carry is not None else self.q.get()
            carry = None
            if first is None:
                return
            items = [first]
            n = len(first.x)
            deadline = time.monotonic() + self.max_wait_s
            while n < self.max_batch:
                left = deadline - time.monotonic()
                try:
                    nxt = self.q.get(timeout=left) if left > 0 else self.q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    carry = None
                    self.q.put(None)  # stop after this batch
                    break
                if n + len(nxt.x) > self.max_batch:
                    carry = nxt  # starts the next batch
                    break
                items.append(nxt)
                n += len(nxt.x)
            with self.metrics.lock:
                self.metrics.queue_depth -= len(items)
            self._run(items, n)

    def _run(self, items: list[_Pending], n: int) -> None:
        try:
            x = items[0].x if len(items) == 1 else np.concatenate([p.x for p in items])
            t0 = time.perf_counter()
            (out,) = self.session.run(None, {self.input_name: x})
            self.metrics.infer_s.observe(time.perf_counter() - t0)
            self.metrics.batch.observe(n)
            with self.metrics.lock:
                self.metrics.samples += n
            i = 0
            for p in items:
                k = len(p.x)
                p.out, p.batch = out[i : i + k], n
                i += k
        except Exception as e:  # noqa: BLE001 - reported to every waiting request
            for p in items:
                p.error = f"{type(e).__name__}: {e}"
        for p in items:
            p.done.set()


# --------------------------------------------------------------------------- HTTP
class InferenceServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], batcher: Batcher, metrics: Metrics, threads: int, sample_shape: tuple[int, ...]):
        super().__init__(addr, Handler)
        self.batcher = batcher
        self.metrics = metrics
        self.threads = threads
        self.sample_shape = sample_shape
        self.sample_len = math.prod(sample_shape)


class Handler(BaseHTTPRequestHandler):
    server: InferenceServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is too much
        pass

    def _reply(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: dict[str, Any]) -> None:
        if self.path.split("?")[0] == "/infer":
            self.server.metrics.count(code)
        self._reply(code, json.dumps(obj).encode(), "application/json")

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/metrics":
            b = self.server.batcher
            text = self.server.metrics.render(self.server.threads, b.max_batch, b.max_wait_s * 1e3)
            self._reply(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/healthz":
            self._reply(200, b"ok\n", "text/plain")
        else:
            self._reply(404, b"not found\n", "text/plain")

    def _read_input(self) -> np.ndarray:
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY:
            raise ValueError(f"Content-Length: expected 1..{MAX_BODY}, got {length}")
        body = self.rfile.read(length)
        ctype = (self.headers.get("Content-Type") or "application/octet-stream").split(";")[0].strip()
        per = self.server.sample_len
        if ctype == "application/json":
            obj = json.loads(body)
            rows = obj.get("inputs") if isinstance(obj, dict) else None
            if not isinstance(rows, list) or not rows:
                raise ValueError('expected {"inputs": [[floats], ...]}')
            x = np.asarray(rows, dtype=F32).reshape(len(rows), -1)
        else:
            if len(body) % (per * F32.itemsize):
                raise ValueError(f"body of {len(body)} bytes is not a whole number of {per}-float32 samples")
            x = np.frombuffer(body, dtype=F32).reshape(-1, per)
        if x.shape[1] != per:
            raise ValueError(f"each sample must have {per} values, got {x.shape[1]}")
        if len(x) > self.server.batcher.max_batch:
            raise ValueError(f"at most {self.server.batcher.max_batch} samples per request, got {len(x)}")
        if not np.isfinite(x).all():
            raise ValueError("inputs must be finite")
        return np.ascontiguousarray(x.reshape(len(x), *self.server.sample_shape).astype(np.float32, copy=False))

    def do_POST(self) -> None:
        if self.path.split("?")[0] != "/infer":
            self._reply(404, b"not found\n", "text/plain")
            return
        try:
            x = self._read_input()
        except (ValueError, json.JSONDecodeError) as e:
            self._json(400, {"error": str(e)})
            return
        t0 = time.perf_counter()
        p = self.server.batcher.submit(x)
        if p.error is not None or p.out is None:
            self._json(500, {"error": p.error or "no output"})
            return
        self.server.metrics.latency.observe(time.perf_counter() - t0)
        self._json(200, {"outputs": p.out.tolist(), "argmax": p.out.argmax(axis=1).tolist(), "batch": p.batch})


# --------------------------------------------------------------------------- start-up
def build_server(
    model: str = "small_cnn",
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_batch: int = 16,
    max_wait_ms: float = 5.0,
    threads: float | None = None,
    seed: int = 0,
    workdir: Path | None = None,
) -> InferenceServer:
    """Export, load and bind (not yet serving: call ``serve_forever``)."""
    import onnxruntime as ort

    from reamer.backends.local import launcher
    from reamer.workloads.real.nets import INPUT_SHAPE

    cores = float(threads) if threads else launcher.own_effective_cpus()
    for k, v in launcher.thread_env(cores).items():  # before torch loads (export only)
        os.environ.setdefault(k, v)
    opts = launcher.ort_session_options(cores)
    with tempfile.TemporaryDirectory(prefix="reamer-onnx-", dir=workdir) as tmp:
        path = export_onnx(model, Path(tmp) / f"{model}.onnx", seed)
        session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    metrics = Metrics()
    batcher = Batcher(session, metrics, max_batch, max_wait_ms)
    server = InferenceServer((host, port), batcher, metrics, opts.intra_op_num_threads, INPUT_SHAPE)
    batcher.start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    from reamer.workloads.real.nets import MODELS

    ap = argparse.ArgumentParser(prog="python -m reamer.workloads.real.inference_server",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (only this one)")
    ap.add_argument("--port", type=int, default=0, help="0 = any free port (printed in the 'listening' line)")
    ap.add_argument("--model", default="small_cnn", choices=sorted(MODELS))
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=float, default=None, help="override the container-derived core count")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    server = build_server(a.model, a.host, a.port, max_batch=a.max_batch, max_wait_ms=a.max_wait_ms,
                          threads=a.threads, seed=a.seed)

    def on_term(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    print(json.dumps({"event": "listening", "port": server.server_address[1], "model": a.model,
                      "threads": server.threads, "max_batch": a.max_batch, "max_wait_ms": a.max_wait_ms}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.batcher.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
