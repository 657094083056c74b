"""The node agent (``reamer.backends.k8s.agent``): finding pod and container cgroups, turning
scraped Prometheus families into published metrics, reading a process's network bytes, and
(root only) measuring a real, CFS-throttled cgroup-v1 pod cgroup."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from reamer.backends.k8s.agent import (
    Agent,
    container_cgroups,
    cpu_hierarchy,
    kubelet_root,
    kubelet_roots,
    net_bytes,
    pod_cgroup,
    scrape,
    summarize,
)
from reamer.workloads.real.serving_metrics import ServerMetrics

UID = "3f2a9c1e-7b4d-4e8a-9f10-0123456789ab"
OTHER = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


# ----------------------------------------------------------------------------- pod_cgroup
# The trees below are a fake layout of plain directories under tmp_path, laid out the way a
# kubelet lays out pod cgroups: a real kubelet (and its cgroups) is not available here.
def _layout(driver: str, qos: str, uid: str) -> tuple[str, ...]:
    u = uid.replace("-", "_")
    if driver == "systemd":
        return {
            "Guaranteed": ("kubepods.slice", f"kubepods-pod{u}.slice"),
            "Burstable": ("kubepods.slice", "kubepods-burstable.slice", f"kubepods-burstable-pod{u}.slice"),
            "BestEffort": ("kubepods.slice", "kubepods-besteffort.slice", f"kubepods-besteffort-pod{u}.slice"),
        }[qos]
    return {
        "Guaranteed": ("kubepods", f"pod{uid}"),
        "Burstable": ("kubepods", "burstable", f"pod{uid}"),
        "BestEffort": ("kubepods", "besteffort", f"pod{uid}"),
    }[qos]


def _fake_top(tmp_path: Path, version: int) -> Path:
    """A fake cgroup root of ``version`` and the CPU hierarchy the agent would search."""
    root = tmp_path / f"cg{version}"
    if version == 2:
        root.mkdir()
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    else:
        (root / "cpu,cpuacct").mkdir(parents=True)
        (root / "memory").mkdir()
    return cpu_hierarchy(root, version)


QOS = ("Guaranteed", "Burstable", "BestEffort")


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("hint", [False, True], ids=["no-hint", "hint"])
def test_pod_cgroup_finds_every_layout(tmp_path, version, driver, qos, hint):
    top = _fake_top(tmp_path, version)
    want = top.joinpath(*_layout(driver, qos, UID))
    want.mkdir(parents=True)
    (want / "cri-containerd-" f"{'a' * 64}.scope").mkdir()
    # another pod in every other class of the same driver: the search must not return it
    for q in QOS:
        if q != qos:
            top.joinpath(*_layout(driver, q, OTHER)).mkdir(parents=True)
    assert pod_cgroup(top, UID, qos if hint else None) == want
    assert pod_cgroup(top, OTHER, qos if hint else None) != want


@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
def test_pod_cgroup_wrong_hint_still_found_and_unknown_uid_is_none(tmp_path, driver):
    top = _fake_top(tmp_path, 2)
    want = top.joinpath(*_layout(driver, "BestEffort", UID))
    want.mkdir(parents=True)
    assert pod_cgroup(top, UID, "Guaranteed") == want
    assert pod_cgroup(top, UID, "NoSuchClass") == want
    assert pod_cgroup(top, OTHER) is None
    assert pod_cgroup(top, OTHER, "BestEffort") is None
    # a file in the pod's place is not a cgroup
    top.joinpath(*_layout(driver, "Burstable", OTHER)).parent.mkdir(parents=True, exist_ok=True)
    top.joinpath(*_layout(driver, "Burstable", OTHER)).write_text("")
    assert pod_cgroup(top, OTHER, "Burstable") is None


# A kubelet with ``--cgroup-root /kubelet`` (kind's) nests the tree: cgroupfs
# ``kubelet/kubepods/...``; systemd ``kubelet.slice/kubelet-kubepods.slice/...`` (kubelet's
# CgroupName.ToSystemd: each slice named after every component down to it).
def _rooted(driver: str, qos: str, uid: str) -> tuple[str, ...]:
    parts = _layout(driver, qos, uid)
    if driver == "cgroupfs":
        return ("kubelet", *parts)
    return ("kubelet.slice", *(f"kubelet-{p}" for p in parts))


@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
@pytest.mark.parametrize("qos", QOS)
def test_pod_cgroup_below_a_kubelet_cgroup_root(tmp_path, driver, qos):
    top = _fake_top(tmp_path, 2)
    want = top.joinpath(*_rooted(driver, qos, UID))
    want.mkdir(parents=True)
    assert _rooted("systemd", "Burstable", UID)[-1] == f"kubelet-kubepods-burstable-pod{UID.replace('-', '_')}.slice"
    assert pod_cgroup(top, UID, qos) is None  # not below the default root
    assert pod_cgroup(top, UID, None, kubelet_root("/kubelet")) == want
    assert pod_cgroup(top, UID, qos, kubelet_root("kubelet/")) == want
    assert kubelet_roots(top) == [(), ("kubelet",)]


def test_kubelet_roots_finds_top_level_kubepods_trees_only(tmp_path):
    top = _fake_top(tmp_path, 2)
    assert kubelet_roots(top) == [()]
    for d in ("kubepods.slice", "kubepods/burstable", "system.slice/kubepods", "user.slice/user-kubepods.slice",
              "a/kubepods", "my_pool.slice/my_pool-kubepods.slice", "b.slice/c-kubepods.slice"):
        top.joinpath(*d.split("/")).mkdir(parents=True)
    (top / "f").write_text("")
    # the default tree itself is no other root; a slice holds one only under its own prefix (not b.slice's c-)
    assert kubelet_roots(top) == [(), ("a",), ("my-pool",), ("system.slice",), ("user",)]
    assert kubelet_roots(tmp_path / "missing") == [()]


# ----------------------------------------------------------------------------- container_cgroups
def test_container_cgroups_recognises_runtimes_and_ignores_the_rest(tmp_path):
    pod = tmp_path / "kubepods" / "burstable" / f"pod{UID}"
    ids = {rt: (c * 64) for rt, c in zip(("containerd", "crio", "docker", "bare"), "abcd", strict=True)}
    want = {
        ids["containerd"]: pod / f"cri-containerd-{ids['containerd']}.scope",
        ids["crio"]: pod / f"crio-{ids['crio']}.scope",
        ids["docker"]: pod / f"docker-{ids['docker']}.scope",
        ids["bare"]: pod / ids["bare"],  # cgroupfs driver: the container id itself
    }
    for d in want.values():
        d.mkdir(parents=True)
    for junk in (f"crio-conmon-{'e' * 64}.scope", "init.scope", "kubepods-besteffort.slice", "not-a-container",
                 f"podman-{'f' * 64}.scope", "abc"):
        (pod / junk).mkdir()
    (pod / ("9" * 64)).write_text("")  # a file, not a cgroup
    (pod / "cgroup.procs").write_text("")
    assert container_cgroups(pod) == want


# ----------------------------------------------------------------------------- scrape + summarize
class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.server.body.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def endpoint() -> Iterator[tuple[ThreadingHTTPServer, str]]:
    """A tiny /metrics server on 127.0.0.1 (free port) serving whatever ``server.body`` holds."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    srv.body = ""  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv, f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)


