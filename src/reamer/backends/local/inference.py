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
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reamer.backends.local.cgroups import CgroupExecutor, CpuStats
from reamer.backends.local.cluster import LocalCluster, LocalNode
from reamer.backends.local.procs import Proc
from reamer.domain import AddContainer, Decision, Resize, Role, StartJob
from reamer.domain.decisions import InvalidDecision
from reamer.domain.inference import (
    EvictReplica,
    HarvestDecision,
    HarvestSnapshot,
    MigrateReplica,
    NodeUsage,
    PlaceReplica,
    Replica,
    ResizeReplica,
    ServiceState,
)
from reamer.models.inference import InferenceProfile, capacity_per_replica
from reamer.workloads.real.endpoints import write_endpoints

SERVER_MODULE = "reamer.workloads.real.inference_server"
LOADGEN_MODULE = "reamer.workloads.real.loadgen"
LOAD_MAX_INFLIGHT = 32  # the load generator's sender threads (the serving calibration uses the same)
# The load generator is the measuring apparatus: where it shares a CPU with training, a training
# step's burst delays its sends and receives and the p99 it reports grows (bench/apparatus.py,
# 6 rounds: vgg_cifar at 60/s, a resnet_narrow step each second on its CPU: p99 median +13 %;
# at this weight, 10x a container's default, median +1 %; docs/results.md).
LOAD_CPU_WEIGHT = 1000


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
    spec: LocalService
    endpoints: Path  # the published endpoints file its clients balance over
    replicas: dict[str, Replica] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    next_id: int = 0
    loadgen: Proc | None = None
    seen: int = 0  # window lines consumed
    windows: list[dict] = field(default_factory=list)  # every loadgen window report


