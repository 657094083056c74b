"""The dashboard's HTTP side. ``GET /`` is the page (static HTML and JavaScript from this
package, plotly.js from the installed plotly package); the page polls ``GET /api/rounds?since=N``
once a second for the rounds it has not seen, and draws them. ``GET /metrics`` serves the same
rounds as Prometheus series (:mod:`reamer.runtime.prom`).

``GET /api/rounds?since=N`` answers ``{"meta", "rounds", "next", "finished"}``: the run's
description, the rounds from index ``N`` on (each a :meth:`RoundRecord.to_json`), the index to
ask for next, and whether the run is over. ``GET /healthz`` answers ``ok``.

:func:`serve` runs the app with uvicorn in a daemon thread, bound to loopback unless told
otherwise (the page shows the cluster's jobs and services and has no authentication: expose it
with ``kubectl port-forward`` or behind an authenticating proxy)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from reamer.runtime.prom import RoundCollector
from reamer.runtime.rounds import CPU_BANDS, RoundStream

log = logging.getLogger(__name__)
MAX_ROUNDS_PER_ANSWER = 5000  # a reader far behind catches up over a few polls


def _static(name: str) -> str:
    return resources.files("reamer.dashboard").joinpath("static", name).read_text(encoding="utf-8")


@cache
def _plotly_js() -> bytes:
    import plotly

    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


def create_app(stream: RoundStream, poll_ms: int = 1000) -> Starlette:
    """The dashboard of ``stream``; the page asks for new rounds every ``poll_ms``."""
    page = _static("index.html").replace("{{POLL_MS}}", str(int(poll_ms))).replace(
        "{{BANDS}}", ",".join(CPU_BANDS))
    script = _static("dashboard.js")

    async def index(_: Request) -> Response:
        return HTMLResponse(page)

    async def js(_: Request) -> Response:
        return Response(script, media_type="text/javascript")

    async def plotly_js(_: Request) -> Response:
        return Response(_plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    async def rounds(request: Request) -> Response:
        raw = request.query_params.get("since", "0")
        try:
            since = int(raw)
            if since < 0:
                raise ValueError
        except ValueError:
            return JSONResponse({"error": f"since: expected an integer >= 0, got {raw!r}"}, status_code=400)
        got, nxt, finished = stream.since(since)
        if len(got) > MAX_ROUNDS_PER_ANSWER:
            nxt -= len(got) - MAX_ROUNDS_PER_ANSWER
            got, finished = got[:MAX_ROUNDS_PER_ANSWER], False
        return JSONResponse({"meta": stream.meta, "rounds": got, "next": nxt, "finished": finished})

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok\n")

    registry = CollectorRegistry()
    registry.register(RoundCollector(stream))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/", index), Route("/dashboard.js", js), Route("/plotly.min.js", plotly_js),
                             Route("/api/rounds", rounds), Route("/metrics", metrics), Route("/healthz", healthz)])


@dataclass
class Dashboard:
    """A dashboard being served: its URL, and :meth:`close`."""

    url: str
    port: int
    _server: object
    _thread: threading.Thread

    def close(self, timeout_s: float = 5.0) -> None:
        self._server.should_exit = True  # type: ignore[attr-defined]
        self._thread.join(timeout_s)


def listen(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port); a busy port is an OSError now, so a
    caller can check it before the work whose dashboard it serves."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve(stream: RoundStream, host: str = "127.0.0.1", port: int = 0, poll_ms: int = 1000,
          timeout_s: float = 10.0, sock: socket.socket | None = None) -> Dashboard:
    """Serve the dashboard of ``stream`` on ``sock`` (default: :func:`listen` on ``host:port``)
    in a daemon thread; returns once it accepts connections."""
    import uvicorn

    if sock is None:
        sock = listen(host, port)  # bound here, so a busy port is an error now, not in a thread
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(create_app(stream, poll_ms), log_level="warning", access_log=False,
                            lifespan="off", loop="asyncio", http="h11")
    server = uvicorn.Server(config)  # in a thread: it leaves signals to the run
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard did not start on {host}:{port}")
        time.sleep(0.02)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    log.info("dashboard at %s", url)
    return Dashboard(url, port, server, thread)
