"""The service router: smooth weighted round-robin, live backend changes, real forwarding."""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hypothesis import given, settings
from hypothesis import strategies as st

from reamer.workloads.real.router import Router


@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=5))
@settings(max_examples=50, deadline=None)
def test_picks_follow_the_weights(weights):
    r = Router()
    try:
        r.set_backends([("127.0.0.1", 1000 + i, w) for i, w in enumerate(weights)])
        n = 2000
        got = Counter(r.pick()[1] - 1000 for _ in range(n))
        for i, w in enumerate(weights):
            assert abs(got[i] / n - w / sum(weights)) < 0.01 + 1.0 / n * len(weights)
    finally:
        r.server_close()


def test_no_backend_gives_503_and_forwarding_reaches_the_replica():
    hits: list[str] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            hits.append(body.decode())
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    replica = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    r = Router()
    r.start()
    try:
        host, port = r.server_address[:2]

        def post() -> tuple[int, bytes]:
            c = http.client.HTTPConnection(host, port, timeout=5)
            c.request("POST", "/infer", body=b"x1")
            resp = c.getresponse()
            out = resp.status, resp.read()
            c.close()
            return out

        assert post()[0] == 503
        r.set_backends([("127.0.0.1", replica.server_address[1], 1.0)])
        assert post() == (200, b"ok") and hits == ["x1"]
        assert r.forwarded == 1 and r.failed == 1
    finally:
        r.stop()
        replica.shutdown()
        replica.server_close()


def test_closing_a_running_router_stops_its_loop_instead_of_spinning():
    """``serve_forever`` on a closed socket busy-loops; closing must stop the loop first (this
    leak once took a CPU from every measurement after a calibration)."""
    import time

    r = Router()
    r.start()
    time.sleep(0.3)  # the loop is serving
    r.server_close()
    assert r._thread is not None
    r._thread.join(timeout=5.0)  # the loop has ended, not spinning on the closed socket
    assert not r._thread.is_alive()