def test_summarize_counter_histogram_gauge_from_real_scrapes(endpoint):
    srv, url = endpoint
    reg = CollectorRegistry()
    reqs = Counter("reamer_requests", "requests", registry=reg)
    lat = Histogram("reamer_latency_seconds", "latency", buckets=(0.01, 0.1, 0.5, 1.0), registry=reg)
    depth = Gauge("reamer_queue_depth", "queue", registry=reg)
    Counter("other_requests", "not Reamer's", registry=reg).inc(5)

    # before the window: 10 requests, 1000 slow ones (le=1.0): they must not count in the window's p99
    reqs.inc(10)
    for _ in range(1000):
        lat.observe(0.8)
    depth.set(3)
    srv.body = generate_latest(reg).decode()
    before = scrape(url)
    assert "other_requests" not in before and "reamer_requests" in before
    first = summarize(before, None, 0.0)
    assert first["reamer_requests_total"] == 10
    assert first["reamer_queue_depth"] == 3
    assert not [k for k in first if k.endswith((":rate", ":p99"))], first  # no previous scrape

    # the window (2 s): 30 more requests, 50 observations all in the (0.1, 0.5] bucket
    reqs.inc(30)
    for _ in range(50):
        lat.observe(0.3)
    depth.set(7)
    srv.body = generate_latest(reg).decode()
    now = scrape(url)
    out = summarize(now, before, 2.0)
    assert out["reamer_requests_total"] == 40
    assert out["reamer_requests_total:rate"] == pytest.approx(15.0)
    # the window's bucket, not the cumulative 1.0; within it linear, as Prometheus' histogram_quantile:
    # 0.1 + (0.5 - 0.1) × 49.5 / 50
    assert out["reamer_latency_seconds:p99"] == pytest.approx(0.496)
    assert out["reamer_queue_depth"] == 7
    assert summarize(now, None, 2.0).get("reamer_latency_seconds:p99") is None
    assert "reamer_requests_total:rate" not in summarize(now, before, 0.0)

    # p99 is in the first bucket holding ≥ 99% of the window: 99 fast + 1 slow → the fast bucket's edge
    before = now
    for _ in range(99):
        lat.observe(0.05)
    lat.observe(0.9)
    srv.body = generate_latest(reg).decode()
    assert summarize(scrape(url), before, 1.0)["reamer_latency_seconds:p99"] == pytest.approx(0.1)

    # half fast, half slow: rank 99 of 100 falls in (0.1, 0.5] above the 50 below it → 0.1 + 0.4 × 49 / 50
    before = scrape(url)
    for x in (0.005, 0.3):
        for _ in range(50):
            lat.observe(x)
    srv.body = generate_latest(reg).decode()
    assert summarize(scrape(url), before, 1.0)["reamer_latency_seconds:p99"] == pytest.approx(0.492)


