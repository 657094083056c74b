"""The local backend for inference harvesting: replicas of the real ONNX Runtime server
(:mod:`reamer.workloads.real.inference_server`) in cgroups on the training nodes' CPUs, an
endpoints file per service that its clients balance over by the policy's weights
(:mod:`reamer.workloads.real.endpoints`: no proxy hop), and an open-loop load generator per
service whose per-window p99 is what the policy observes.

Implements :class:`reamer.control.HarvestBackend`, like the simulator's ``SimInference``:

* **observe** — per node, training's CPU use (cgroup ``cpu.stat`` of its containers over
  the window), its limits (NEARCHUS trims them to the measured need: the joint loop) and
  requests; per service, the last window's measured rate and p99 (from the load
  generator), the predicted rate (the last two windows, extrapolated, as in the simulator).
* **actuate** — ``PlaceReplica`` starts a server in a new cgroup (quota = cores, cpuset =
  the node's CPUs) and publishes it in the service's endpoints once it listens;
  ``ResizeReplica`` rewrites the quota; ``MigrateReplica`` is make-before-break (new one
  listening and published before the old one leaves the endpoints and stops);
  ``EvictReplica`` removes and stops it.

Replicas listen on the machine's loopback: a replica's node is its cgroup (CPUs), the
testbed's network namespaces model only the training traffic.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reamer.backends.local.cgroups import CgroupExecutor, CpuStats
from reamer.backends.local.cluster import LocalCluster
from reamer.backends.local.procs import Proc, workload_env
from reamer.backends.state import MoveReplica, ReplicaState, ServiceRecord, SetReplicaQuota, StartReplica
from reamer.domain import Decision
from reamer.domain.inference import HarvestDecision, HarvestSnapshot, Replica
from reamer.models.inference import InferenceProfile, routing_weights
from reamer.workloads.real.endpoints import write_endpoints

SERVER_MODULE = "reamer.workloads.real.inference_server"
LOADGEN_MODULE = "reamer.workloads.real.loadgen"
LOAD_MAX_INFLIGHT = 32  # the load generator's sender threads (the serving calibration uses the same)
# The load generator is the measuring apparatus: where it shares a CPU with training, a training
# step's burst delays its sends and receives and the p99 it reports grows
# (bench/experiments/apparatus.py, 6 rounds: vgg_cifar at 60/s, a resnet_narrow step each
# second on its CPU: p99 median +13 %; at this weight, 10x a container's default, median +2 %;
# docs/results.md).
LOAD_CPU_WEIGHT = 1000
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocalService:
    """A service to run: its model (one of the real-workload models), SLO and rate trace
    (one rate per ``window_s``, requests per second)."""

    id: str
    model: str
    slo_p99_s: float
    rates: tuple[float, ...]
    window_s: float = 10.0
    mem_mib_per_replica: float = 512.0


def load_schedule_args(spec: LocalService, seed: int) -> list[str]:
    """The load generator's schedule options for ``spec`` (its rate trace, one rate per window,
    for the trace's length) — what ``loadgen.schedule_of`` turns into the arrival times sent."""
    return ["--rates", ",".join(f"{r:g}" for r in spec.rates), "--interval", f"{spec.window_s:g}", "--seed", str(seed)]


@dataclass
class _Service:
    """What only the local backend has of a service: processes, ports, its endpoints file and
    load generator."""

    spec: LocalService
    endpoints: Path  # the published endpoints file its clients balance over
    procs: dict[str, Proc] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    loadgen: Proc | None = None
    seen: int = 0  # load generator lines consumed
    windows: list[dict] = field(default_factory=list)  # every loadgen window report


