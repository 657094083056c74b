"""LocalInference's accounting, without processes: what the harvesting policy sees of a node
(training limits, plus what training is about to take in the joint round)."""

from __future__ import annotations

from pathlib import Path

from reamer.backends.local.cluster import LocalNode
from reamer.backends.local.inference import LOAD_CPU_WEIGHT, LocalInference, LocalService, load_schedule_args
from reamer.backends.state import ClusterState
from reamer.domain import AddContainer, Node, Resize, Resources, Role, StartJob, TrainingJob
from reamer.domain.decisions import Placement
from reamer.models.inference import InferenceProfile
from reamer.workloads.real.loadgen import poisson_arrivals, schedule_of


class NoStats:
    def read_stats(self, name):
        raise OSError("no cgroup in this test")


class FakeTraining:
    """What LocalInference reads of training: the shared state (one running job: its worker on
    ``a``, its PS on ``b``), the nodes, and which containers run (all of them)."""

    def __init__(self):
        self.local = {n: LocalNode(Node(n, 2.0, 4096), i) for i, n in enumerate(("a", "b"))}
        self.nodes = tuple(ln.node for ln in self.local.values())
        self.state = ClusterState(self.nodes)
        self.state.submit(TrainingJob("j", "small_cnn", 0, 100, 1, 1, Resources(0.5), Resources(1.0)), 0.0)
        self.state.submit(TrainingJob("k", "small_cnn", 0, 100, 1, 1, Resources(0.5), Resources(1.0)), 0.0)
        self.state.apply(StartJob("j", (Placement(Role.PS, "b", Resources(0.5)),
                                        Placement(Role.WORKER, "a", Resources(1.0)))), 0.0)

    def running_containers(self, node):
        return self.state.containers_on(node)


class Recording(NoStats):
    """Records cgroup calls; processes stay where they are (no cgroup in this test)."""

    def __init__(self):
        self.calls: list[tuple] = []

    def create(self, name):
        self.calls.append(("create", name))

    def set_cpu_weight(self, name, weight):
        self.calls.append(("weight", name, weight))

    def set_cpuset(self, name, cpus):
        self.calls.append(("cpuset", name, tuple(cpus)))

    def add_process(self, name, pid):
        pass

    def remove(self, name, kill=False):
        self.calls.append(("remove", name))


def _inference(tmp_path: Path, executor=None, **kw) -> LocalInference:
    prof = {"m": InferenceProfile("m", 0.001, 0.002, 0.8, (), "", 0.0)}
    return LocalInference(FakeTraining(), [LocalService("s", "m", 0.1, (5.0,))], executor=executor or NoStats(),
                          workdir=tmp_path, profiles=prof, system_reserve_cores=0.25, **kw)


def test_load_generator_gets_priority_on_its_cpus(tmp_path):
    """The load generator measures the service: training on its CPU must not delay it."""
    ex = Recording()
    inf = _inference(tmp_path, ex, python="true", load_cpus=[0])
    try:
        inf.services["s"].ports["s/r0"] = 1  # a replica serving: the trace starts at once
        inf.start_load()
        assert ex.calls[:3] == [("create", "load.s"), ("weight", "load.s", LOAD_CPU_WEIGHT), ("cpuset", "load.s", (0,))]
        assert LOAD_CPU_WEIGHT > 100  # above a container's default weight
    finally:
        inf.close()


def test_node_usage_counts_training_limits_and_requests(tmp_path):
    inf = _inference(tmp_path)
    try:
        snap = inf.observe(1.0)
        a, b = snap.usage["a"], snap.usage["b"]
        assert (a.training_limit, a.training_request, a.training_used, a.system_reserve) == (1.0, 1.0, 1.0, 0.25)
        assert (b.training_limit, b.training_request) == (0.5, 0.5)
        assert snap.services[0].predicted_rate_per_s == 5.0 and snap.services[0].replicas == ()
    finally:
        inf.close()


def test_expected_growth_counts_before_training_actuates_then_clears(tmp_path):
    inf = _inference(tmp_path)
    try:
        inf.expect([Resize("j/worker1", Resources(1.5)),
                    AddContainer("j", Placement(Role.PS, "b", Resources(0.5))),
                    StartJob("k", (Placement(Role.WORKER, "b", Resources(1.0)),)),
                    Resize("j/worker1", Resources(0.5))])  # a shrink frees nothing until it happened
        snap = inf.observe(2.0)
        assert (snap.usage["a"].training_limit, snap.usage["a"].training_need) == (1.5, 1.5)
        assert (snap.usage["b"].training_limit, snap.usage["b"].training_request) == (2.0, 2.0)
        assert inf.observe(3.0).usage["b"].training_limit == 0.5  # one round only
    finally:
        inf.close()


def test_replica_metrics_reads_each_serving_replica_and_skips_silent_ones(tmp_path):
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"# HELP x\nreamer_infer_run_seconds_sum 0.5\nreamer_infer_run_seconds_count 50\n"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        silent = closed.getsockname()[1]
    inf = _inference(tmp_path)
    try:
        inf.services["s"].ports.update({"s/r0": srv.server_address[1], "s/r1": silent})
        got = inf.replica_metrics()
        assert got == {"s/r0": {"reamer_infer_run_seconds_sum": 0.5, "reamer_infer_run_seconds_count": 50.0}}
    finally:
        inf.services["s"].ports.clear()
        inf.close()
        srv.shutdown()


def test_the_load_generators_schedule_is_the_services_trace_for_its_length():
    spec = LocalService("svc", "vgg_cifar", 0.25, (10.0, 0.0, 30.0), window_s=5.0)
    assert schedule_of(load_schedule_args(spec, 3)) == poisson_arrivals([10.0, 0.0, 30.0], 5.0, 15.0, seed=3)


def test_a_dead_or_silent_replica_leaves_routing_and_the_state(tmp_path):
    """A replica process that exited goes at once; one that stops answering /healthz (hung,
    SIGSTOPped) goes after two missed probes. Either leaves the endpoints and the booking."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from reamer.domain.inference import Replica

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            return None

    srv = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, never answers: a stopped process

    class P:
        def __init__(self, alive):
            self._alive = alive

        def alive(self):
            return self._alive

        def kill(self):
            self._alive = False

        def close(self):
            pass

    inf = _inference(tmp_path, Recording())
    try:
        s, rec = inf.services["s"], inf.replicas.services["s"]
        ports = {"s/r0": srv.server_address[1], "s/r1": silent.getsockname()[1], "s/r2": srv.server_address[1]}
        for rid, alive in (("s/r0", True), ("s/r1", True), ("s/r2", False)):
            rec.replicas[rid] = Replica(rid, "a", 1.0, 1, 0.0)
            inf.replicas.owner[rid] = "s"
            s.procs[rid], s.ports[rid] = P(alive), ports[rid]
        inf.probe_timeout_s = 0.2
        inf.observe(1.0)
        assert sorted(s.procs) == ["s/r0", "s/r1"] and sorted(rec.replicas) == ["s/r0", "s/r1"]  # the dead one
        inf.observe(2.0)
        assert sorted(s.procs) == ["s/r0"] and sorted(rec.replicas) == ["s/r0"]  # the silent one, second miss
        assert [f[1:] for f in inf.replica_failures] == [("s/r2", "exited"), ("s/r1", "stopped answering")]
        assert str(ports["s/r1"]) not in s.endpoints.read_text()
    finally:
        srv.shutdown()
        silent.close()
        inf.close()
