"""Real workloads: PS training over TCP, the ONNX Runtime server, the load generator.

The process tests start real processes on 127.0.0.1 with one thread each (the machine is
shared) and always terminate them in ``finally``; each checks that no child is left.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from reamer.workloads.real import loadgen
from reamer.workloads.real import ps_training as ps
from reamer.workloads.real.admission import Batcher, Served, ServiceTimes, Shed
from reamer.workloads.real.serving_metrics import (
    ServerMetrics,
    fetch_metrics,
    parse_metrics,
    served_stats,
)

SRC = str(Path(__file__).resolve().parents[2] / "src")


# --------------------------------------------------------------------------- helpers
def children_of(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d.name))
    return out


class Proc:
    """A child process whose stdout lines are collected by a reader thread."""

    def __init__(self, *args: str):
        env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
        self.p = subprocess.Popen(
            [sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.all: list[dict] = []
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line)

    def json_lines(self) -> list[dict]:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return self.all
            if line.strip().startswith("{"):
                self.all.append(json.loads(line))

    def wait_for(self, event: str, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for obj in self.json_lines():
                if obj.get("event") == event:
                    return obj
            if self.p.poll() is not None and self.lines.empty():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {event!r} line from {self.p.args}; stderr: {''.join(self.err)[-2000:]}")

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)


@pytest.fixture
def procs():
    started: list[Proc] = []
    before = set(children_of(os.getpid()))
    try:
        yield lambda *a: started.append(Proc(*a)) or started[-1]
    finally:
        for p in started:
            p.stop()
        for p in started:
            for s in (p.p.stdout, p.p.stderr):
                s.close()
        time.sleep(0.05)
        assert set(children_of(os.getpid())) - before == set(), "child processes left behind"


# --------------------------------------------------------------------------- sharding / wire
def test_shard_assignment_balances_and_covers_every_tensor():
    numels = [432, 16, 4608, 32, 18432, 64, 640, 10]
    for shards in (1, 2, 3):
        a = ps.shard_assignment(numels, shards)
        assert a == ps.shard_assignment(numels, shards)  # deterministic
        assert set(a) == set(range(shards))
        idx = [ps.shard_indices(numels, shards, k) for k in range(shards)]
        assert sorted(i for part in idx for i in part) == list(range(len(numels)))
    a = ps.shard_assignment([100, 100, 100, 100], 2)
    assert sorted(a) == [0, 0, 1, 1]
    for bad in (0, 9):
        with pytest.raises(ValueError):
            ps.shard_assignment(numels, bad)


def test_tensors_round_trip_and_sizes_are_checked():
    a, b = socket.socketpair()
    ca, cb = ps.Conn(a), ps.Conn(b)
    try:
        arrays = [np.arange(6, dtype=np.float32), np.array([1.5], dtype=np.float32)]
        ca.send_tensors(ps.PUSH, arrays, step=7, worker=3)
        mtype, step, worker, count = cb.recv_header()
        assert (mtype, step, worker, count) == (ps.PUSH, 7, 3, 2)
        got = cb.recv_tensors(count, [6, 1])
        assert all(np.array_equal(x, y) for x, y in zip(got, arrays, strict=True))
        assert ca.bytes_sent == cb.bytes_recv > 7 * 4
        ca.send_tensors(ps.PUSH, arrays)
        _, _, _, count = cb.recv_header()
        with pytest.raises(ps.ProtocolError, match="bytes"):
            cb.recv_tensors(count, [5, 1])  # a size the shard does not hold: rejected before allocating
    finally:
        ca.close()
        cb.close()
    a, b = socket.socketpair()
    try:
        a.sendall(b"NOPE" + bytes(ps.HEADER.size - 4))
        with pytest.raises(ps.ProtocolError, match="magic"):
            ps.Conn(b).recv_header()
    finally:
        a.close()
        b.close()


def test_parse_addrs():
    assert ps.parse_addrs("127.0.0.1:5000,10.0.0.2:6000") == [("127.0.0.1", 5000), ("10.0.0.2", 6000)]
    for bad in ("127.0.0.1", "host:", ":80", "a:b"):
        with pytest.raises(ValueError):
            ps.parse_addrs(bad)


# --------------------------------------------------------------------------- loadgen
def test_poisson_arrivals_are_seeded_bounded_and_follow_the_rate():
    a = loadgen.poisson_arrivals([200.0], 1.0, 50.0, seed=1)
    assert a == loadgen.poisson_arrivals([200.0], 1.0, 50.0, seed=1)
    assert a != loadgen.poisson_arrivals([200.0], 1.0, 50.0, seed=2)
    assert abs(len(a) - 10_000) < 400  # 4 sigma
    assert a == sorted(a) and 0 < a[0] and a[-1] < 50.0
    gaps = np.diff(a)
    assert abs(gaps.mean() - 1 / 200) < 0.0003 and abs(gaps.std() / gaps.mean() - 1) < 0.05  # exponential
    trace = loadgen.poisson_arrivals([100.0, 0.0, 300.0], 1.0, 3.0, seed=0)
    assert not [t for t in trace if 1.0 <= t < 2.0]
    assert 200 < sum(1 for t in trace if t >= 2.0) < 400
    assert len(loadgen.poisson_arrivals([1000.0], 1.0, 10.0, seed=0, max_requests=25)) == 25
    with pytest.raises(ValueError):
        loadgen.poisson_arrivals([-1.0], 1.0, 1.0, seed=0)


def test_percentile():
    assert loadgen.percentile([], 50) is None
    assert loadgen.percentile([3.0], 99) == 3.0
    v = [float(i) for i in range(1, 101)]
    assert loadgen.percentile(v, 50) == pytest.approx(50.5)
    assert loadgen.percentile(v, 99) == pytest.approx(99.01)
    assert loadgen.percentile(v, 100) == 100.0


class _Echo(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.002)
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_loadgen_reports_percentiles_and_rate_against_a_local_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/infer"
        r = loadgen.run_load(url, rates=[100.0], duration_s=1.0, seed=4, max_inflight=16)
    finally:
        srv.shutdown()
        srv.server_close()
    assert r["sent"] == len(loadgen.poisson_arrivals([100.0], 1.0, 1.0, seed=4))
    assert r["ok"] == r["sent"] and not r["errors"]
    lat = r["latency_ms"]
    assert 2.0 <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    # wall time cannot end before the last scheduled arrival; no upper bound (a loaded CI host stalls threads)
    last = max(loadgen.poisson_arrivals([100.0], 1.0, 1.0, seed=4))
    assert r["wall_s"] >= last - 1e-3
    assert r["achieved_rate"] == pytest.approx(r["ok"] / r["wall_s"], rel=1e-2)
    with pytest.raises(ValueError):
        loadgen.run_load("ftp://127.0.0.1/x", rates=[1.0], duration_s=1.0)


class _Fail(_Echo):
    deadlines: list[float] = []

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.deadlines.append(float(self.headers.get("X-Deadline-Ms", "nan")))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_window_of_failures_reports_them_at_the_timeout():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Fail)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    windows = []
    try:
        r = loadgen.run_load(f"http://127.0.0.1:{srv.server_address[1]}/infer", rates=[50.0], duration_s=1.0,
                             seed=4, max_inflight=8, timeout_s=2.0, window_s=0.5, on_window=windows.append,
                             deadline_ms=250.0)
    finally:
        srv.shutdown()
        srv.server_close()
    assert r["ok"] == 0 and r["errors"] == {"503": r["sent"]} and r["achieved_rate"] == 0.0
    assert r["shed"] == r["sent"]  # a 503 is shed: reported apart, and still an error
    busy = [w for w in windows if w["errors"]]
    assert busy and all(w["p99_ms"] is None and w["p99_with_failures_ms"] == 2000.0 for w in busy)
    assert all(w["shed"] == w["errors"] for w in windows)
    # every request is in a window, the last ones (after the last full window) too, all before the report
    assert sum(w["errors"] for w in windows) == r["sent"]
    assert [w["window"] for w in windows] == list(range(1, len(windows) + 1))
    # the deadline left since each scheduled arrival
    assert len(_Fail.deadlines) == r["sent"] and all(0.0 <= d <= 250.0 for d in _Fail.deadlines)


def test_the_cli_sends_the_schedule_that_schedule_of_replays(capsys):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    sched = ["--rates", "80,0,120", "--interval", "0.5", "--seed", "5"]
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/infer"
        assert loadgen.main(["--url", url, *sched, "--max-inflight", "8"]) == 0
    finally:
        srv.shutdown()
        srv.server_close()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    replay = loadgen.schedule_of(["--url", "ignored", *sched, "--max-inflight", "8"])
    assert replay == loadgen.poisson_arrivals([80.0, 0.0, 120.0], 0.5, 1.5, seed=5)  # duration: the trace's
    assert report["sent"] == len(replay) > 0
    assert loadgen.schedule_of(["--rate", "50", "--duration", "2", "--seed", "1"]) == loadgen.poisson_arrivals(
        [50.0], 1.0, 2.0, seed=1)


# --------------------------------------------------------------------------- metrics / batching
def _metrics(**kw) -> ServerMetrics:
    return ServerMetrics(**{"threads": 2, "max_batch": 16, "max_wait_s": 0.005, "deadline_s": 0.25,
                            "max_queue_samples": 64, "max_body_bytes": 1000, **kw})


def test_server_metrics_render_with_prometheus_client_and_parse_back():
    m = _metrics()
    for v in (1, 1, 3, 9):
        m.batch.observe(v)
    m.requests.labels(code="503").inc(2)
    m.shed.labels(reason="deadline").inc(2)
    text = m.render().decode()
    assert "# TYPE reamer_infer_batch_size histogram" in text
    got = parse_metrics(text)
    assert got['reamer_infer_batch_size_bucket{le="1.0"}'] == 2 and got['reamer_infer_batch_size_bucket{le="2.0"}'] == 2
    assert got['reamer_infer_batch_size_bucket{le="4.0"}'] == 3 and got['reamer_infer_batch_size_bucket{le="+Inf"}'] == 4
    assert got["reamer_infer_batch_size_count"] == 4 and got["reamer_infer_batch_size_sum"] == 14
    assert got['reamer_infer_requests_total{code="200"}'] == 0 and got['reamer_infer_requests_total{code="503"}'] == 2
    assert got['reamer_infer_shed_total{reason="deadline"}'] == 2 and got['reamer_infer_shed_total{reason="expired"}'] == 0
    assert got["reamer_infer_threads"] == 2 and got["reamer_infer_deadline_seconds"] == 0.25
    # one registry per server: a second server's metrics are its own
    assert parse_metrics(_metrics().render().decode())["reamer_infer_batch_size_count"] == 0


def _doubler(tmp_path: Path):
    """A real ONNX Runtime session of a one-node graph: flatten, times two."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 2, 2])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 12])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Flatten", ["input"], ["flat"]),
                               helper.make_node("Mul", ["flat", "two"], ["logits"])], "doubler", [x], [y], [two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "doubler.onnx")
    return ort.InferenceSession(str(tmp_path / "doubler.onnx"), providers=["CPUExecutionProvider"])


