"""The local backend for training: testbed hosts are the nodes, cgroups the containers, and
the real PS training job (:mod:`reamer.workloads.real.ps_training`) the workload.

It implements :class:`reamer.control.Backend` exactly as the simulator does, so the same
policy modules drive it:

* **observe** — per running job, over the window since the last observation: training
  speed from the workers' telemetry lines (steps × batch over the time between reports);
  per container CPU used and throttled share from the cgroup (``cpu.stat`` / cpuacct via
  :class:`CgroupExecutor`); network from the host's interface byte counters, against the
  ``tc`` limit of its link (or the node's NIC when unlimited).
* **actuate** — ``StartJob`` creates one cgroup per container (CPU quota, cpuset of the
  node, no memory limit) and starts PS shards, then workers, inside the host's network
  namespace; ``Resize`` rewrites the quota (workers re-tune their threads themselves);
  ``AddContainer`` / ``RemoveContainer`` restart the job with the new shape: workers leave
  after their current step, each PS checkpoints its tensors, the new PS set resumes from
  the checkpoint in its own shard layout (measured cost: ``restart_s`` in the results);
  ``Preempt`` stops it the same way and queues it again, progress kept.

A change of PS or worker count is a restart in real PS frameworks too (TensorFlow's
ClusterSpec is fixed at start); this backend measures what the simulator assumes.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from reamer.backends.local.cgroups import CgroupExecutor, CpuStats
from reamer.backends.local.netns import Testbed
from reamer.backends.local.procs import Proc
from reamer.domain import (
    AddContainer,
    ClusterSnapshot,
    Container,
    ContainerTelemetry,
    Decision,
    JobState,
    JobTelemetry,
    JobView,
    Node,
    Preempt,
    RemoveContainer,
    Resize,
    Resources,
    Role,
    StartJob,
    TrainingJob,
)
from reamer.domain.decisions import InvalidDecision, Placement, check_start

PS_MODULE = "reamer.workloads.real.ps_training"


@dataclass(frozen=True, slots=True)
class LocalNode:
    """A node of the local cluster: testbed host ``host``; its containers share ``cpus``."""

    node: Node
    host: int
    cpus: tuple[int, ...] | None = None
    link_mbit: float | None = None  # tc limit of the host's link; None = unlimited (node.nic_gbps)


@dataclass
class _Job:
    spec: TrainingJob
    state: JobState = JobState.QUEUED
    containers: dict[str, Container] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    next_id: int = 0
    started_s: float | None = None
    last_change_s: float | None = None
    done_s: float | None = None
    queue_s: float = 0.0
    queued_since: float = 0.0
    samples_base: float = 0.0  # samples of earlier incarnations
    start_step: int = 0  # global step this incarnation resumed at
    progress: dict[str, int] = field(default_factory=dict)  # worker container → last reported step
    marks: dict[str, tuple[float, int]] = field(default_factory=dict)  # worker → (t, step) at last observe
    reconfigs: int = 0
    restarts_s: list[float] = field(default_factory=list)  # measured stop→running time of each restart

    @property
    def samples_done(self) -> float:
        return self.samples_base + sum(s - self.start_step for s in self.progress.values()) * self.spec.batch


class LocalCluster:
    """Training backend on one Linux machine. Call :meth:`close` (or use ``with``)."""

    def __init__(
        self,
        nodes: Sequence[LocalNode],
        jobs: Sequence[TrainingJob],
        *,
        executor: CgroupExecutor,
        testbed: Testbed,
        workdir: Path,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
        launch_timeout_s: float = 120.0,
        stop_timeout_s: float = 60.0,
        report_every_s: float = 1.0,
        seed: int = 0,
    ):
        if len({n.node.name for n in nodes}) != len(nodes):
            raise ValueError("nodes: expected unique names")
        self.local = {n.node.name: n for n in nodes}
        self.nodes = tuple(n.node for n in nodes)
        self.free: dict[str, Resources] = {n.name: n.capacity for n in self.nodes}
        self.jobs = {j.id: _Job(j, queued_since=j.arrival_s) for j in sorted(jobs, key=lambda j: j.arrival_s)}
        self.executor, self.testbed, self.workdir = executor, testbed, Path(workdir)
        self.python, self.clock = python, clock
        self.launch_timeout_s, self.stop_timeout_s, self.report_every_s = launch_timeout_s, stop_timeout_s, report_every_s
        self.seed = seed
        self.t0 = clock()
        self._cpu: dict[str, tuple[float, CpuStats]] = {}
        self._net: dict[str, tuple[float, int, int]] = {}
        self._last_observe = 0.0
        self.events: list[tuple[float, str, str]] = []  # (t, job, what) for the report

    # ------------------------------------------------------------------ helpers
    def now(self) -> float:
        return self.clock() - self.t0

    @staticmethod
    def cgroup_name(cid: str) -> str:
        return cid.replace("/", ".")

    def _env(self) -> dict[str, str]:
        src = str(Path(__file__).resolve().parents[3])  # the package's parent: works from a checkout too
        env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONWARNINGS"] = "ignore"
        return env

    def _spawn(self, c: Container, argv: list[str]) -> Proc:
        name = self.cgroup_name(c.id)
        self.executor.create(name)
        self.executor.set_cpu(name, c.res.cpu)
        cpus = self.local[c.node].cpus
        if cpus is not None:
            self.executor.set_cpuset(name, cpus)
        host = self.local[c.node].host
        return Proc(self.testbed.exec_argv(host, [self.python, "-m", PS_MODULE, *argv]), cgroup=name,
                    executor=self.executor, log=self.workdir / "logs" / f"{name}.log", env=self._env(),
                    clock=self.clock)

    def _ckpt(self, j: _Job) -> Path:
        return self.workdir / "checkpoints" / j.spec.id

    # ------------------------------------------------------------------ lifecycle
    def _launch(self, j: _Job) -> None:
        """Start the job's current containers: PS shards, then workers (resuming if a
        checkpoint exists). Blocks until every worker has connected."""
        ps = sorted((c for c in j.containers.values() if c.role is Role.PS), key=lambda c: c.id)
        ws = sorted((c for c in j.containers.values() if c.role is Role.WORKER), key=lambda c: c.id)
        ckpt = self._ckpt(j)
        resume = ["--resume", str(ckpt)] if any(ckpt.glob("shard-*.npz")) else []
        addrs, versions = [], []
        for k, c in enumerate(ps):
            ip = self.testbed.ip(self.local[c.node].host)
            p = self._spawn(c, ["ps", "--host", ip, "--port", "0", "--shard", str(k), "--shards", str(len(ps)),
                                "--workers", str(len(ws)), "--model", j.spec.model, "--seed", str(self.seed),
                                "--checkpoint", str(ckpt), "--report-every", "0", *resume])
            j.procs[c.id] = p
        for k, c in enumerate(ps):
            hello = j.procs[c.id].wait_for("listening", self.launch_timeout_s)
            addrs.append(f"{self.testbed.ip(self.local[c.node].host)}:{hello['port']}")
            versions.append(int(hello.get("version", 0)))
        j.start_step = min(versions)
        remaining = max(0.0, j.spec.samples - j.samples_base)
        target = j.start_step + max(1, math.ceil(remaining / (j.spec.batch * len(ws))))
        for i, c in enumerate(ws):
            j.procs[c.id] = self._spawn(c, ["worker", "--ps", ",".join(addrs), "--model", j.spec.model,
                                            "--seed", str(self.seed), "--steps", str(target), "--worker-id", str(i),
                                            "--batch", str(j.spec.batch), "--report-every", "0",
                                            "--report-every-s", f"{self.report_every_s:g}",
                                            "--connect-timeout", f"{self.launch_timeout_s:g}"])
        for c in ws:
            j.procs[c.id].wait_for("connected", self.launch_timeout_s)
        j.progress = {c.id: j.start_step for c in ws}
        j.marks = {}

    def _stop(self, j: _Job) -> None:
        """Workers leave after their current step (SIGTERM), then each PS checkpoints and
        exits; anything still running after ``stop_timeout_s`` is killed."""
        workers = [cid for cid, c in j.containers.items() if c.role is Role.WORKER and cid in j.procs]
        for cid in workers:
            j.procs[cid].signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for cid, p in list(j.procs.items()):
            if p.wait(max(0.1, deadline - time.monotonic())) is None:
                p.kill()
        self._collect(j)
        self._release(j)

    def _release(self, j: _Job) -> None:
        """Close every process of the job and remove its cgroups."""
        for cid, p in list(j.procs.items()):
            if p.alive():
                p.kill()
            p.close()
            self.executor.remove(self.cgroup_name(cid), kill=True)
            self._cpu.pop(cid, None)
        j.procs.clear()

    def _collect(self, j: _Job) -> bool:
        """Read the workers' progress; True when every worker reported ``done``."""
        done = True
        for cid, c in j.containers.items():
            if c.role is not Role.WORKER or cid not in j.procs:
                continue
            finished = False
            for ln in j.procs[cid].since(0):
                if "step" in ln.obj and ln.obj.get("event") in ("interval", "done", "stopped"):
                    j.progress[cid] = max(j.progress.get(cid, j.start_step), int(ln.obj["step"]))
                finished |= ln.obj.get("event") == "done"
            done &= finished
        return done and bool(j.progress)

    def _restart(self, j: _Job, now: float, drop: Container | None = None) -> None:
        """Apply a new shape (``drop`` leaves it): stop (checkpoint), bank the progress, start again."""
        t = time.monotonic()
        self._stop(j)
        j.samples_base = j.samples_done
        j.progress = {}
        if drop is not None:
            del j.containers[drop.id]
            self.free[drop.node] = self.free[drop.node] + drop.res
        self._launch(j)
        j.restarts_s.append(time.monotonic() - t)
        j.last_change_s = self.now()
        j.reconfigs += 1

    # ------------------------------------------------------------------ observe
    def observe(self, now: float) -> ClusterSnapshot:
        since = self._last_observe
        for j in self.jobs.values():
            if j.state is JobState.RUNNING and self._collect(j):
                self._finish(j, now)
        tel: dict[str, JobTelemetry] = {}
        host_net = self._host_net(now)
        for j in self.jobs.values():
            if j.state is JobState.RUNNING:
                speed = self._speed(j, now)
                containers = self._containers(j, now, host_net)
                if speed is not None:  # no worker report in the window (starting): no measurement
                    tel[j.spec.id] = JobTelemetry(since, speed, containers)
        self._last_observe = now
        running = tuple(self._view(j, now) for j in self.jobs.values() if j.state is JobState.RUNNING)
        queue = tuple(self._view(j, now) for j in self.jobs.values()
                      if j.state is JobState.QUEUED and j.spec.arrival_s <= now)
        return ClusterSnapshot(now, self.nodes, MappingProxyType(dict(self.free)), queue, running,
                               MappingProxyType(tel))

    def _view(self, j: _Job, now: float) -> JobView:
        return JobView(j.spec, j.state, tuple(j.containers.values()), j.samples_done, now, j.started_s,
                       j.last_change_s)

    def _speed(self, j: _Job, now: float) -> float | None:
        """Samples/s over the window: each worker's steps between its last report before the
        window and its last report in it, over the time between those reports. None when
        no worker has reported twice yet in this incarnation."""
        total, measured = 0.0, False
        for cid, p in j.procs.items():
            if j.containers[cid].role is not Role.WORKER:
                continue
            reports = [(ln.t - self.t0, int(ln.obj["step"])) for ln in p.since(0)
                       if ln.obj.get("event") == "interval" and "step" in ln.obj]
            if not reports:
                continue
            last = reports[-1]
            first = j.marks.get(cid) or reports[0]
            if last[0] > first[0]:
                total += (last[1] - first[1]) * j.spec.batch / (last[0] - first[0])
                measured = True
            j.marks[cid] = last
        return total if measured else None

    def _host_net(self, now: float) -> dict[str, float]:
        """Gbit/s of each node's link over the window, both directions summed: a PS step's
        pull and push run one after the other, so the link is busy for (rx + tx) / rate —
        the same traffic the speed model counts against the link (DESIGN.md §3.1)."""
        out = {}
        for name, ln in self.local.items():
            rx, tx = self.testbed.link_bytes(ln.host)
            prev = self._net.get(name)
            self._net[name] = (now, rx, tx)
            if prev is not None and now > prev[0]:
                out[name] = 8.0 * ((rx - prev[1]) + (tx - prev[2])) / (now - prev[0]) / 1e9
        return out

    def _capacity_gbps(self, node: str) -> float:
        ln = self.local[node]
        return ln.link_mbit / 1e3 if ln.link_mbit else ln.node.nic_gbps

    def _containers(self, j: _Job, now: float, host_net: Mapping[str, float]) -> dict[str, ContainerTelemetry]:
        out = {}
        for cid, c in j.containers.items():
            if cid not in j.procs:
                continue
            st = self.executor.read_stats(self.cgroup_name(cid))
            prev = self._cpu.get(cid)
            self._cpu[cid] = (now, st)
            if prev is None or now <= prev[0]:
                continue
            d = st - prev[1]
            out[cid] = ContainerTelemetry(
                cpu_used=max(0.0, d.usage_s / (now - prev[0])),
                cpu_limit=c.res.cpu,
                throttled_ratio=d.nr_throttled / d.nr_periods if d.nr_periods > 0 else 0.0,
                net_gbps=host_net.get(c.node, 0.0),
                net_capacity_gbps=self._capacity_gbps(c.node),
            )
        return out

    def _finish(self, j: _Job, now: float) -> None:
        deadline = time.monotonic() + self.stop_timeout_s
        for p in j.procs.values():  # the PS shards exit by themselves after the last BYE
            if p.wait(max(0.1, deadline - time.monotonic())) is None:
                p.kill()
        j.samples_base = j.samples_done
        j.progress = {}
        self._release(j)
        for c in j.containers.values():
            self.free[c.node] = self.free[c.node] + c.res
        j.state = JobState.DONE
        j.done_s = now
        self.events.append((now, j.spec.id, "done"))

    # ------------------------------------------------------------------ actuate
    def actuate(self, decisions: Sequence[Decision], now: float) -> None:
        for d in decisions:
            if isinstance(d, StartJob):
                self._start(d, now)
            elif isinstance(d, Resize):
                self._resize(d, now)
            elif isinstance(d, AddContainer):
                self._add(d, now)
            elif isinstance(d, RemoveContainer):
                self._remove(d, now)
            elif isinstance(d, Preempt):
                self._preempt(d, now)
            else:  # pragma: no cover - typing guards this
                raise InvalidDecision(f"unknown decision {d!r}")

    def _job(self, jid: str, state: JobState) -> _Job:
        j = self.jobs.get(jid)
        if j is None or j.state is not state:
            raise InvalidDecision(f"job {jid} is not {state.value}")
        return j

    def _owner(self, cid: str) -> tuple[_Job, Container]:
        for j in self.jobs.values():
            if cid in j.containers and j.state is JobState.RUNNING:
                return j, j.containers[cid]
        raise InvalidDecision(f"unknown container {cid}")

    def _place(self, j: _Job, p: Placement) -> Container:
        if p.node not in self.free:
            raise InvalidDecision(f"unknown node {p.node}")
        if not p.res.fits_in(self.free[p.node]) or p.res.cpu <= 0:
            raise InvalidDecision(f"{p.res} does not fit on {p.node} (free {self.free[p.node]})")
        self.free[p.node] = self.free[p.node] - p.res
        cid = f"{j.spec.id}/{p.role.value}{j.next_id}"
        j.next_id += 1
        c = Container(cid, j.spec.id, p.role, p.node, p.res, self.local[p.node].cpus)
        j.containers[cid] = c
        return c

    def _start(self, d: StartJob, now: float) -> None:
        j = self._job(d.job, JobState.QUEUED)
        check_start(d, self.free)
        for p in d.placements:
            self._place(j, p)
        j.state = JobState.RUNNING
        j.queue_s += now - j.queued_since
        j.started_s = now if j.started_s is None else j.started_s
        j.last_change_s = now
        self._launch(j)
        self.events.append((now, j.spec.id, f"start {len(d.placements)} containers"))

    def _resize(self, d: Resize, now: float) -> None:
        j, c = self._owner(d.container)
        free = self.free[c.node] + c.res
        if not d.res.fits_in(free) or d.res.cpu <= 0:
            raise InvalidDecision(f"resize {c.id} to {d.res}: does not fit on {c.node}")
        self.executor.set_cpu(self.cgroup_name(c.id), d.res.cpu)
        self.free[c.node] = free - d.res
        j.containers[c.id] = Container(c.id, c.owner, c.role, c.node, d.res, c.cpuset)
        j.last_change_s = now
        j.reconfigs += 1
        self.events.append((now, j.spec.id, f"resize {c.id} to {d.res.cpu:g} cores"))

    def _add(self, d: AddContainer, now: float) -> None:
        j = self._job(d.job, JobState.RUNNING)
        c = self._place(j, d.placement)
        self.events.append((now, j.spec.id, f"add {c.role.value} on {c.node}"))
        self._restart(j, now)

    def _remove(self, d: RemoveContainer, now: float) -> None:
        j, c = self._owner(d.container)
        if sum(1 for x in j.containers.values() if x.role is c.role) <= 1:
            raise InvalidDecision(f"remove {c.id}: a job keeps at least one {c.role.value}")
        self.events.append((now, j.spec.id, f"remove {c.id}"))
        self._restart(j, now, drop=c)

    def _preempt(self, d: Preempt, now: float) -> None:
        j = self._job(d.job, JobState.RUNNING)
        self._stop(j)
        j.samples_base = j.samples_done
        j.progress = {}
        for c in j.containers.values():
            self.free[c.node] = self.free[c.node] + c.res
        j.containers.clear()
        j.state, j.queued_since = JobState.QUEUED, now
        self.events.append((now, j.spec.id, "preempted"))

    # ------------------------------------------------------------------ end
    @property
    def finished(self) -> bool:
        return all(j.state is JobState.DONE for j in self.jobs.values())

    def close(self) -> None:
        """Stop every process and remove every cgroup this backend created (idempotent)."""
        for j in self.jobs.values():
            with contextlib.suppress(Exception):
                self._release(j)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