class LocalInference:
    """Harvest backend next to a :class:`LocalCluster`, over the shared
    :class:`~reamer.backends.state.ReplicaState` (which books and validates every decision)."""

    def __init__(
        self,
        training: LocalCluster,
        services: Sequence[LocalService],
        *,
        executor: CgroupExecutor,
        workdir: Path,
        profiles: Mapping[str, InferenceProfile],
        system_reserve_cores: float = 0.0,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
        launch_timeout_s: float = 120.0,
        drain_s: float = 1.0,
        seed: int = 0,
        replica_cpus: Sequence[int] | None = None,
        load_cpus: Sequence[int] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.training = training
        self.drain_s = drain_s
        self.replica_cpus = tuple(replica_cpus) if replica_cpus is not None else None  # None: the node's CPUs
        self.load_cpus = tuple(load_cpus) if load_cpus is not None else None  # the load generators' CPUs
        self.cpus: dict[str, tuple[int, ...] | None] = {n: ln.cpus for n, ln in training.local.items()}
        self.executor, self.workdir, self.python, self.clock, self.sleep = executor, Path(workdir), python, clock, sleep
        self.profiles = profiles
        self.reserve = system_reserve_cores
        self.launch_timeout_s = launch_timeout_s
        self.seed = seed
        self.services: dict[str, _Service] = {}
        for s in services:
            if s.model not in profiles:
                raise ValueError(f"service {s.id}: no inference profile for model {s.model!r}")
            path = self.workdir / "endpoints" / f"{s.id}.json"
            write_endpoints(path, [])
            self.services[s.id] = _Service(s, path)
        self.replicas = ReplicaState(training.state, [ServiceRecord(s.id, s.model, s.slo_p99_s, s.mem_mib_per_replica)
                                                      for s in services], training.nodes)
        self._cpu: dict[str, tuple[float, CpuStats]] = {}
        self._load_wanted = self._load_started = False
        self.events: list[tuple[float, str, str]] = []
        self.actuation_errors: list[tuple[float, str, str]] = []  # (t, decision, what failed)
        self.replica_failures: list[tuple[float, str, str]] = []  # (t, replica, exited | stopped answering)
        self.probe_timeout_s = 0.5
        self._misses: dict[str, int] = {}  # replica -> health probes missed in a row

    # ------------------------------------------------------------------ load
    def start_load(self) -> None:
        """Start every service's load generator (open loop, from its rate trace) as soon as
        every service has a replica serving (at once if they have)."""
        self._load_wanted = True
        if all(s.ports for s in self.services.values()):
            self._start_load()

    def _start_load(self) -> None:
        self._load_started = True
        for s in self.services.values():
            spec = s.spec
            name = f"load.{spec.id}"
            self.executor.create(name)  # no quota: accounted apart from the services
            self.executor.set_cpu_weight(name, LOAD_CPU_WEIGHT)
            if self.load_cpus is not None:
                self.executor.set_cpuset(name, self.load_cpus)
            argv = [self.python, "-m", LOADGEN_MODULE, "--endpoints", str(s.endpoints), *load_schedule_args(spec, self.seed),
                    "--window-s", f"{spec.window_s:g}", "--max-inflight", str(LOAD_MAX_INFLIGHT)]
            s.loadgen = Proc(argv, cgroup=name, executor=self.executor, log=self.workdir / "logs" / f"{name}.log",
                             env=workload_env(), clock=self.clock)

    @property
    def load_done(self) -> bool:
        return self._load_started and all(s.loadgen is not None and not s.loadgen.alive()
                                          for s in self.services.values())

    # ------------------------------------------------------------------ joint loop
    def expect(self, decisions: Sequence[Decision]) -> None:
        self.replicas.expect(decisions)

    # ------------------------------------------------------------------ observe
    def _cpu_used(self, cgroup: str, key: str, now: float) -> float | None:
        try:
            st = self.executor.read_stats(cgroup)
        except Exception:
            return None
        prev = self._cpu.get(key)
        self._cpu[key] = (now, st)
        if prev is None or now <= prev[0]:
            return None
        return max(0.0, (st - prev[1]).usage_s / (now - prev[0]))

    def _check_replicas(self, now: float) -> None:
        """A replica whose process died, or that did not answer ``/healthz`` within
        ``probe_timeout_s`` twice in a row (hung, stopped), leaves routing at once and the
        booking: the harvesting policy sees the service short of a replica and replaces it."""
        import urllib.request

        for s in self.services.values():
            for rid in list(s.procs):
                p, port = s.procs[rid], s.ports.get(rid)
                ok = p.alive()
                if ok and port is not None:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                                    timeout=self.probe_timeout_s) as r:
                            ok = r.status == 200
                    except OSError:
                        ok = False
                self._misses[rid] = 0 if ok else self._misses.get(rid, 0) + 1
                if ok or (p.alive() and self._misses[rid] < 2):
                    continue
                why = "exited" if not p.alive() else "stopped answering"
                log.warning("replica %s %s: out of routing, replaced", rid, why)
                self.events.append((now, "ReplicaFailed", f"{rid} {why}"))
                self.replica_failures.append((now, rid, why))
                s.procs.pop(rid)
                s.ports.pop(rid, None)
                self._route(s)
                p.kill()
                p.close()
                self.executor.remove(self._cg(rid), kill=True)
                self.replicas.remove(rid)
                self._misses.pop(rid, None)

    def observe(self, now: float) -> HarvestSnapshot:
        """Training's CPU use per node from its cgroups; its need is its CPU limits (NEARCHUS's
        allocations, trimmed to the measured need in the joint loop); each service's last
        load-generator window. Dead or hung replicas are taken out first."""
        self._check_replicas(now)
        usage = {}
        for node in self.training.nodes:
            used = 0.0
            for c in self.training.running_containers(node.name):
                u = self._cpu_used(LocalCluster.cgroup_name(c.id), c.id, now)
                used += u if u is not None else c.res.cpu
            usage[node.name] = self.replicas.node_usage(node, now, reserve=self.reserve, need=None, used=used)
        for s in self.services.values():
            rec = self.replicas.services[s.spec.id]
            for ln in s.loadgen.since(s.seen) if s.loadgen is not None else ():
                s.seen += 1
                if ln.obj.get("event") == "window":
                    s.windows.append(ln.obj)
                    rec.observed_rates.append((ln.obj["ok"] + ln.obj["errors"]) / s.spec.window_s)
                    # failures count at the client's timeout: a window of errors is a miss, not "no data"
                    p99 = ln.obj.get("p99_with_failures_ms", ln.obj["p99_ms"])
                    rec.last_p99_s = p99 / 1e3 if p99 is not None else None
                    sent = ln.obj["ok"] + ln.obj["errors"]
                    rec.last_error_rate = ln.obj["errors"] / sent if sent else None
        return self.replicas.snapshot(now, usage, {sid: s.spec.rates[0] for sid, s in self.services.items()})

    # ------------------------------------------------------------------ actuate
    def actuate(self, decisions: Sequence[HarvestDecision], now: float) -> None:
        """Book each decision in the shared state (which validates it), then carry it out."""
        touched: set[str] = set()
        for d in decisions:
            e = self.replicas.apply(d)
            s = self.services[e.service]
            if isinstance(e, StartReplica | MoveReplica):
                try:
                    self._start(s, e.replica if isinstance(e, StartReplica) else e.new)
                except Exception as err:  # noqa: BLE001 - one replica's failure is not the run's
                    self.replicas.undo(e)  # it never served: the old replica (if any) still does
                    self._failed(now, d, err)
                    continue
                if isinstance(e, MoveReplica):
                    self._stop(s, e.old.id)  # make (the new one serves) before break (drained, then stopped)
            elif isinstance(e, SetReplicaQuota):
                try:
                    self.executor.set_cpu(self._cg(e.replica.id), e.replica.cores)
                except Exception as err:  # noqa: BLE001 - the quota stays; so does the booking
                    r = e.replica
                    self.replicas.services[e.service].replicas[r.id] = Replica(r.id, r.node, e.before_cores,
                                                                               r.max_batch, r.max_wait_s)
                    self._failed(now, d, err)
                    continue
            else:
                self._stop(s, e.replica.id)
            touched.add(e.service)
            self.events.append((now, type(d).__name__, str(d)))
            log.info("%s", d, extra={"service": e.service, "t": round(now, 3)})
        for sid in touched:
            self._route(self.services[sid])
        if self._load_wanted and not self._load_started and all(s.ports for s in self.services.values()):
            self._start_load()  # the trace starts once every service has a replica serving

    def _failed(self, now: float, d: HarvestDecision, err: Exception) -> None:
        log.warning("carrying out %s failed (%s): the state keeps what runs", d, err)
        self.actuation_errors.append((now, str(d), str(err)))

    def _cg(self, rid: str) -> str:
        return rid.replace("/", ".")

    def _start(self, s: _Service, r: Replica) -> None:
        name = self._cg(r.id)
        self.executor.create(name)
        self.executor.set_cpu(name, r.cores)
        cpus = self.replica_cpus if self.replica_cpus is not None else self.cpus[r.node]
        if cpus is not None:
            self.executor.set_cpuset(name, cpus)
        p = Proc([self.python, "-m", SERVER_MODULE, "--model", s.spec.model, "--max-batch", str(r.max_batch),
                  "--max-wait-ms", f"{r.max_wait_s * 1e3:g}", "--seed", str(self.seed)],
                 cgroup=name, executor=self.executor, log=self.workdir / "logs" / f"{name}.log",
                 env=workload_env(), clock=self.clock)
        try:
            hello = p.wait_for("listening", self.launch_timeout_s)
        except RuntimeError:
            p.kill()
            self.executor.remove(name, kill=True)
            raise
        s.procs[r.id], s.ports[r.id] = p, int(hello["port"])

    def _route(self, s: _Service) -> None:
        """Publish the serving replicas with the routing weights every policy assumes."""
        reps = [r for r in self.replicas.services[s.spec.id].replicas.values() if r.id in s.ports]
        weights = routing_weights(self.profiles[s.spec.model], reps, s.spec.slo_p99_s)
        # a replica that cannot meet the SLO at any load still serves, with a negligible share
        write_endpoints(s.endpoints, [("127.0.0.1", s.ports[r.id], max(w, 1e-9)) for r, w in zip(reps, weights, strict=True)])

    def _stop(self, s: _Service, rid: str) -> None:
        """Take the replica out of the endpoints, let its in-flight requests (and those its
        clients picked before they saw the new file) finish (``drain_s``), then stop it."""
        p = s.procs.pop(rid, None)
        s.ports.pop(rid, None)
        self._route(s)
        if p is not None:
            self.sleep(self.drain_s)
            p.signal(signal.SIGTERM)
            if p.wait(10) is None:
                p.kill()
            p.close()
        self.executor.remove(self._cg(rid), kill=True)

    def replica_metrics(self) -> dict[str, dict[str, float]]:
        """Each serving replica's own counters (its ``/metrics``: requests, samples, ONNX
        Runtime time per batch, latency inside the server), by replica; a replica that does
        not answer is left out."""
        from reamer.workloads.real.serving_metrics import fetch_metrics

        out = {}
        for s in self.services.values():
            for rid, port in s.ports.items():
                try:
                    out[rid] = fetch_metrics(port, timeout_s=5.0)
                except (OSError, ValueError):
                    continue
        return out

    def load_results(self, timeout_s: float = 30.0) -> tuple[dict[str, list[dict]], dict[str, dict]]:
        """After the run: per service, every window its load generator reported (with when it
        arrived, on this backend's clock) and its final report."""
        windows: dict[str, list[dict]] = {}
        finals: dict[str, dict] = {}
        for sid, s in self.services.items():
            windows[sid] = list(s.windows)
            if s.loadgen is None:
                continue
            s.loadgen.wait(timeout_s)
            lines = s.loadgen.since(0)
            windows[sid] = [{**ln.obj, "received_s": round(ln.t, 3)} for ln in lines if ln.obj.get("event") == "window"]
            final = [ln.obj for ln in lines if ln.obj.get("event") == "done"]
            if final:
                finals[sid] = final[-1]
        return windows, finals

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        for s in self.services.values():
            if s.loadgen is not None:
                with contextlib.suppress(Exception):
                    s.loadgen.kill()
                    self.executor.remove(s.loadgen.cgroup, kill=True)
            for rid in list(s.procs):
                with contextlib.suppress(Exception):
                    self._stop(s, rid)

    def __enter__(self) -> LocalInference:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