def test_summarize_inference_server_format(endpoint):
    """The repo's own inference server text: labelled counters sum; its histograms give a p99."""
    srv, url = endpoint
    m = ServerMetrics(threads=2, max_batch=16, max_wait_s=0.005, deadline_s=0.25, max_queue_samples=1024,
                      max_body_bytes=1 << 20)
    for code in (200, 200, 500):
        m.requests.labels(code=str(code)).inc()
    srv.body = m.render().decode()
    before = scrape(url)
    for code in (200,) * 8 + (503, 503):
        m.requests.labels(code=str(code)).inc()
    for _ in range(10):
        m.latency.observe(0.02)  # (0.01, 0.025]
    srv.body = m.render().decode()
    out = summarize(scrape(url), before, 5.0)
    assert out["reamer_infer_requests_total"] == 13
    assert out["reamer_infer_requests_total:rate"] == pytest.approx(2.0)
    assert out["reamer_infer_request_latency_seconds:p99"] == pytest.approx(0.01 + 0.015 * 0.99)
    assert "reamer_infer_run_seconds:p99" not in out  # nothing observed in the window
    assert out["reamer_infer_threads"] == 2 and out["reamer_infer_max_wait_seconds"] == 0.005


# ----------------------------------------------------------------------------- net_bytes
def test_net_bytes_of_a_real_process():
    n = net_bytes(Path("/proc"), os.getpid())
    assert isinstance(n, int) and n >= 0
    assert net_bytes(Path("/proc"), 2**22 + 1) is None  # above pid_max: no such process


def test_net_bytes_excludes_loopback(tmp_path):
    dev = tmp_path / "42" / "net"
    dev.mkdir(parents=True)
    (dev / "dev").write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
        "    lo: 999999    100    0    0    0     0          0         0   999999     100    0    0    0     0       0          0\n"
        "  eth0:   1000     10    0    0    0     0          0         0     234       3    0    0    0     0       0          0\n"
        "  eth1:     10      1    0    0    0     0          0         0       5       1    0    0    0     0       0          0\n"
    )
    assert net_bytes(tmp_path, 42) == 1000 + 234 + 10 + 5


# ----------------------------------------------------------------------------- Agent.measure
class FakeKube:
    """Stands in for the API server only (its paths are covered by the tier-A tests): one node
    and the pods on it."""

    def __init__(self, pods: list[dict], cpu: str = "2") -> None:
        self.pods = pods
        self.node = {"metadata": {"name": "n1", "labels": {}}, "status": {"allocatable": {"cpu": cpu}}}
        self.selectors: list[str | None] = []

    def get(self, path: str) -> dict:
        assert path.endswith("/nodes/n1"), path
        return self.node

    def list(self, path: str, field_selector: str | None = None):
        assert path == "/api/v1/pods", path
        self.selectors.append(field_selector)
        return list(self.pods), "1"


def _pod(uid: str, cpu_limit: str = "500m") -> dict:
    return {
        "metadata": {"uid": uid, "name": "j-worker-0", "namespace": "default", "labels": {"reamer.io/job": "j"}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"cpu": cpu_limit}}}]},
        "status": {"phase": "Running", "qosClass": "Burstable"},
    }