class LocalInference:
    """Harvest backend next to a :class:`LocalCluster` (which it reads training usage from)."""

    def __init__(
        self,
        training: LocalCluster,
        services: Sequence[LocalService],
        *,
        executor: CgroupExecutor,
        workdir: Path,
        profiles: dict[str, InferenceProfile],
        system_reserve_cores: float = 0.0,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
        launch_timeout_s: float = 120.0,
        drain_s: float = 1.0,
        seed: int = 0,
        replica_cpus: Sequence[int] | None = None,
        load_cpus: Sequence[int] | None = None,
    ):
        self.training = training
        self.drain_s = drain_s
        self.replica_cpus = tuple(replica_cpus) if replica_cpus is not None else None  # None: the node's CPUs
        self.load_cpus = tuple(load_cpus) if load_cpus is not None else None  # the load generators' CPUs
        self.local: dict[str, LocalNode] = training.local
        self.executor, self.workdir, self.python, self.clock = executor, Path(workdir), python, clock
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
        self.owner: dict[str, str] = {}  # replica → service
        self._cpu: dict[str, tuple[float, CpuStats]] = {}
        self._expected: dict[str, float] = {}  # node → CPU training is about to take (joint loop)
        self._load_wanted = self._load_started = False
        self.events: list[tuple[float, str, str]] = []

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
                             env=self.training._env(), clock=self.clock)

    @property
    def load_done(self) -> bool:
        return self._load_started and all(s.loadgen is not None and not s.loadgen.alive()
                                          for s in self.services.values())

    # ------------------------------------------------------------------ joint loop
    def expect(self, decisions: Sequence[Decision]) -> None:
        """Training decided these and applies them right after this harvest round: CPU they
        add on a node counts as training's from now (released CPU counts only once freed)."""
        current = {c.id: c for j in self.training.jobs.values() for c in j.containers.values()}
        grow: dict[str, float] = {}
        for d in decisions:
            if isinstance(d, StartJob):
                for p in d.placements:
                    grow[p.node] = grow.get(p.node, 0.0) + p.res.cpu
            elif isinstance(d, AddContainer):
                grow[d.placement.node] = grow.get(d.placement.node, 0.0) + d.placement.res.cpu
            elif isinstance(d, Resize) and d.container in current:
                c = current[d.container]
                grow[c.node] = grow.get(c.node, 0.0) + max(0.0, d.res.cpu - c.res.cpu)
        self._expected = grow

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

    def observe(self, now: float) -> HarvestSnapshot:
        usage = {}
        for name, ln in self.local.items():
            cont = [c for j in self.training.jobs.values() for c in j.containers.values()
                    if c.node == name and c.id in j.procs]
            used = 0.0
            for c in cont:
                u = self._cpu_used(LocalCluster.cgroup_name(c.id), c.id, now)
                used += u if u is not None else c.res.cpu
            limits = sum(c.res.cpu for c in cont) + self._expected.get(name, 0.0)
            request = sum((self.training.jobs[c.owner].spec.worker_res if c.role is Role.WORKER
                           else self.training.jobs[c.owner].spec.ps_res).cpu for c in cont)
            usage[name] = NodeUsage(name, ln.node.cores, self.reserve, limits, request, now, training_used=used,
                                    mem_used_mib=sum(c.res.mem_mib for c in cont), training_limit=limits)
        self._expected = {}
        services = []
        for s in self.services.values():
            if s.loadgen is not None:
                for ln in s.loadgen.since(s.seen):
                    s.seen += 1
                    if ln.obj.get("event") == "window":
                        s.windows.append(ln.obj)
            rates = [(w["ok"] + w["errors"]) / s.spec.window_s for w in s.windows[-2:]]
            if rates:
                r1, r2 = rates[-1], rates[0]
                pred = max(r1, r1 + (r1 - r2))
            else:
                pred = s.spec.rates[0]
            p99 = s.windows[-1]["p99_ms"] / 1e3 if s.windows and s.windows[-1]["p99_ms"] is not None else None
            services.append(ServiceState(s.spec.id, s.spec.model, s.spec.slo_p99_s, pred, tuple(s.replicas.values()),
                                         p99, s.spec.mem_mib_per_replica))
        return HarvestSnapshot(now, self.training.nodes, usage, tuple(services), pool="inference")

    # ------------------------------------------------------------------ actuate
    def actuate(self, decisions: Sequence[HarvestDecision], now: float) -> None:
        touched: set[str] = set()
        for d in decisions:
            if isinstance(d, PlaceReplica):
                s = self.services.get(d.service)
                if s is None or d.node not in self.local or d.cores <= 0:
                    raise InvalidDecision(f"place {d}: unknown service or node, or no cores")
                self._start(s, Replica(f"{s.spec.id}/r{s.next_id}", d.node, d.cores, d.max_batch, d.max_wait_s))
                s.next_id += 1
                touched.add(s.spec.id)
            elif isinstance(d, ResizeReplica):
                s, r = self._replica(d.replica)
                self.executor.set_cpu(self._cg(r.id), d.cores)
                s.replicas[r.id] = Replica(r.id, r.node, d.cores, r.max_batch, r.max_wait_s)
                touched.add(s.spec.id)
            elif isinstance(d, MigrateReplica):
                s, r = self._replica(d.replica)
                if d.to_node not in self.local:
                    raise InvalidDecision(f"migrate {r.id}: unknown node {d.to_node}")
                self._start(s, Replica(f"{s.spec.id}/r{s.next_id}", d.to_node, r.cores, r.max_batch, r.max_wait_s))
                s.next_id += 1
                self._stop(s, r.id)  # make (the new one serves) before break (drained, then stopped)
                touched.add(s.spec.id)
            elif isinstance(d, EvictReplica):
                s, r = self._replica(d.replica)
                self._stop(s, r.id)
                touched.add(s.spec.id)
            self.events.append((now, type(d).__name__, str(d)))
        for sid in touched:
            self._route(self.services[sid])
        if self._load_wanted and not self._load_started and all(s.ports for s in self.services.values()):
            self._start_load()  # the trace starts once every service has a replica serving

    def _cg(self, rid: str) -> str:
        return rid.replace("/", ".")

    def _replica(self, rid: str) -> tuple[_Service, Replica]:
        sid = self.owner.get(rid)
        if sid is None or rid not in self.services[sid].replicas:
            raise InvalidDecision(f"unknown replica {rid}")
        s = self.services[sid]
        return s, s.replicas[rid]

    def _start(self, s: _Service, r: Replica) -> None:
        name = self._cg(r.id)
        self.executor.create(name)
        self.executor.set_cpu(name, r.cores)
        cpus = self.replica_cpus if self.replica_cpus is not None else self.local[r.node].cpus
        if cpus is not None:
            self.executor.set_cpuset(name, cpus)
        p = Proc([self.python, "-m", SERVER_MODULE, "--model", s.spec.model, "--max-batch", str(r.max_batch),
                  "--max-wait-ms", f"{r.max_wait_s * 1e3:g}", "--seed", str(self.seed)],
                 cgroup=name, executor=self.executor, log=self.workdir / "logs" / f"{name}.log",
                 env=self.training._env(), clock=self.clock)
        try:
            hello = p.wait_for("listening", self.launch_timeout_s)
        except RuntimeError:
            p.kill()
            self.executor.remove(name, kill=True)
            raise
        s.procs[r.id], s.ports[r.id], s.replicas[r.id] = p, int(hello["port"]), r
        self.owner[r.id] = s.spec.id

    def _route(self, s: _Service) -> None:
        """Weights = each replica's capacity at the SLO (the routing every policy assumes)."""
        reps = [r for r in s.replicas.values() if r.id in s.ports]
        caps = [capacity_per_replica(self.profiles[s.spec.model], r.cores, int(r.max_batch), float(r.max_wait_s),
                                     s.spec.slo_p99_s) for r in reps]
        if sum(caps) <= 0:
            caps = [1.0] * len(reps)
        write_endpoints(s.endpoints, [("127.0.0.1", s.ports[r.id], c) for r, c in zip(reps, caps, strict=True)])

    def _stop(self, s: _Service, rid: str) -> None:
        """Take the replica out of the endpoints, let its in-flight requests (and those its
        clients picked before they saw the new file) finish (``drain_s``), then stop it."""
        s.replicas.pop(rid, None)
        self._route(s)
        p = s.procs.pop(rid, None)
        s.ports.pop(rid, None)
        self.owner.pop(rid, None)
        if p is not None:
            time.sleep(self.drain_s)
            p.signal(signal.SIGTERM)
            if p.wait(10) is None:
                p.kill()
            p.close()
        self.executor.remove(self._cg(rid), kill=True)

    def replica_metrics(self) -> dict[str, dict[str, float]]:
        """Each serving replica's own counters (its ``/metrics``: requests, samples, ONNX
        Runtime time per batch, latency inside the server), by replica; a replica that does
        not answer is left out."""
        from reamer.workloads.real.inference_server import fetch_metrics

        out = {}
        for s in self.services.values():
            for rid, port in s.ports.items():
                try:
                    out[rid] = fetch_metrics(port, timeout_s=5.0)
                except (OSError, ValueError):
                    continue
        return out

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


