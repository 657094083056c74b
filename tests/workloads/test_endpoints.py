"""Published endpoints and client-side balancing: smooth weighted round-robin, live changes
seen by clients, real requests from the load generator split by the weights."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reamer.workloads.real import loadgen
from reamer.workloads.real.endpoints import Balancer, EndpointsFile, read_endpoints, write_endpoints


@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=5))
@settings(max_examples=50, deadline=None)
def test_picks_follow_the_weights(weights):
    b = Balancer([("127.0.0.1", 1000 + i, w) for i, w in enumerate(weights)])
    n = 2000
    got = Counter(b.pick()[1] - 1000 for _ in range(n))
    for i, w in enumerate(weights):
        assert abs(got[i] / n - w / sum(weights)) < 0.01 + 1.0 / n * len(weights)


def test_a_client_sees_each_published_set_at_its_next_pick(tmp_path):
    path = tmp_path / "svc.json"
    client = EndpointsFile(path)
    assert client.pick() is None  # nothing published yet
    write_endpoints(path, [("127.0.0.1", 8001, 1.0)])
    assert client.pick() == ("127.0.0.1", 8001)
    write_endpoints(path, [("127.0.0.1", 8001, 1.0), ("127.0.0.1", 8002, 3.0)])  # make-before-break: both
    assert Counter(client.pick()[1] for _ in range(400)) == {8001: 100, 8002: 300}
    write_endpoints(path, [("127.0.0.1", 8002, 1.0)])  # the old one leaves
    assert {client.pick() for _ in range(10)} == {("127.0.0.1", 8002)}
    assert not list(tmp_path.glob(".*.tmp"))  # atomic replace leaves no temporary file


def test_a_bad_endpoints_file_names_the_file_and_field(tmp_path):
    path = tmp_path / "svc.json"
    path.write_text('{"endpoints": [{"host": "h", "port": 0, "weight": 1}]}')
    with pytest.raises(ValueError, match=r"svc\.json: endpoints: expected port"):
        read_endpoints(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match=r"svc\.json: endpoints: expected"):
        EndpointsFile(path).pick()


class _Tagged(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


def test_the_load_generator_splits_real_requests_by_the_published_weights(tmp_path):
    servers = []
    for _ in range(2):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Tagged)
        srv.daemon_threads, srv.hits = True, 0
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
    path = tmp_path / "svc.json"
    try:
        none = loadgen.run_load(endpoints=path, rates=[50.0], duration_s=0.2, seed=1, max_inflight=4)
        assert none["ok"] == 0 and none["errors"] == {"no endpoint": none["sent"]}
        write_endpoints(path, [("127.0.0.1", s.server_address[1], w) for s, w in zip(servers, (1.0, 3.0), strict=True)])
        r = loadgen.run_load(endpoints=path, rates=[200.0], duration_s=1.0, seed=2, max_inflight=8)
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
    assert r["ok"] == r["sent"] > 100 and not r["errors"]
    assert abs(servers[1].hits / r["ok"] - 0.75) <= 0.01  # smooth WRR: exact up to one cycle
    with pytest.raises(ValueError, match="exactly one of url and endpoints"):
        loadgen.run_load("http://127.0.0.1:1/x", endpoints=path, rates=[1.0], duration_s=1.0)