def test_batcher_batches_concurrent_requests_and_respects_max_batch(tmp_path):
    metrics = _metrics()
    b = Batcher(_doubler(tmp_path), max_batch=4, max_wait_ms=30, max_queue_samples=64, metrics=metrics)
    b.start()
    results = {}

    def one(i):
        x = np.full((1, 3, 2, 2), float(i), dtype=np.float32)
        results[i] = b.admit(x, time.monotonic() + 10.0).result(timeout=5)

    try:
        ts = [threading.Thread(target=one, args=(i,)) for i in range(10)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        b.stop()
    assert sorted(results) == list(range(10))
    for i, got in results.items():
        assert isinstance(got, Served) and got.out.tolist() == [[2.0 * i] * 12]
    batches = [got.batch for got in results.values()]
    assert max(batches) <= 4 and max(batches) > 1
    got = parse_metrics(metrics.render().decode())
    assert got["reamer_infer_samples_total"] == 10 and got["reamer_infer_batch_size_sum"] == 10
    assert got["reamer_infer_queue_depth"] == 0 and got["reamer_infer_queue_samples"] == 0
    assert b.times.estimate(1) > 0  # measured


def test_batcher_sheds_what_would_miss_its_deadline_and_drops_what_expired_in_the_queue(tmp_path):
    b = Batcher(_doubler(tmp_path), max_batch=4, max_wait_ms=0, max_queue_samples=8)
    b.warm_up((3, 2, 2))
    x = np.ones((2, 3, 2, 2), dtype=np.float32)
    now = time.monotonic()
    shed = b.admit(x, now)  # no time at all: never queued
    assert isinstance(shed, Shed) and shed.reason == "deadline" and shed.retry_after_s > 0
    # the batcher is not running yet: what is admitted waits in the queue
    soon = b.admit(x, time.monotonic() + 0.05)
    later = [b.admit(x, time.monotonic() + 30.0) for _ in range(3)]
    assert not isinstance(soon, Shed) and not any(isinstance(f, Shed) for f in later)
    full = b.admit(x, time.monotonic() + 30.0)
    assert isinstance(full, Shed) and full.reason == "queue_full"  # 8 samples queued at most
    assert b.expected_wait_s(1) >= 2 * b.times.estimate(4)  # two full batches ahead
    time.sleep(0.1)  # soon's deadline passes while it waits
    b.start()
    try:
        assert soon.result(timeout=5) == Shed("expired", 0.0, 1.0)  # dropped, not computed
        assert all(isinstance(f.result(timeout=5), Served) for f in later)
    finally:
        b.stop()
    assert isinstance(b.admit(x, time.monotonic() + 30.0), Shed)  # stopping


def test_the_admission_margin_is_a_high_percentile_of_how_late_answers_were(tmp_path):
    from reamer.workloads.real.admission import MARGIN_EVERY, MARGIN_QUANTILE, MARGIN_WINDOW_S

    b = Batcher(_doubler(tmp_path), max_batch=4, max_wait_ms=0, max_queue_samples=8)
    b.warm_up((3, 2, 2))
    assert b.margin_s == 0.0
    now = time.monotonic()
    for k in range(MARGIN_EVERY):  # 1% answered 0.3 s late, the rest 10 ms
        b.answered(Served(np.zeros((1, 12), np.float32), 1, now), now + (0.3 if k == 0 else 0.01))
    pos = (MARGIN_EVERY - 1) * MARGIN_QUANTILE / 100  # numpy's linear percentile of the window
    frac = pos - (MARGIN_EVERY - 2) if pos > MARGIN_EVERY - 2 else 0.0
    assert b.margin_s == pytest.approx(0.01 + 0.29 * frac, rel=0.05)
    assert b.margin_s > 0.01 + 0.29 * 0.01  # above the window's p99
    x = np.ones((1, 3, 2, 2), dtype=np.float32)
    assert isinstance(b.admit(x, time.monotonic() + 0.005), Shed)  # the margin alone does not fit
    assert not isinstance(b.admit(x, time.monotonic() + 1.0), Shed)
    # learnt from answers only, it expires with them: nothing answered for the window, no margin
    assert b._margin(now + MARGIN_WINDOW_S + 1.0) == 0.0


def test_service_times_interpolate_between_measured_batch_sizes():
    t = ServiceTimes(8, alpha=0.5, window=1)  # the EWMA alone
    assert t.estimate(3) == 0.0  # nothing measured
    t.observe(1, 0.010)
    assert t.estimate(4) == pytest.approx(0.040)  # beyond the largest measured: proportional
    t.observe(8, 0.050)
    assert t.estimate(8) == 0.050 and t.estimate(0) == 0.0
    assert t.estimate(4) == pytest.approx(0.010 + 0.040 * 3 / 7)
    t.observe(8, 0.070)
    assert t.estimate(8) == pytest.approx(0.070)  # the last one is larger than the EWMA (0.060)
    t.observe(8, 0.030)
    assert t.estimate(8) == pytest.approx(0.045)  # the EWMA, larger than the last


def test_service_times_follow_a_step_up_at_once_and_a_step_down_slowly():
    """A windowed max over the last batches: a slowdown (more load on the replica's cores)
    counts from its first batch; a speed-up only once the window has forgotten the slow ones."""
    t = ServiceTimes(8, alpha=0.1, window=10)
    for _ in range(50):
        t.observe(8, 0.020)
    t.observe(8, 0.030)
    assert t.estimate(8) == pytest.approx(0.030)  # the EWMA alone: 0.021
    for _ in range(9):
        t.observe(8, 0.020)
    assert t.estimate(8) == pytest.approx(0.030)  # still in the window
    t.observe(8, 0.020)
    assert t.estimate(8) < 0.022  # forgotten: the EWMA's


def test_exported_onnx_matches_pytorch(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    torch = pytest.importorskip("torch")
    from reamer.workloads.real.inference_server import export_onnx
    from reamer.workloads.real.nets import build_model

    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    for name in ("small_cnn", "resnet_narrow"):
        path = export_onnx(name, tmp_path / f"{name}.onnx")
        (got,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})
        with torch.no_grad():
            ref = build_model(name).eval()(torch.from_numpy(x)).numpy()
        assert got.shape == (3, 10) and np.allclose(got, ref, atol=1e-4)


# --------------------------------------------------------------------------- real processes
@pytest.mark.slow
def test_ps_job_one_ps_two_workers_trains_consistently(procs):
    pytest.importorskip("torch")
    mod = "reamer.workloads.real.ps_training"
    server = procs(mod, "ps", "--port", "0", "--workers", "2", "--model", "small_cnn", "--threads", "1")
    port = server.wait_for("listening")["port"]
    workers = [
        procs(mod, "worker", "--ps", f"127.0.0.1:{port}", "--model", "small_cnn", "--steps", "20",
              "--worker-id", str(i), "--threads", "1", "--report-every", "5")
        for i in range(2)
    ]
    done = [w.wait_for("done", 90) for w in workers]
    ps_done = server.wait_for("done", 20)
    for w in (*workers, server):
        assert w.p.wait(10) == 0, "".join(w.err)[-2000:]
    a, b = done
    assert a["param_checksum"] == b["param_checksum"]  # every worker ends with the same parameters
    assert a["eval_loss_after"] == b["eval_loss_after"] < a["eval_loss_before"] == b["eval_loss_before"]
    intervals = [x for x in workers[0].json_lines() if x.get("event") == "interval"]
    assert len(intervals) == 4
    for x in intervals:
        assert x["samples_per_s"] > 0 and x["bytes_sent"] > 0 and x["bytes_recv"] > 0
        assert x["cpu_cores"] >= 0 and x["threads"] == 1
        assert x["step_s"] == pytest.approx(x["comm_s"] + x["compute_s"], rel=0.2, abs=0.005)
    assert ps_done["version"] == 20 and ps_done["applies"] == 20
    # 2 workers x 20 pushes of the full model (24234 float32) reach the PS
    assert ps_done["bytes_recv"] >= 2 * 20 * 24234 * 4


@pytest.mark.slow
def test_ps_job_two_shards(procs):
    pytest.importorskip("torch")
    mod = "reamer.workloads.real.ps_training"
    shards = [procs(mod, "ps", "--port", "0", "--shard", str(k), "--shards", "2", "--workers", "1",
                    "--model", "resnet_narrow", "--threads", "1") for k in range(2)]
    addrs = ",".join(f"127.0.0.1:{s.wait_for('listening')['port']}" for s in shards)
    w = procs(mod, "worker", "--ps", addrs, "--model", "resnet_narrow", "--steps", "4", "--threads", "1")
    done = w.wait_for("done", 90)
    ends = [s.wait_for("done", 20) for s in shards]
    assert w.p.wait(10) == 0 and all(s.p.wait(10) == 0 for s in shards)
    assert [e["version"] for e in ends] == [4, 4]
    total = sum(e["params"] for e in ends)
    assert total == 78042 and min(e["params"] for e in ends) > 0.3 * total  # balanced by size
    assert done["shards"] == 2 and done["samples_per_s"] > 0


@pytest.mark.slow
def test_resharding_through_a_checkpoint_continues_the_same_training(procs, tmp_path):
    """SIGTERM → the worker leaves after its step, the PS checkpoints; a job restarted with
    2 shards resumes at that step and ends with exactly the parameters of a run never
    interrupted (synchronous SGD, same batches per step, one thread)."""
    pytest.importorskip("torch")
    mod = "reamer.workloads.real.ps_training"
    steps, common = "150", ("--model", "small_cnn", "--threads", "1")

    def job(shards: int, *ps_args: str, stop_after_interval: bool = False) -> dict:
        servers = [procs(mod, "ps", "--port", "0", "--shard", str(k), "--shards", str(shards), *common, *ps_args)
                   for k in range(shards)]
        addrs = ",".join(f"127.0.0.1:{s.wait_for('listening')['port']}" for s in servers)
        w = procs(mod, "worker", "--ps", addrs, "--steps", steps, "--report-every", "5", *common)
        if stop_after_interval:
            w.wait_for("interval", 60)
            w.p.terminate()
            end = w.wait_for("stopped", 60)
        else:
            end = w.wait_for("done", 120)
        assert w.p.wait(10) == 0 and all(s.p.wait(10) == 0 for s in servers)
        return end

    straight = job(1)
    ckpt = str(tmp_path / "ckpt")
    first = job(1, "--checkpoint", ckpt, stop_after_interval=True)
    assert 5 <= first["step"] < 150
    resumed = job(2, "--resume", ckpt)
    assert resumed["start_step"] == first["step"] and resumed["steps"] == 150 - first["step"]
    assert resumed["param_checksum"] == straight["param_checksum"]


@pytest.mark.slow
def test_a_worker_that_leaves_early_does_not_stall_the_others(procs):
    pytest.importorskip("torch")
    mod = "reamer.workloads.real.ps_training"
    server = procs(mod, "ps", "--port", "0", "--workers", "2", "--threads", "1")
    port = server.wait_for("listening")["port"]
    ws = [procs(mod, "worker", "--ps", f"127.0.0.1:{port}", "--steps", str(n), "--worker-id", str(i),
                "--threads", "1") for i, n in enumerate((3, 8))]
    assert [w.wait_for("done", 90)["steps"] for w in ws] == [3, 8]
    end = server.wait_for("done", 20)
    assert server.p.wait(10) == 0 and all(w.p.wait(10) == 0 for w in ws)
    assert end["version"] == 8 and 0 <= end["cpu_cores"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGKILL"])  # SIGTERM is a clean leave (BYE) after the current step
def test_ps_fails_fast_when_a_worker_dies(procs, sig):
    """A synchronous step can never complete without the dead worker: the PS must notice
    the hang-up while waiting, and exit with an error instead of hanging."""
    pytest.importorskip("torch")
    import signal

    mod = "reamer.workloads.real.ps_training"
    server = procs(mod, "ps", "--port", "0", "--workers", "2", "--threads", "1")
    port = server.wait_for("listening")["port"]
    w = procs(mod, "worker", "--ps", f"127.0.0.1:{port}", "--steps", "5", "--threads", "1")
    w.wait_for("connected")
    time.sleep(0.5)  # it pushes step 0, then waits for the worker that never comes
    w.p.send_signal(getattr(signal, sig))
    assert w.p.wait(10) != 0
    assert server.p.wait(10) == 1
    assert server.wait_for("done", 5)["version"] == 0


@pytest.mark.slow
def test_inference_server_batches_under_load_and_loadgen_reports_p99(procs):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    srv = procs("reamer.workloads.real.inference_server", "--port", "0", "--model", "small_cnn",
                "--max-batch", "8", "--max-wait-ms", "20", "--threads", "1")
    port = srv.wait_for("listening")["port"]
    base = f"http://127.0.0.1:{port}"

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype("<f4")
    conn.request("POST", "/infer", body=x.tobytes(), headers={"Content-Type": "application/octet-stream"})
    r = conn.getresponse()
    body = json.loads(r.read())
    assert r.status == 200 and len(body["outputs"]) == 2 and len(body["outputs"][0]) == 10
    conn.request("POST", "/infer", body=json.dumps({"inputs": [x[0].ravel().tolist()]}),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    one = json.loads(r.read())
    assert r.status == 200 and np.allclose(one["outputs"][0], body["outputs"][0], atol=1e-4)
    conn.request("POST", "/infer", body=b"\x00" * 12, headers={"Content-Type": "application/octet-stream"})
    r = conn.getresponse()
    r.read()
    assert r.status == 400
    conn.close()

    report = loadgen.run_load(base + "/infer", rates=[150.0], duration_s=1.5, seed=7, max_inflight=32)
    assert report["ok"] == report["sent"] > 100 and not report["errors"]
    assert report["latency_ms"]["p99"] is not None and report["latency_ms"]["p99"] >= report["latency_ms"]["p50"]

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    assert r.status == 200 and "# TYPE reamer_infer_batch_size histogram" in text
    m = parse_metrics(text)
    assert m['reamer_infer_requests_total{code="200"}'] == report["ok"] + 2
    assert m['reamer_infer_requests_total{code="400"}'] == 1
    assert m["reamer_infer_request_latency_seconds_count"] == report["ok"] + 2
    n_batches = m["reamer_infer_batch_size_count"]
    assert m["reamer_infer_batch_size_sum"] == report["ok"] + 3  # samples
    assert m["reamer_infer_batch_size_sum"] / n_batches > 1.0  # dynamic batching happened
    assert m['reamer_infer_batch_size_bucket{le="1.0"}'] < n_batches  # some batch had > 1 sample
    assert m['reamer_infer_batch_size_bucket{le="8.0"}'] == n_batches  # never above --max-batch
    st = served_stats(fetch_metrics(port))  # the same counters, as the benches read them
    assert st["batches"] == n_batches and st["batch_mean"] == m["reamer_infer_batch_size_sum"] / n_batches
    assert 0 < st["run_ms_per_batch"] <= st["latency_ms"] * st["batch_mean"]
    assert m["reamer_infer_threads"] == 1


def test_served_stats_counts_between_two_scrapes():
    before = {"reamer_infer_run_seconds_sum": 1.0, "reamer_infer_run_seconds_count": 100.0,
              "reamer_infer_samples_total": 150.0, "reamer_infer_request_latency_seconds_sum": 2.0,
              "reamer_infer_request_latency_seconds_count": 150.0}
    after = {"reamer_infer_run_seconds_sum": 1.5, "reamer_infer_run_seconds_count": 150.0,
             "reamer_infer_samples_total": 250.0, "reamer_infer_request_latency_seconds_sum": 3.5,
             "reamer_infer_request_latency_seconds_count": 250.0}
    st = served_stats(after, before)
    assert st == pytest.approx({"run_ms_per_batch": 10.0, "run_ms_per_sample": 5.0, "batch_mean": 2.0,
                                "batches": 50.0, "latency_ms": 15.0})
    assert served_stats(before)["run_ms_per_batch"] == pytest.approx(10.0)  # since the server's start
