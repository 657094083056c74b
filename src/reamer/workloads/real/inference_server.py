"""ONNX Runtime HTTP inference server: dynamic batching, admission control, Prometheus metrics.

    python -m reamer.workloads.real.inference_server --host 127.0.0.1 --port 0 \\
        --model small_cnn --max-batch 16 --max-wait-ms 5 --deadline-ms 250

At start the model (a PyTorch definition from :mod:`reamer.workloads.real.nets`) is
exported to ONNX in a temporary directory (dynamic batch axis) and loaded into an
ONNX Runtime session whose intra-op threads are sized to the container
(:func:`reamer.backends.local.launcher.ort_session_options`), then warmed up.

HTTP: uvicorn (httptools protocol, uvloop) running a Starlette app on one event loop
thread, under ``SCHED_BATCH``; the session runs on the batcher thread
(:mod:`reamer.workloads.real.admission`: bounded queue, deadlines, shedding); the limits
uvicorn lacks (request-head deadline and size, timed body reads, the early 503) are in
:mod:`reamer.workloads.real.http_limits`. Endpoints:

- ``POST /infer``: body ``application/octet-stream`` = ``n`` samples of raw little-endian
  float32, ``n * 3*32*32`` values (also when no Content-Type is given); or
  ``application/json`` ``{"inputs": [[...3072 numbers], ...]}``; ``1 <= n <= max_batch``.
  Header ``X-Deadline-Ms``: the time the client still waits (default ``--deadline-ms``).
  Answers JSON ``{"outputs": [[10 logits], ...], "argmax": [...], "batch": B}`` where B is
  the size of the batch the request ran in, with ``Server-Timing: app;dur=MS`` (the time
  from its first byte to its answer).
- ``GET /metrics``: Prometheus text format (:mod:`reamer.workloads.real.serving_metrics`).
- ``GET /healthz``: ``ok``.

Every error is JSON ``{"error": "..."}``: 400 malformed (bad JSON or nesting, wrong sample
length, too many samples, non-finite values, empty body, bad ``X-Deadline-Ms``, not
HTTP/1.1), 404, 405, 408 (body not received within ``--body-timeout-s``), 413 (body over the
limit: Content-Length checked before reading, bytes counted while reading, chunked too), 415
(content type), 431 (request head over 16 KiB), 503 with ``Retry-After`` (shed: queue full,
expected completion past the deadline, deadline passing in the queue), 500 (the session
failed). Over ``--max-connections`` open connections uvicorn itself answers 503 (plain
text). A connection without a complete request head within ``--head-timeout-s`` is closed.
docs/inference_server.md has the limits, their defaults and what was measured.

On start it prints one JSON line ``{"event": "listening", "port": ...}`` on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import resource
import signal
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reamer.workloads.real.admission import Batcher, Failed, Served, Shed
from reamer.workloads.real.http_limits import (
    RECEIVED_AT,
    ClientDisconnect,
    RequestError,
    protocol_class,
    read_body,
)
from reamer.workloads.real.serving_metrics import CONTENT_TYPE, ServerMetrics

F32 = np.dtype("<f4")
# The longest JSON text of a float is 24 characters (repr of -2.2250738585072014e-308) and a
# separator ", " two more: 32 per value is generous; the limit is checked before parsing.
JSON_BYTES_PER_VALUE = 32
JSON_SLACK_BYTES = 1024  # the {"inputs": ...} wrapper and whitespace
# Defaults (docs/inference_server.md): a client of the load generator gives up after its
# per-request timeout, 10 s (loadgen --timeout): a request, or a request head or body, older
# than that has no one waiting for it.
DEFAULT_DEADLINE_MS = 10_000.0
DEFAULT_HEAD_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 10.0
DEFAULT_KEEP_ALIVE_S = 5.0  # uvicorn's default
DEFAULT_BACKLOG = 2048  # uvicorn's default (capped by net.core.somaxconn, 4096 on Linux >= 5.4)
DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_QUEUE_BATCHES = 64  # queue bound, in batches of max_batch (a memory bound: the deadline sheds first)
FD_RESERVE = 64  # descriptors besides connections: the listener, the model, the session's, logs
log = logging.getLogger(__name__)


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


# --------------------------------------------------------------------------- limits and inputs
@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one server accepts (docs/inference_server.md)."""

    max_body_bytes: int  # JSON bodies; octet-stream ones are also capped at max_batch samples exactly
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    backlog: int = DEFAULT_BACKLOG
    deadline_s: float = DEFAULT_DEADLINE_MS / 1e3
    max_queue_samples: int = 0  # 0: DEFAULT_QUEUE_BATCHES * max_batch

    @staticmethod
    def default_max_body(max_batch: int, sample_len: int) -> int:
        """A JSON body of ``max_batch`` samples at a generous ``JSON_BYTES_PER_VALUE`` per value."""
        return max_batch * sample_len * JSON_BYTES_PER_VALUE + JSON_SLACK_BYTES


