"""The local backend for training: testbed hosts are the nodes, cgroups the containers, and
the real PS training job (:mod:`reamer.workloads.real.ps_training`) the workload.

It implements :class:`reamer.control.Backend` exactly as the simulator does, over the same
shared :class:`~reamer.backends.state.ClusterState` (which books and validates every
decision), so the same policy modules drive it. What it keeps itself is what only it has:
processes, cgroups, checkpoints and the measurements read from them.

* **observe** — per running job, over the window since the last observation: training
  speed from the workers' telemetry lines (steps × batch over the time between reports);
  per container CPU used and throttled share from the cgroup (``cpu.stat`` / cpuacct via
  :class:`CgroupExecutor`); network from the host's interface byte counters, against the
  ``tc`` limit of its link (or the node's NIC when unlimited).
* **actuate** — a :class:`Launch` creates one cgroup per container (CPU quota, cpuset of the
  node, no memory limit) and starts PS shards, then workers, inside the host's network
  namespace; a :class:`SetQuota` rewrites the quota (workers re-tune their threads
  themselves); a :class:`Reshape` restarts the job with the new shape: workers leave after
  their current step, each PS checkpoints its tensors, the new PS set resumes from the
  checkpoint in its own shard layout (measured cost: ``restart_s`` in the results); a
  :class:`Stop` (preemption) stops it the same way, progress kept.

A change of PS or worker count is a restart in real PS frameworks too (TensorFlow's
ClusterSpec is fixed at start); this backend measures what the simulator assumes.

With a ``record`` (the run's identity), what runs where is written to ``run.json`` in
``workdir`` after every observe and actuate (:mod:`~reamer.backends.local.runstate`); a
later controller on the same folder calls :meth:`LocalCluster.resume` with it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reamer.backends.local.cgroups import CgroupExecutor, CpuStats
from reamer.backends.local.netns import Testbed
from reamer.backends.local.procs import Proc, read_telemetry, workload_env
from reamer.backends.local.runstate import ContainerRecord, JobRecordFile, ProcRecord, RunState, write_state
from reamer.backends.state import ClusterState, Effect, JobRecord, Launch, Reshape, SetQuota
from reamer.domain import ClusterSnapshot, Container, ContainerTelemetry, Decision, JobState, JobTelemetry
from reamer.domain import Node, Resources, Role, TrainingJob
from reamer.workloads.real.ps_training import read_manifest

PS_MODULE = "reamer.workloads.real.ps_training"
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocalNode:
    """A node of the local cluster: testbed host ``host``; its containers share ``cpus``."""

    node: Node
    host: int
    cpus: tuple[int, ...] | None = None
    link_mbit: float | None = None  # tc limit of the host's link; None = unlimited (node.nic_gbps)


@dataclass
class _Run:
    """The processes of one job's current incarnation and the progress they reported."""

    procs: dict[str, Proc] = field(default_factory=dict)
    samples_base: float = 0.0  # samples of earlier incarnations
    start_step: int = 0  # global step this incarnation resumed at
    reached: int = 0  # the step reached before the last failure
    progress: dict[str, int] = field(default_factory=dict)  # worker container → last reported step
    marks: dict[str, tuple[float, int]] = field(default_factory=dict)  # worker → (t, step) at last observe

    def samples_done(self, batch: int) -> float:
        return self.samples_base + sum(s - self.start_step for s in self.progress.values()) * batch


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
        checkpoint_every: int = 20,
        max_restarts: int = 3,
        restart_backoff_s: float = 2.0,
        record: RunState | None = None,
        t_offset: float = 0.0,
        hung_after_s: float = 30.0,
    ):
        self.local = {n.node.name: n for n in nodes}
        self.state = ClusterState([n.node for n in nodes], {n.node.name: n.cpus for n in nodes})
        self.nodes = self.state.nodes
        self.pending = sorted(jobs, key=lambda j: j.arrival_s)  # not arrived yet
        self.runs: dict[str, _Run] = {j.id: _Run() for j in jobs}
        self.executor, self.testbed, self.workdir = executor, testbed, Path(workdir)
        self.python, self.clock = python, clock
        self.launch_timeout_s, self.stop_timeout_s, self.report_every_s = launch_timeout_s, stop_timeout_s, report_every_s
        self.seed = seed
        self.t0 = clock() - t_offset  # a resumed run's timeline goes on from its first start
        self.record = record  # the run's identity: with it, the durable run.json is kept
        self._cpu: dict[str, tuple[float, CpuStats]] = {}
        self._net: dict[str, tuple[float, int, int]] = {}
        self._last_observe = 0.0
        self.restarts_s: list[float] = []  # measured stop → running time of each restart
        self.actuation_errors: list[tuple[float, str, str]] = []  # (t, job, what failed): reconciled next round
        self.checkpoint_every, self.max_restarts, self.restart_backoff_s = checkpoint_every, max_restarts, \
            restart_backoff_s
        self.failures: list[tuple[float, str, str, int]] = []  # (t, job, what died, steps lost)
        self.failed_jobs: dict[str, str] = {}  # job -> why it was given up
        self._retry_at: dict[str, float] = {}  # job -> when its next restart is due (back-off)
        self.restart_count: dict[str, int] = {}  # job -> restarts after a process died
        # a worker silent this long is hung: Kubernetes' liveness-probe defaults (every 10 s, 3 failures)
        self.hung_after_s = hung_after_s
        self._resume: dict[str, str] = {}  # job -> why it is relaunched from its checkpoint at the next observe
        self._reconcile: set[str] = set()  # jobs whose last actuation failed
        self.events: list[tuple[float, str, str]] = []  # (t, job, what) for the report

    # ------------------------------------------------------------------ helpers
    def now(self) -> float:
        return self.clock() - self.t0

    @staticmethod
    def cgroup_name(cid: str) -> str:
        return cid.replace("/", ".")

    def running_containers(self, node: str) -> list[Container]:
        """Training containers on ``node`` whose processes run (not between incarnations)."""
        return [c for c in self.state.containers_on(node) if c.id in self.runs[c.owner].procs]

    def _event(self, now: float, job: str, what: str) -> None:
        self.events.append((now, job, what))
        log.info("%s: %s", job, what, extra={"job": job, "t": round(now, 3)})

    def _spawn(self, c: Container, argv: list[str]) -> Proc:
        name = self.cgroup_name(c.id)
        self.executor.create(name)
        try:
            self.executor.set_cpu(name, c.res.cpu)
            if c.cpuset is not None:
                self.executor.set_cpuset(name, c.cpuset)
            host = self.local[c.node].host
            return Proc(self.testbed.exec_argv(host, [self.python, "-m", PS_MODULE, *argv]), cgroup=name,
                        executor=self.executor, log=self.workdir / "logs" / f"{name}.log", env=workload_env(),
                        clock=self.clock)
        except BaseException:  # not started: its cgroup goes too, or the next launch finds it there
            self.executor.remove(name, kill=True)
            raise

    def _ckpt(self, j: JobRecord) -> Path:
        return self.workdir / "checkpoints" / j.spec.id

    # ------------------------------------------------------------------ lifecycle
    def _launch(self, j: JobRecord) -> None:
        """Start the job's current containers: PS shards, then workers (resuming if a
        checkpoint exists). Blocks until every worker has connected."""
        run = self.runs[j.id]
        ps = sorted((c for c in j.containers.values() if c.role is Role.PS), key=lambda c: c.id)
        ws = sorted((c for c in j.containers.values() if c.role is Role.WORKER), key=lambda c: c.id)
        ckpt = self._ckpt(j)
        resume = ["--resume", str(ckpt)] if read_manifest(ckpt) is not None else []
        addrs, versions = [], []
        for k, c in enumerate(ps):
            ip = self.testbed.ip(self.local[c.node].host)
            run.procs[c.id] = self._spawn(c, ["ps", "--host", ip, "--port", "0", "--shard", str(k), "--shards",
                                              str(len(ps)), "--workers", str(len(ws)), "--model", j.spec.model,
                                              "--seed", str(self.seed), "--checkpoint", str(ckpt), "--report-every",
                                              "0", "--checkpoint-every", str(self.checkpoint_every), *resume])
        for c in ps:
            hello = run.procs[c.id].wait_for("listening", self.launch_timeout_s)
            addrs.append(f"{self.testbed.ip(self.local[c.node].host)}:{hello['port']}")
            versions.append(int(hello.get("version", 0)))
        run.start_step = min(versions)
        remaining = max(0.0, j.spec.samples - run.samples_base)
        target = run.start_step + max(1, math.ceil(remaining / (j.spec.batch * len(ws))))
        for i, c in enumerate(ws):
            run.procs[c.id] = self._spawn(c, ["worker", "--ps", ",".join(addrs), "--model", j.spec.model,
                                              "--seed", str(self.seed), "--steps", str(target), "--worker-id", str(i),
                                              "--batch", str(j.spec.batch), "--report-every", "0",
                                              "--report-every-s", f"{self.report_every_s:g}",
                                              "--connect-timeout", f"{self.launch_timeout_s:g}"])
        shards = [run.procs[c.id] for c in ps]
        for c in ws:  # a PS that dies meanwhile fails the launch now, not after the timeout
            run.procs[c.id].wait_for("connected", self.launch_timeout_s, peers=shards)
        run.progress = {c.id: run.start_step for c in ws}
        run.marks = {}

    def _stop(self, jid: str, workers: Sequence[str]) -> None:
        """Workers leave after their current step (SIGTERM), then each PS checkpoints and
        exits; anything still running after ``stop_timeout_s`` is killed. The progress they
        reported is banked."""
        run = self.runs[jid]
        self._wait(run, then=self._leave(run, workers))
        self._bank(jid, run)

    @staticmethod
    def _leave(run: _Run, workers: Sequence[str]) -> list[str]:
        """Ask ``workers`` to leave after their current step (SIGTERM); returns the job's other
        processes (its PS shards), to be asked once the workers are gone (:meth:`_wait`)."""
        for cid in workers:
            if cid in run.procs:
                run.procs[cid].signal(signal.SIGTERM)
        return [cid for cid in run.procs if cid not in workers]

    def _worker_procs(self, jid: str, run: _Run) -> list[str]:
        """The job's processes that are workers (container ids)."""
        containers = self.state.jobs[jid].containers
        return [cid for cid in run.procs if cid in containers and containers[cid].role is Role.WORKER]

    def _bank(self, jid: str, run: _Run) -> None:
        """Read a stopped job's progress, release its processes and bank what they reported."""
        self._collect(run)
        self._release(run)
        run.samples_base = run.samples_done(self.state.jobs[jid].spec.batch)
        run.start_step = run.reached = max(run.progress.values(), default=run.start_step)  # banked up to here
        run.progress = {}

    def _wait(self, run: _Run, deadline: float | None = None, then: Sequence[str] = ()) -> None:
        """Wait for the job's processes until ``deadline`` (default: ``stop_timeout_s`` from
        now), then kill what is left. ``then`` (its PS shards, when its workers were asked to
        leave) are asked to checkpoint and exit (SIGTERM) once the others are gone: a PS
        whose workers died or never connected would wait for them until the deadline."""
        deadline = self.clock() + self.stop_timeout_s if deadline is None else deadline
        for cid, p in run.procs.items():
            if cid not in then and p.wait(max(0.1, deadline - self.clock())) is None:
                p.kill()
        for cid in then:
            p = run.procs.get(cid)
            if p is not None and p.alive():
                p.signal(signal.SIGTERM)
        for cid in then:
            p = run.procs.get(cid)
            if p is not None and p.wait(max(0.1, deadline - self.clock())) is None:
                p.kill()

    def _release(self, run: _Run) -> None:
        """Close every process of the job and remove its cgroups."""
        for cid, p in list(run.procs.items()):
            if p.alive():
                p.kill()
            p.close()
            try:
                self.executor.remove(self.cgroup_name(cid), kill=True)
            except Exception as err:  # noqa: BLE001 - the job goes on; the run's sweep removes it at the end
                log.warning("cgroup of %s not removed (%s): removed when the run ends", cid, err)
            self._cpu.pop(cid, None)
        run.procs.clear()

    def _collect(self, run: _Run) -> bool:
        """Read the workers' progress; True when every worker reported ``done``."""
        done = True
        for cid in run.progress:
            if cid not in run.procs:
                continue
            finished = False
            for ln in run.procs[cid].since(0):
                if "step" in ln.obj and ln.obj.get("event") in ("interval", "done", "stopped", "error"):
                    run.progress[cid] = max(run.progress.get(cid, run.start_step), int(ln.obj["step"]))
                finished |= ln.obj.get("event") == "done"
            done &= finished
        return done and bool(run.progress)

    # ------------------------------------------------------------------ observe
    def observe(self, now: float) -> ClusterSnapshot:
        while self.pending and self.pending[0].arrival_s <= now:
            spec = self.pending.pop(0)
            self.state.submit(spec, spec.arrival_s)
        for jid, why in sorted(self._resume.items()):
            try:
                self._relaunch(jid, now, why)
            except Exception as err:  # noqa: BLE001 - reconciled next round, as a failed actuation
                log.warning("resuming %s failed (%s): reconciled next round", jid, err)
                self.actuation_errors.append((now, jid, f"resume: {err}"))
                self._reconcile.add(jid)
        self._resume.clear()
        for jid in sorted(self._reconcile):
            self._reconcile_job(jid, now)
        for jid in list(self.state.running):
            self._check_alive(jid, now)
        since = self._last_observe
        for jid in list(self.state.running):
            if self._collect(self.runs[jid]):
                self._finish(jid, now)
        tel: dict[str, JobTelemetry] = {}
        host_net = self._host_net(now)
        running, queue = [], []
        for jid in self.state.running:
            j, run = self.state.jobs[jid], self.runs[jid]
            speed = self._speed(j, run)
            containers = self._containers(j, run, now, host_net)
            if speed is not None:  # no worker report in the window (starting): no measurement
                tel[jid] = JobTelemetry(since, speed, containers)
            running.append(j.view(run.samples_done(j.spec.batch), now))
        for jid in self.state.queue:
            j = self.state.jobs[jid]
            queue.append(j.view(self.runs[jid].samples_base, now))
        self._last_observe = now
        self.persist()
        return self.state.snapshot(now, queue, running, tel)

    def _speed(self, j: JobRecord, run: _Run) -> float | None:
        """Samples/s over the window: each worker's steps between its last report before the
        window and its last report in it, over the time between those reports. None when
        no worker has reported twice yet in this incarnation."""
        total, measured = 0.0, False
        for cid, p in run.procs.items():
            if j.containers[cid].role is not Role.WORKER:
                continue
            reports = [(ln.t - self.t0, int(ln.obj["step"])) for ln in p.since(0)
                       if ln.obj.get("event") == "interval" and "step" in ln.obj]
            if not reports:
                continue
            last = reports[-1]
            first = run.marks.get(cid) or reports[0]
            if last[0] > first[0]:
                total += (last[1] - first[1]) * j.spec.batch / (last[0] - first[0])
                measured = True
            run.marks[cid] = last
        return total if measured else None

    def _host_net(self, now: float) -> dict[str, float]:
        """Gbit/s of each node's link over the window, both directions summed: a PS step's
        pull and push run one after the other, so the link is busy for (rx + tx) / rate —
        the same traffic the speed model counts against the link (docs/design.md#training-speed-model)."""
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

    def _containers(self, j: JobRecord, run: _Run, now: float,
                    host_net: Mapping[str, float]) -> dict[str, ContainerTelemetry]:
        out = {}
        for cid, c in j.containers.items():
            if cid not in run.procs:
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

    def _finish(self, jid: str, now: float) -> None:
        run = self.runs[jid]
        self._wait(run)  # the PS shards exit by themselves after the last BYE
        run.samples_base = run.samples_done(self.state.jobs[jid].spec.batch)
        run.progress = {}
        self._release(run)
        self.state.finish(jid, now)
        self._event(now, jid, "done")

    # ------------------------------------------------------------------ actuate
    def actuate(self, decisions: Sequence[Decision], now: float) -> None:
        """Book each decision in the shared state (which validates it), then carry it out. A
        decision that fails to be carried out (a cgroup write, a process that did not start)
        is logged and reconciled from the state next round; the others go on."""
        for d in decisions:
            e = self.state.apply(d, now)
            try:
                self._carry(e, now)
            except Exception as err:  # noqa: BLE001 - one actuation's failure is not the run's
                log.warning("carrying out %s failed (%s): reconciled next round", d, err)
                self.actuation_errors.append((now, e.job, f"{type(d).__name__}: {err}"))
                self._reconcile.add(e.job)
        if decisions:
            self.persist()

    def _check_alive(self, jid: str, now: float) -> None:
        """A process of a running job exited before the job was done: the others leave (the PS
        checkpoint), and the job restarts from its latest complete checkpoint — at once, then
        after ``restart_backoff_s`` doubling — up to ``max_restarts`` times; then it is given up
        (``failed_jobs``, with the reason)."""
        run, j = self.runs[jid], self.state.jobs[jid]
        if jid in self._retry_at:
            if now < self._retry_at[jid]:
                return
            del self._retry_at[jid]
            self._try_relaunch(jid, now, "")
            return
        dead = sorted(cid for cid, p in run.procs.items() if not p.alive())
        hung = sorted(cid for cid, p in run.procs.items() if cid not in dead and self._hung(j, cid, p))
        if (not dead and not hung) or self._collect(run):
            return
        for cid in hung:  # a stopped or deadlocked worker cannot checkpoint or leave: it is killed
            run.procs[cid].kill()
        reason = "; ".join([f"{', '.join(dead)} exited"] * bool(dead)
                           + [f"{', '.join(hung)} stopped reporting for {self.hung_after_s:g} s"] * bool(hung))
        log.warning("job %s: %s before the job was done", jid, reason)
        self._stop(jid, self._worker_procs(jid, run))
        n = self.restart_count.get(jid, 0)
        self.restart_count[jid] = n + 1
        if n >= self.max_restarts:
            self.failures.append((now, jid, reason, 0))
            self.failed_jobs[jid] = f"{reason}; gave up after {n} restarts"
            self._event(now, jid, f"failed: {self.failed_jobs[jid]}")
            self.state.finish(jid, now)
            return
        if n == 0:
            self._try_relaunch(jid, now, reason)
        else:
            self._retry_at[jid] = now + self.restart_backoff_s * 2 ** (n - 1)
            self.failures.append((now, jid, reason, 0))

    def _hung(self, j: JobRecord, cid: str, p: Proc) -> bool:
        """A worker whose last telemetry line (it reports every ``report_every_s`` steps-worth of
        time) is older than ``hung_after_s``."""
        if j.containers[cid].role is not Role.WORKER:
            return False
        seen = p.last_seen()
        return seen is not None and self.clock() - seen > self.hung_after_s

    def _try_relaunch(self, jid: str, now: float, reason: str) -> None:
        """:meth:`_relaunch`; a restart that fails (a PS that does not come up, a worker that
        exits before it connects) is reconciled next round, as a failed actuation: the run goes on."""
        try:
            self._relaunch(jid, now, reason)
        except Exception as err:  # noqa: BLE001 - one job's restart is not the run
            log.warning("restarting %s failed (%s): reconciled next round", jid, err)
            if reason:
                self.failures.append((now, jid, reason, 0))
            self.actuation_errors.append((now, jid, f"restart: {err}"))
            self._reconcile.add(jid)

    def _relaunch(self, jid: str, now: float, reason: str) -> None:
        """Start the job again from its latest complete checkpoint; the steps after it are lost."""
        run, j = self.runs[jid], self.state.jobs[jid]
        workers = sum(1 for c in j.containers.values() if c.role is Role.WORKER)
        t = self.clock()
        ckpt = read_manifest(self._ckpt(j))  # where the PS will resume: the work to do is counted from it
        lost = max(0, run.reached - (ckpt[1] if ckpt else 0))
        run.samples_base = max(0.0, run.samples_base - lost * j.spec.batch * workers)
        self._launch(j)
        if reason:
            self.failures.append((now, jid, reason, lost))
        elif self.failures:
            f = self.failures[-1]
            self.failures[-1] = (f[0], f[1], f[2], lost)
        self.restarts_s.append(self.clock() - t)
        self.state.mark_changed(jid, self.now())
        self._event(now, jid, f"restarted from step {run.start_step} ({lost} steps lost)")

    def _reconcile_job(self, jid: str, now: float) -> None:
        """Make what runs of ``jid`` match the state again: a running job whose processes all
        live gets its quotas rewritten; one missing a process restarts from its checkpoint; a
        job no longer running has its processes released."""
        j, run = self.state.jobs[jid], self.runs[jid]
        try:
            if j.state is not JobState.RUNNING:
                self._release(run)
            elif set(run.procs) == set(j.containers) and all(p.alive() for p in run.procs.values()):
                for cid, c in j.containers.items():
                    self.executor.set_cpu(self.cgroup_name(cid), c.res.cpu)
            else:
                self._stop(jid, list(run.procs))
                self._launch(j)
                self.state.mark_changed(jid, self.now())
            self._reconcile.discard(jid)
            self._event(now, jid, "reconciled")
        except Exception as err:  # noqa: BLE001 - still failing: tried again next round
            log.warning("reconciling %s failed (%s): tried again next round", jid, err)
            self.actuation_errors.append((now, jid, f"reconcile: {err}"))

    def _carry(self, e: Effect, now: float) -> None:
        j = self.state.jobs[e.job]
        if isinstance(e, Launch):
            self._launch(j)
            self._event(now, j.id, f"start {len(e.containers)} containers")
        elif isinstance(e, SetQuota):
            self.executor.set_cpu(self.cgroup_name(e.container.id), e.container.res.cpu)
            self._event(now, j.id, f"resize {e.container.id} to {e.container.res.cpu:g} cores")
        elif isinstance(e, Reshape):
            what = [f"add {c.role.value} on {c.node}" for c in e.added] + [f"remove {c.id}" for c in e.removed]
            self._event(now, j.id, ", ".join(what))
            t = self.clock()
            workers = [c.id for c in (*j.containers.values(), *e.removed) if c.role is Role.WORKER]
            self._stop(j.id, workers)
            self._launch(j)
            self.restarts_s.append(self.clock() - t)
            self.state.mark_changed(j.id, self.now())  # its change took effect once it runs again
        else:  # Stop: preempted, back in the queue with its progress (checkpoint)
            self._stop(j.id, [c.id for c in e.containers if c.role is Role.WORKER])
            self._event(now, j.id, "preempted")

    # ------------------------------------------------------------------ durable record
    def persist(self) -> None:
        """Write what runs where to ``workdir/run.json`` (atomically; nothing without a record)."""
        if self.record is None:
            return
        jobs = [JobRecordFile(id=j.id, status="pending") for j in self.pending]
        for jid, j in self.state.jobs.items():
            run = self.runs[jid]
            status = ("failed" if jid in self.failed_jobs else "done" if j.state is JobState.DONE
                      else "running" if j.state is JobState.RUNNING else "queued")
            jobs.append(JobRecordFile(
                id=jid, status=status, next_id=j.next_id, queued_since=j.queued_since, queue_s=j.queue_s,
                started_s=j.started_s, finished_s=j.finished_s, last_change_s=j.last_change_s, reconfigs=j.reconfigs,
                samples_base=run.samples_base, start_step=run.start_step, restarts=self.restart_count.get(jid, 0),
                failed=self.failed_jobs.get(jid),
                containers=[ContainerRecord(id=c.id, role=c.role.value, node=c.node, cpu=c.res.cpu, mem_mib=c.res.mem_mib,
                                            cpuset=list(c.cpuset) if c.cpuset is not None else None)
                            for c in j.containers.values()],
                procs={cid: ProcRecord(pid=pr.pid, cgroup=pr.cgroup, role=j.containers[cid].role.value,
                                       telemetry=str(pr.telemetry))
                       for cid, pr in run.procs.items() if cid in j.containers}))
        write_state(self.workdir, self.record.model_copy(update={"jobs": jobs}))

    def resume(self, prev: RunState) -> list[str]:
        """Rebuild from a crashed run's record (its processes already gone): finished jobs stay
        finished, queued ones queue, and each running job relaunches on its recorded shape from
        its latest complete checkpoint at the next observe; the steps its workers had reported
        beyond that checkpoint are counted lost. Returns one line per job resumed."""
        specs = {j.id: j for j in self.pending}
        said = []
        for rec in prev.jobs:
            spec = specs.get(rec.id)
            if spec is None or rec.status == "pending":
                continue
            self.pending.remove(spec)
            containers = [Container(c.id, rec.id, Role(c.role), c.node, Resources(c.cpu, c.mem_mib),
                                    tuple(c.cpuset) if c.cpuset is not None else None) for c in rec.containers]
            run = self.runs[rec.id]
            nw = sum(1 for c in containers if c.role is Role.WORKER)
            steps = [_reached(Path(pr.telemetry)) for pr in rec.procs.values() if pr.role == "worker"]
            run.reached = max([rec.start_step, *(s for s in steps if s is not None)])
            run.samples_base = rec.samples_base + (run.reached - rec.start_step) * spec.batch * nw
            run.start_step = rec.start_step
            self.restart_count[rec.id] = rec.restarts
            kw = dict(next_id=rec.next_id, queued_since=rec.queued_since, queue_s=rec.queue_s,
                      started_s=rec.started_s, last_change_s=rec.last_change_s, reconfigs=rec.reconfigs)
            if rec.status in ("done", "failed"):
                self.state.restore(spec, [], finished_s=rec.finished_s if rec.finished_s is not None else 0.0, **kw)
                if rec.failed:
                    self.failed_jobs[rec.id] = rec.failed
                continue
            self.state.restore(spec, containers if rec.status == "running" else [], force=True, **kw)
            if rec.status == "running":
                ckpt = read_manifest(self._ckpt(self.state.jobs[rec.id]))
                self._resume[rec.id] = "controller restarted"
                said.append(f"{rec.id}: from the checkpoint at step {ckpt[1] if ckpt else 0} "
                            f"(its workers had reached step {run.reached})")
        self.persist()
        return said

    # ------------------------------------------------------------------ end
    @property
    def finished(self) -> bool:
        return not self.pending and all(j.state is JobState.DONE for j in self.state.jobs.values())

    def close(self, *, checkpoint: bool = False) -> None:
        """Stop every process and remove every cgroup this backend created (idempotent). With
        ``checkpoint``, running jobs first leave cleanly (their PS write a last checkpoint, at
        most ``stop_timeout_s``) and the durable record keeps their progress for a resume."""
        if checkpoint:  # every job's workers leave at once; all of them get one stop_timeout_s
            leaving = []
            for jid in list(self.state.running):
                run = self.runs.get(jid)
                if run is None:
                    continue
                try:
                    leaving.append((jid, run, self._leave(run, self._worker_procs(jid, run))))
                except Exception:
                    log.exception("%s: could not ask its workers to leave", jid)
            deadline = self.clock() + self.stop_timeout_s
            for jid, run, ps in leaving:
                try:
                    self._wait(run, deadline, then=ps)
                    self._bank(jid, run)
                except Exception:
                    log.exception("%s: its progress could not be banked at the stop", jid)
            self.persist()
        for run in self.runs.values():
            with contextlib.suppress(Exception):
                self._release(run)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reached(telemetry: Path) -> int | None:
    """The last step a worker reported in its latest incarnation (after its last ``connected``)."""
    step = None
    for obj in read_telemetry(telemetry):
        if obj.get("event") == "connected":
            step = None
        elif "step" in obj and obj.get("event") in ("interval", "done", "stopped", "error"):
            step = max(step or 0, int(obj["step"]))
    return step