def test_measure_separate_cpu_and_cpuacct_mounts(tmp_path):
    """cgroup v1 with cpu and cpuacct mounted apart (as on this machine): usage comes from the
    cpuacct hierarchy's copy of the pod's path (a fake tree of files, a controllable clock)."""
    root = tmp_path / "cg"
    rel = Path("kubepods", "burstable", f"pod{UID}")
    cpu, acct = root / "cpu" / rel, root / "cpuacct" / rel
    cpu.mkdir(parents=True)
    acct.mkdir(parents=True)
    (root / "cpuacct" / "cpuacct.usage").write_text("0")

    def write(usage_ns: int, periods: int, throttled: int) -> None:
        (cpu / "cpu.stat").write_text(f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time 0\n")
        (acct / "cpuacct.usage").write_text(str(usage_ns))

    t = [100.0]
    agent = Agent(FakeKube([_pod(UID)]), "n1", cgroup_root=root, clock=lambda: t[0])
    write(0, 0, 0)
    agent.measure()
    t[0] += 2.0
    write(int(1.0e9), 20, 15)
    (root / "cpuacct" / "cpuacct.usage").write_text(str(int(3.0e9)))  # the whole machine: 1.5 cores
    status = agent.measure()
    (e,) = status["pods"]
    assert e["cpuUsed"] == pytest.approx(0.5)
    assert e["throttledRatio"] == pytest.approx(0.75)
    assert status["systemUsed"] == pytest.approx(1.0)  # 1.5 - the pod's 0.5


@pytest.mark.parametrize("given", [None, "/kubelet", "/"])
def test_measure_a_pod_below_kinds_kubelet_cgroup_root(tmp_path, caplog, given):
    """kind's kubelets (``cgroupRoot: /kubelet``, systemd driver, cgroup v2) put pods below
    ``kubelet.slice``: found by default (also when the tree appears after the agent started) and
    with the root given; with a wrong root given, the running pod's CPU is not measured and that is
    said once (a fake tree of files, a controllable clock)."""
    top = _fake_top(tmp_path, 2)
    (top / "cpu.stat").write_text("usage_usec 0\n")
    t = [100.0]
    agent = Agent(FakeKube([_pod(UID)]), "n1", cgroup_root=top, clock=lambda: t[0], kubelet_cgroup_root=given)
    d = top.joinpath(*_rooted("systemd", "Burstable", UID))
    d.mkdir(parents=True)  # the kubelet made it after the agent looked

    def write(usage_s: float) -> None:
        (d / "cpu.stat").write_text(f"usage_usec {int(usage_s * 1e6)}\nnr_periods 10\nnr_throttled 0\n"
                                    "throttled_usec 0\n")

    write(0.0)
    with caplog.at_level("WARNING", logger="reamer.backends.k8s.agent"):
        agent.measure()
        for usage in (1.0, 2.0):
            t[0] += 2.0
            write(usage)
            (e,) = agent.measure()["pods"]
    said = [r for r in caplog.records if "no cgroup" in r.getMessage()]
    if given == "/":
        assert "cpuUsed" not in e and len(said) == 1 and "--kubelet-cgroup-root" in said[0].getMessage()
    else:
        assert e["cpuUsed"] == pytest.approx(0.5) and not said


def test_a_pod_starting_or_ending_unmeasured_is_not_counted_as_the_systems(tmp_path):
    """The system's use is the machine's less the measured pods'. A pod's first window has no
    reading before it, and a pod that ended has none after: in such a window the difference
    holds that pod's use, and the last whole window's figure stands (a fake v2 tree, a
    controllable clock)."""
    top = _fake_top(tmp_path, 2)
    t, usage = [100.0], {}

    def pod_dir(uid):
        d = top.joinpath(*_layout("cgroupfs", "Burstable", uid))
        d.mkdir(parents=True, exist_ok=True)
        return d

    def write(machine_s, **pods_s):
        (top / "cpu.stat").write_text(f"usage_usec {int(machine_s * 1e6)}\n")
        for uid, u in pods_s.items():
            (pod_dir(usage[uid]) / "cpu.stat").write_text(f"usage_usec {int(u * 1e6)}\nnr_periods 0\n"
                                                          "nr_throttled 0\nthrottled_usec 0\n")

    usage.update(a=UID, b=OTHER)
    kube = FakeKube([_pod(UID)], cpu="8")
    agent = Agent(kube, "n1", cgroup_root=top, clock=lambda: t[0])
    write(0.0, a=0.0)
    agent.measure()
    systems = []
    # window 1: a uses 1 core, the system 0.5; window 2: b starts (2 cores, unmeasured); window 3: both
    # measured; window 4: b ended (its last 2 cores unmeasured)
    for machine, a, b, pods_ in ((1.5, 1.0, None, [UID]), (5.5, 2.0, 2.0, [UID, OTHER]),
                                 (9.5, 3.0, 4.0, [UID, OTHER]), (12.0, 4.0, None, [UID])):
        t[0] += 1.0
        write(machine, a=a, **({"b": b} if b is not None else {}))
        kube.pods = [_pod(u) for u in pods_]
        systems.append(agent.measure()["systemUsed"])
    assert systems == pytest.approx([0.5, 0.5, 1.0, 1.0])


def test_a_pods_rates_are_over_its_own_scrapes_and_a_failed_scrape_loses_no_window(tmp_path, endpoint):
    """Each pod's counters are rated over the times its own scrapes ended (a round whose other
    endpoints hung took longer), and a scrape that failed leaves the last good one as the next
    one's start (a real endpoint; the clock is the test's: scrapes end ``lag`` after the round's
    reading)."""
    srv, url = endpoint
    top = _fake_top(tmp_path, 2)
    t, lag = [100.0], [0.0]
    clock = lambda: t[0] + (lag[0] if threading.current_thread().name.startswith("reamer-scrape") else 0.0)
    pod = _pod(UID)
    pod["metadata"]["annotations"] = {"reamer.io/metrics-port": url.rsplit(":", 1)[1].split("/")[0]}
    agent = Agent(FakeKube([pod]), "n1", cgroup_root=top, clock=clock, scrape_host="127.0.0.1")

    def serve(total):
        srv.body = f"# TYPE reamer_requests_total counter\nreamer_requests_total {total}\n" if total is not None \
            else "reamer_requests_total{ not prometheus"

    rates = []
    for total, l in ((100, 0.0), (300, 1.5), (None, 0.0), (700, 0.0)):
        serve(total)
        lag[0] = l
        (e,) = agent.measure()["pods"]
        rates.append((e.get("metrics") or {}).get("reamer_requests_total:rate"))
        t[0] += 5.0
    # 200 over 6.5 s (5 s + the 1.5 s its scrape ended late); none; 400 over 8.5 s, from the last good scrape
    assert rates == [None, pytest.approx(200 / 6.5), None, pytest.approx(400 / 8.5)]


def test_a_pod_whose_metrics_port_is_not_http_costs_only_its_own_metrics(tmp_path):
    """A real TCP port on loopback that answers garbage (a gRPC or other non-HTTP port named by
    ``reamer.io/metrics-port``): http.client raises BadStatusLine, and the agent still reports
    the node and that pod, without its metrics."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def answer() -> None:
        for _ in range(2):
            conn, _ = srv.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"\x00\x01 not http\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    root = tmp_path / "cg"
    rel = Path("kubepods", "burstable", f"pod{UID}")
    for h in ("cpu", "cpuacct"):
        (root / h / rel).mkdir(parents=True)
    (root / "cpuacct" / "cpuacct.usage").write_text("0")
    (root / "cpu" / rel / "cpu.stat").write_text("nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    (root / "cpuacct" / rel / "cpuacct.usage").write_text("0")
    pod = _pod(UID)
    pod["metadata"]["annotations"] = {"reamer.io/metrics-port": str(srv.getsockname()[1])}
    t = [100.0]
    agent = Agent(FakeKube([pod]), "n1", cgroup_root=root, clock=lambda: t[0], scrape_host="127.0.0.1")
    try:
        agent.measure()
        t[0] += 2.0
        (e,) = agent.measure()["pods"]
    finally:
        srv.close()
    assert e["name"] == "j-worker-0" and "metrics" not in e


def test_pods_metrics_endpoints_are_scraped_at_once(tmp_path):
    """Four pods whose endpoints answer only once all four are connected (a barrier that gives
    up after 1.5 s, inside the 2 s scrape time-out): scraped one after another, the first would
    wait alone and fail; scraped at once, every pod has its metrics. A hung endpoint therefore
    costs a report its time-out once, not once per pod behind it."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    together = threading.Barrier(4, timeout=1.5)
    body = b"# TYPE reamer_train_samples_total counter\nreamer_train_samples_total 5\n"

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(4096)
            try:
                together.wait()
            except threading.BrokenBarrierError:
                return  # alone: no answer
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))

    def accept() -> None:
        for _ in range(4):
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    root = tmp_path / "cg"
    for h in ("cpu", "cpuacct"):
        (root / h).mkdir(parents=True)
    (root / "cpuacct" / "cpuacct.usage").write_text("0")
    pods = []
    for k in range(4):
        pod = _pod(f"uid-{k}")
        pod["metadata"]["name"] = f"j-worker-{k}"
        pod["metadata"]["annotations"] = {"reamer.io/metrics-port": str(srv.getsockname()[1])}
        pods.append(pod)
    agent = Agent(FakeKube(pods), "n1", cgroup_root=root, clock=lambda: 100.0, scrape_host="127.0.0.1")
    try:
        entries = agent.measure()["pods"]
    finally:
        srv.close()
    assert sorted(e["name"] for e in entries if "metrics" in e) == [f"j-worker-{k}" for k in range(4)]


