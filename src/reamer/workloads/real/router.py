"""A service's front door: forwards each request to one of its replicas, in proportion to
their weights (smooth weighted round-robin, as nginx's ``upstream`` does), so a policy's
routing assumption — requests split by each replica's capacity at the SLO — holds for real.

Backends change while it serves (:meth:`Router.set_backends`): a replica being migrated
make-before-break keeps serving until the new one is in the set. Binds to one address only.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Router(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int] = ("127.0.0.1", 0), timeout_s: float = 30.0):
        super().__init__(addr, _Handler)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._backends: list[tuple[str, int]] = []
        self._weights: list[float] = []
        self._current: list[float] = []
        self.forwarded = 0
        self.failed = 0
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/infer"

    def set_backends(self, backends: Sequence[tuple[str, int, float]]) -> None:
        """``(host, port, weight)`` per replica; weights > 0."""
        with self._lock:
            old = dict(zip(self._backends, self._current, strict=True))
            self._backends = [(h, p) for h, p, _ in backends]
            self._weights = [max(1e-9, float(w)) for _, _, w in backends]
            self._current = [old.get(b, 0.0) for b in self._backends]

    def pick(self) -> tuple[str, int] | None:
        """Smooth weighted round-robin: every backend gains its weight, the largest is chosen
        and pays the total back."""
        with self._lock:
            if not self._backends:
                return None
            total = sum(self._weights)
            for i, w in enumerate(self._weights):
                self._current[i] += w
            k = max(range(len(self._backends)), key=self._current.__getitem__)
            self._current[k] -= total
            return self._backends[k]

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        daemon=True, name="reamer-router")
        self._thread.start()

    def stop(self) -> None:
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def server_close(self) -> None:
        """Stop serving first: ``serve_forever`` on a closed socket spins a CPU (poll reports the
        closed descriptor at once, accept fails, again), so never close under a running loop."""
        t = self._thread
        if t is not None and t.is_alive() and threading.current_thread() is not t:
            self.shutdown()
        super().server_close()


class _Handler(BaseHTTPRequestHandler):
    server: Router
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        target = self.server.pick()
        if target is None:
            self.server.failed += 1
            self._reply(503, b'{"error": "no replica"}')
            return
        try:
            conn = http.client.HTTPConnection(*target, timeout=self.server.timeout_s)
            try:
                conn.request("POST", self.path, body=body,
                             headers={"Content-Type": self.headers.get("Content-Type", "application/octet-stream")})
                resp = conn.getresponse()
                data = resp.read()
                status, ctype = resp.status, resp.getheader("Content-Type", "application/json")
            finally:
                conn.close()
        except (OSError, http.client.HTTPException) as e:
            self.server.failed += 1
            self._reply(502, f'{{"error": "{type(e).__name__}"}}'.encode())
            return
        self.server.forwarded += 1
        self._reply(status, data, ctype)