def decode_inputs(body: bytes, ctype: str, sample_len: int, max_batch: int) -> np.ndarray:
    """``(n, sample_len)`` float32 from a request body; :class:`RequestError` (400) says what is wrong."""
    if not body:
        raise RequestError(400, "empty body: expected 1 or more samples")
    if ctype == "application/json":
        x = _decode_json(body, sample_len, max_batch)
    else:
        width = sample_len * F32.itemsize
        if len(body) % width:
            raise RequestError(400, f"body of {len(body)} bytes is not a whole number of {sample_len}-float32 samples")
        x = np.frombuffer(body, dtype=F32).reshape(-1, sample_len)
        if len(x) > max_batch:
            raise RequestError(400, f"at most {max_batch} samples per request, got {len(x)}")
    if not np.isfinite(x).all():
        raise RequestError(400, "inputs must be finite")
    return x


def _decode_json(body: bytes, sample_len: int, max_batch: int) -> np.ndarray:
    shape = '{"inputs": [[numbers], ...]}'
    try:
        obj = json.loads(body)
    except RecursionError:
        raise RequestError(400, f"JSON nested too deeply: expected {shape}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise RequestError(400, f"bad JSON: {e}") from None
    rows = obj.get("inputs") if isinstance(obj, dict) else None
    if not isinstance(rows, list) or not rows:
        raise RequestError(400, f"expected {shape} with at least one sample")
    if len(rows) > max_batch:
        raise RequestError(400, f"at most {max_batch} samples per request, got {len(rows)}")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != sample_len:
            got = f"a list of {len(row)}" if isinstance(row, list) else type(row).__name__
            raise RequestError(400, f"inputs[{i}]: expected a list of {sample_len} numbers, got {got}")
        if not all(type(v) is float or type(v) is int for v in row):
            raise RequestError(400, f"inputs[{i}]: expected numbers only")
    try:
        return np.array(rows, dtype=np.float32)
    except OverflowError:
        raise RequestError(400, "inputs must be finite") from None


def _deadline_s(header: str | None, default_s: float) -> float:
    if header is None:
        return default_s
    try:
        ms = float(header)
    except ValueError:
        ms = math.nan
    if not math.isfinite(ms) or ms < 0:
        raise RequestError(400, f"X-Deadline-Ms: expected a number of milliseconds >= 0, got {header[:40]!r}")
    return ms / 1e3


# --------------------------------------------------------------------------- HTTP app
class InferenceApp:
    """The ASGI app around one batcher (the Starlette app :attr:`starlette`), and the early
    answer the HTTP protocol asks before it hands a request to it: ``POST /infer`` requests
    that admission would shed from their head alone (octet-stream: the samples follow from
    Content-Length) are answered 503 at once, without the body being kept, an ASGI task or
    Starlette (the cheapest answer: under 3x overload most requests get it, and each costs
    CPU on the replica's cores)."""

    def __init__(self, batcher: Batcher, metrics: ServerMetrics, limits: ServerLimits, sample_shape: tuple[int, ...]):
        self.batcher, self.metrics, self.limits = batcher, metrics, limits
        self.sample_shape = sample_shape
        self.sample_len = math.prod(sample_shape)
        self.octet_limit = min(limits.max_body_bytes, batcher.max_batch * self.sample_len * F32.itemsize)
        self._counts: dict[int, Any] = {}  # status → its counter (labels() costs a lookup under a lock)
        self._sheds: dict[str, Any] = {}  # reason → its counter
        self.sample_bytes = self.sample_len * F32.itemsize
        self.starlette = Starlette(
            routes=[Route("/infer", self.infer, methods=["POST"]), Route("/metrics", self.metrics_page, methods=["GET"]),
                    Route("/healthz", self.healthz, methods=["GET"])],
            exception_handlers={HTTPException: self.http_error, Exception: self.server_error},
        )

    def _json(self, request: Request, status: int, obj: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
        if request.scope["path"] == "/infer":
            self._count(status)
        return Response(json.dumps(obj), status, headers=headers, media_type="application/json")

    def _count(self, status: int) -> None:
        c = self._counts.get(status)
        if c is None:
            c = self._counts[status] = self.metrics.requests.labels(code=str(status))
        c.inc()

    def _shed_body(self, got: Shed, budget: float) -> tuple[int, bytes]:
        c = self._sheds.get(got.reason)
        if c is None:
            c = self._sheds[got.reason] = self.metrics.shed.labels(reason=got.reason)
        c.inc()
        retry = max(1, math.ceil(got.retry_after_s))
        # the most frequent answer under overload: formatted directly (reason is one of SHED_REASONS)
        return retry, (f'{{"error": "overloaded: shed ({got.reason})", "reason": "{got.reason}", '
                       f'"expected_wait_ms": {got.expected_wait_s * 1e3:.3f}, "deadline_ms": {budget * 1e3:.3f}, '
                       f'"retry_after_s": {retry}}}').encode()

    def _shed(self, request: Request, got: Shed, budget: float) -> Response:
        retry, body = self._shed_body(got, budget)
        self._count(503)
        return Response(body, 503, headers={"Retry-After": str(retry)}, media_type="application/json")

    def early_answer(self, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]],
                     received_at: float) -> bytes | None:
        """The raw 503 for an octet-stream ``POST /infer`` that admission sheds from its head
        alone (the protocol's early answer, :func:`protocol_class`), else None."""
        if path != b"/infer" or method != b"POST":
            return None
        cl = deadline = None
        for name, value in headers:
            if name == b"content-length":
                cl = value
            elif name == b"x-deadline-ms":
                deadline = value
            elif name == b"content-type" and value.split(b";")[0].strip().lower() != b"application/octet-stream":
                return None  # JSON (samples unknown) or wrong: the app decides
        if cl is None or not cl.isdigit():
            return None
        n, rest = divmod(int(cl), self.sample_bytes)
        if rest or not 1 <= n <= self.batcher.max_batch:
            return None  # malformed: the app answers it
        try:
            budget = _deadline_s(None if deadline is None else deadline.decode("latin-1"), self.limits.deadline_s)
        except RequestError:
            return None
        shed = self.batcher.refuse(n, received_at + budget)
        if shed is None:
            return None
        retry, body = self._shed_body(shed, budget)
        self._count(503)
        return (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
                f"\r\nretry-after: {retry}\r\nconnection: close\r\n\r\n").encode() + body

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.starlette(scope, receive, send)

    def _error(self, request: Request, e: RequestError) -> Response:
        headers = dict(e.headers)
        if e.close:
            headers["Connection"] = "close"
        return self._json(request, e.status, {"error": e.message}, headers)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        what = {404: f"no such path: {request.url.path}",
                405: f"method {request.method} not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
        return self._json(request, exc.status_code, {"error": what}, dict(exc.headers or {}))

    async def server_error(self, request: Request, exc: Exception) -> Response:
        log.error("unhandled %s on %s: %s", type(exc).__name__, request.url.path, exc)
        return self._json(request, 500, {"error": f"internal error: {type(exc).__name__}"})

    async def healthz(self, request: Request) -> Response:
        return Response(b"ok\n", media_type="text/plain")

    async def metrics_page(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def infer(self, request: Request) -> Response:
        arrived = request.scope.get(RECEIVED_AT) or self.batcher.clock()  # its first byte (both time.monotonic)
        try:
            budget = _deadline_s(request.headers.get("x-deadline-ms"), self.limits.deadline_s)
            ctype = request.headers.get("content-type", "application/octet-stream").split(";")[0].strip().lower()
            if ctype not in ("application/octet-stream", "application/json"):
                raise RequestError(415, f"Content-Type: expected application/octet-stream or application/json, "
                                        f"got {ctype[:60]!r}")
            limit = self.octet_limit if ctype == "application/octet-stream" else self.limits.max_body_bytes
            body = await read_body(request, limit, self.limits.body_timeout_s)
            x = decode_inputs(body, ctype, self.sample_len, self.batcher.max_batch)
        except RequestError as e:
            return self._error(request, e)
        except ClientDisconnect:
            return Response(status_code=499)  # nobody reads it
        t0 = time.perf_counter()
        got = self.batcher.admit(x.reshape(len(x), *self.sample_shape), arrived + budget)
        if not isinstance(got, Shed):
            got = await got  # this loop's future (admit ran on it)
        if isinstance(got, Shed):
            return self._shed(request, got, budget)
        if isinstance(got, Failed):
            return self._json(request, 500, {"error": got.error})
        assert isinstance(got, Served)
        now = self.batcher.clock()
        reply = self._json(request, 200, {"outputs": got.out.tolist(), "argmax": got.out.argmax(axis=1).tolist(),
                                          "batch": got.batch}, {"Server-Timing": f"app;dur={1e3 * (now - arrived):.3f}"})
        self.batcher.answered(got, now)
        self.metrics.latency.observe(time.perf_counter() - t0)
        return reply


# --------------------------------------------------------------------------- start-up
def _batch_policy() -> None:
    """Put the calling thread (the event loop) under ``SCHED_BATCH``: still its fair share of
    the CPU, but its wake-ups (a packet, a connection) no longer preempt the batcher thread
    in the middle of ``session.run``. On one core at 3x overload this raised the goodput from
    0.75 to 0.87 of capacity and cut the event loop's CPU from 0.26 to 0.20 cores (each
    preemption cost the model its caches; bench/overload.py, docs/inference_server.md); it
    delays the loop's answers by at most a scheduler slice, a few milliseconds."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError) as e:  # not Linux
        log.warning("event loop stays under the default scheduling policy: %s", e)


class InferenceServer:
    """A bound, warmed-up server: :meth:`run` serves until SIGTERM / SIGINT."""

    def __init__(self, sock: socket.socket, app: InferenceApp, threads: int, batch_policy: bool = True):
        self.sock, self.app, self.threads, self.batch_policy = sock, app, threads, batch_policy
        lim = app.limits
        config = uvicorn.Config(
            app, http=protocol_class(lim.head_timeout_s, early=app.early_answer), loop="uvloop", lifespan="off", access_log=False,
            log_config=None, timeout_keep_alive=lim.keep_alive_s, limit_concurrency=lim.max_connections,
            backlog=lim.backlog, timeout_graceful_shutdown=5, proxy_headers=False, server_header=False,
        )
        self.uvicorn = uvicorn.Server(config)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def run(self) -> None:
        if self.batch_policy:
            _batch_policy()
        try:
            self.uvicorn.run(sockets=[self.sock])
        finally:
            self.app.batcher.stop()
            self.sock.close()


def _fd_room(max_connections: int) -> int:
    """Raise the descriptor limit to fit ``max_connections`` (up to the hard limit); the
    connections that fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    if soft != resource.RLIM_INFINITY and soft < need:
        log.warning("max connections lowered to %d: descriptor limit %d", soft - FD_RESERVE, soft)
        return max(1, soft - FD_RESERVE)
    return max_connections


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
    limits: ServerLimits | None = None,
    batch_policy: bool = True,
) -> InferenceServer:
    """Export, load, warm up and bind (not yet serving: call ``run``)."""
    import onnxruntime as ort

    from reamer.backends.local import launcher
    from reamer.workloads.real.nets import INPUT_SHAPE

    sample_len = math.prod(INPUT_SHAPE)
    lim = limits or ServerLimits(max_body_bytes=ServerLimits.default_max_body(max_batch, sample_len))
    if not lim.max_queue_samples:
        lim = ServerLimits(**{**asdict(lim), "max_queue_samples": DEFAULT_QUEUE_BATCHES * max_batch})
    lim = ServerLimits(**{**asdict(lim), "max_connections": _fd_room(lim.max_connections)})
    cores = float(threads) if threads else launcher.own_effective_cpus()
    for k, v in launcher.thread_env(cores).items():  # before torch loads (export only)
        os.environ.setdefault(k, v)
    opts = launcher.ort_session_options(cores)
    with tempfile.TemporaryDirectory(prefix="reamer-onnx-", dir=workdir) as tmp:
        path = export_onnx(model, Path(tmp) / f"{model}.onnx", seed)
        session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    metrics = ServerMetrics(threads=opts.intra_op_num_threads, max_batch=max_batch, max_wait_s=max_wait_ms / 1e3,
                            deadline_s=lim.deadline_s, max_queue_samples=lim.max_queue_samples,
                            max_body_bytes=lim.max_body_bytes)
    batcher = Batcher(session, max_batch, max_wait_ms, lim.max_queue_samples, metrics)
    batcher.warm_up(INPUT_SHAPE)
    # Everything loaded so far (torch, onnx, the session, the HTTP stack) lives as long as the
    # server: move it out of the collector's reach. Without this a full collection walked
    # it all, pausing the event loop and the batcher's hand-back for 60-100 ms under load
    # (gc callbacks, vgg_cifar at 3x overload), which made every queued request late at once.
    gc.collect()
    gc.freeze()
    metrics.watch(batcher.expected_wait_s, lambda: batcher.times.estimate(max_batch))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(lim.backlog)  # clients that connect before the loop runs wait in the backlog
    batcher.start()
    return InferenceServer(sock, InferenceApp(batcher, metrics, lim, INPUT_SHAPE), opts.intra_op_num_threads,
                           batch_policy)


def main(argv: Sequence[str] | None = None) -> int:
    from reamer.logs import configure
    from reamer.workloads.real.nets import INPUT_SHAPE, MODELS

    ap = argparse.ArgumentParser(prog="python -m reamer.workloads.real.inference_server",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (only this one)")
    ap.add_argument("--port", type=int, default=0, help="0 = any free port (printed in the 'listening' line)")
    ap.add_argument("--model", default="small_cnn", choices=sorted(MODELS))
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=float, default=None, help="override the container-derived core count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-ms", type=float, default=DEFAULT_DEADLINE_MS,
                    help="deadline of a request without X-Deadline-Ms (admission sheds what would miss it)")
    ap.add_argument("--max-queue-samples", type=int, default=0,
                    help=f"most samples queued (default {DEFAULT_QUEUE_BATCHES} x --max-batch)")
    ap.add_argument("--max-body-bytes", type=int, default=0,
                    help=f"largest JSON body (default --max-batch samples at {JSON_BYTES_PER_VALUE} bytes a value)")
    ap.add_argument("--body-timeout-s", type=float, default=DEFAULT_BODY_TIMEOUT_S, help="whole body within (408)")
    ap.add_argument("--head-timeout-s", type=float, default=DEFAULT_HEAD_TIMEOUT_S,
                    help="request head within, from connect or the previous response (else closed)")
    ap.add_argument("--keep-alive-s", type=float, default=DEFAULT_KEEP_ALIVE_S)
    ap.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                    help="open connections before new requests get 503 (uvicorn limit_concurrency)")
    ap.add_argument("--backlog", type=int, default=DEFAULT_BACKLOG)
    ap.add_argument("--loop-policy", default="batch", choices=["batch", "normal"],
                    help="scheduling policy of the event loop thread (batch: its wake-ups do not preempt the model)")
    ap.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    a = ap.parse_args(argv)
    configure(a.log_level)
    logging.getLogger("uvicorn").handlers[:] = logging.getLogger("reamer").handlers
    logging.getLogger("uvicorn").propagate = False
    for name in ("max_batch", "max_connections", "backlog"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(a, name)}")
    for name in ("body_timeout_s", "head_timeout_s", "keep_alive_s"):
        if not getattr(a, name) > 0:
            ap.error(f"--{name.replace('_', '-')}: expected > 0, got {getattr(a, name)}")
    if not (math.isfinite(a.deadline_ms) and a.deadline_ms > 0):
        ap.error(f"--deadline-ms: expected > 0, got {a.deadline_ms}")
    if a.max_queue_samples and a.max_queue_samples < a.max_batch:
        ap.error(f"--max-queue-samples: expected >= --max-batch ({a.max_batch}), got {a.max_queue_samples}")
    limits = ServerLimits(
        max_body_bytes=a.max_body_bytes or ServerLimits.default_max_body(a.max_batch, math.prod(INPUT_SHAPE)),
        body_timeout_s=a.body_timeout_s, head_timeout_s=a.head_timeout_s, keep_alive_s=a.keep_alive_s,
        max_connections=a.max_connections, backlog=a.backlog, deadline_s=a.deadline_ms / 1e3,
        max_queue_samples=a.max_queue_samples,
    )
    server = build_server(a.model, a.host, a.port, max_batch=a.max_batch, max_wait_ms=a.max_wait_ms,
                          threads=a.threads, seed=a.seed, limits=limits, batch_policy=a.loop_policy == "batch")
    # uvicorn shuts down gracefully on SIGTERM / SIGINT, then re-raises the signal to the
    # handler it found: this one, so that the process exits 0 after stopping the batcher
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    lim = server.app.limits
    print(json.dumps({"event": "listening", "port": server.port, "model": a.model, "threads": server.threads,
                      "max_batch": a.max_batch, "max_wait_ms": a.max_wait_ms, "deadline_ms": lim.deadline_s * 1e3,
                      "max_queue_samples": lim.max_queue_samples, "max_body_bytes": lim.max_body_bytes,
                      "max_connections": lim.max_connections}), flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