REAL = Path("/sys/fs/cgroup")


def _real_v1_hierarchies() -> tuple[Path, Path]:
    """(cpu, cpuacct) hierarchy roots of the real v1 tree (the same one when co-mounted)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to write cgroups")
    if (REAL / "cgroup.controllers").exists():
        pytest.skip(f"{REAL} is cgroup v2; this test drives the v1 layout")
    for d in ("cpu,cpuacct", "cpuacct,cpu"):
        if (REAL / d).is_dir():
            return REAL / d, REAL / d
    if (REAL / "cpu" / "cpu.stat").exists() and (REAL / "cpuacct" / "cpuacct.usage").exists():
        return REAL / "cpu", REAL / "cpuacct"
    pytest.skip(f"{REAL} has no cgroup-v1 cpu and cpuacct hierarchies")


@pytest.mark.privileged
def test_measure_real_throttled_v1_pod_cgroup():
    # The FakeKube stands in for the API server only; the pod cgroup below is real (kernel
    # accounting and CFS throttling of a busy child process).
    cpu_h, acct_h = _real_v1_hierarchies()
    uid = str(uuid.uuid4())
    rel = Path("kubepods", "burstable", f"pod{uid}")
    hiers = list(dict.fromkeys((cpu_h, acct_h)))
    made: list[Path] = []
    busy = None
    try:
        for h in hiers:
            d = h
            for part in rel.parts:
                d = d / part
                if not d.exists():
                    try:
                        d.mkdir()
                    except OSError as err:
                        pytest.skip(f"cgroups not writable here: {d}: {err}")
                    made.append(d)
        pod_cpu = cpu_h / rel
        (pod_cpu / "cpu.cfs_period_us").write_text("100000")
        (pod_cpu / "cpu.cfs_quota_us").write_text("50000")  # 0.5 core
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for h in hiers:
            (h / rel / "cgroup.procs").write_text(str(busy.pid))
        assert str(busy.pid) in (pod_cpu / "cgroup.procs").read_text().split()

        kube = FakeKube([_pod(uid)])
        agent = Agent(kube, "n1", cgroup_root=REAL)
        agent.measure()
        time.sleep(1.0)
        status = agent.measure()
        assert kube.selectors == ["spec.nodeName=n1"] * 2
        (e,) = status["pods"]
        assert e["uid"] == uid and e["cpuLimit"] == 0.5
        assert 0.3 <= e["cpuUsed"] <= 0.6, e
        assert e["throttledRatio"] > 0.5, e
        assert status["trainingUsed"] == pytest.approx(e["cpuUsed"])
        assert status["windowSeconds"] == pytest.approx(1.0, abs=0.3)
        assert "netGbps" in e  # the busy process's network namespace was read
    finally:
        if busy is not None:
            busy.kill()
            busy.wait(timeout=10)
        for d in reversed(made):  # children first
            deadline = time.monotonic() + 5
            while True:
                try:
                    d.rmdir()
                    break
                except OSError as err:  # the killed process may take a moment to leave
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


def test_summarize_untyped_totals_count_and_empty_families_say_nothing():
    before = {"reamer_a": {"type": "counter", "samples": []},
              "reamer_a_total": {"type": "unknown", "samples": [("reamer_a_total", {}, 10.0)]}}
    now = {"reamer_a": {"type": "counter", "samples": []},
           "reamer_a_total": {"type": "unknown", "samples": [("reamer_a_total", {}, 30.0)]}}
    assert summarize(now, before, 2.0) == {"reamer_a_total": 30.0, "reamer_a_total:rate": 10.0}
