"""The local training backend carrying out the shared state's effects, with stand-ins for the
processes, cgroups and the testbed (what is under test is the order of process operations
and the progress banked across restarts; real processes: tests/runtime/test_local_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import reamer.backends.local.cluster as lc
from reamer.domain import AddContainer, JobState, Node, Preempt, RemoveContainer, Resize, Resources, Role, StartJob
from reamer.domain import TrainingJob
from reamer.domain.decisions import Placement


class Line:
    def __init__(self, t, obj):
        self.t, self.obj = t, obj


class Stats:
    usage_s = nr_throttled = nr_periods = 0

    def __sub__(self, other):
        return self


class Executor:
    def __init__(self, ops):
        self.ops = ops

    def create(self, name):
        self.ops.append(("create", name))

    def set_cpu(self, name, cores):
        self.ops.append(("cpu", name, cores))

    def set_cpuset(self, name, cpus):
        pass

    def remove(self, name, kill=False):
        self.ops.append(("remove", name))

    def read_stats(self, name):
        return Stats()


class Testbed:
    def exec_argv(self, host, argv):
        return argv

    def ip(self, host):
        return f"10.0.0.{host}"

    def link_bytes(self, host):
        return 0, 0


class World:
    """Fake workload processes: a PS reports the checkpoint's version when it listens; a worker
    reports its step; on SIGTERM it stops, and a PS that exits after it checkpoints that step."""

    def __init__(self):
        self.ops: list[tuple] = []
        self.version = 0
        self.workers: list = []
        self.ps_waits = False  # a PS keeps waiting for workers that will not come, until SIGTERM

    def proc(self, argv, cgroup, executor, log, env, clock):
        world = self
        args = argv[argv.index("-m") + 2:]
        role = args[0]
        world.ops.append(("spawn", cgroup, "--resume" in args))

        class Proc:
            lines: list = []

            pid, telemetry = 0, log.with_suffix(".jsonl")

            def __init__(self):
                self.cgroup = cgroup
                self.lines, self.live, self.step = [], True, world.version
                self.target = int(args[args.index("--steps") + 1]) if role == "worker" else None
                if role == "worker":
                    world.workers.append(self)

            def wait_for(self, event, timeout, peers=()):
                return {"port": 5000, "version": world.version}

            def run(self, steps):
                self.step = min(self.target, self.step + steps)
                self.lines.append(Line(0.0, {"event": "interval", "step": self.step}))
                if self.step >= self.target:
                    self.lines.append(Line(0.0, {"event": "done", "step": self.step}))
                    self.live = False

            def since(self, i):
                return self.lines[i:]

            def last_seen(self):
                return self.lines[-1].t if self.lines else None

            def alive(self):
                return self.live

            def signal(self, sig):
                world.ops.append(("sigterm", cgroup))
                self.termed = True
                if self.live and role == "worker":
                    self.lines.append(Line(0.0, {"event": "stopped", "step": self.step}))
                    self.live = False

            def wait(self, timeout):
                if role == "ps" and world.ps_waits and not getattr(self, "termed", False):
                    return None
                if role == "ps":  # it checkpoints what its workers reached
                    world.version = max([world.version] + [w.step for w in world.workers if not w.live])
                    ckpt = Path(args[args.index("--checkpoint") + 1])
                    ckpt.mkdir(parents=True, exist_ok=True)
                    (ckpt / "manifest.json").write_text(json.dumps({"shards": 1, "step": world.version}))
                self.live = False
                return 0

            def kill(self):
                world.ops.append(("kill", cgroup))
                self.live = False

            def close(self):
                pass

        return Proc()


@pytest.fixture
def world(monkeypatch, tmp_path):
    w = World()
    monkeypatch.setattr(lc, "Proc", w.proc)
    nodes = [lc.LocalNode(Node("a", 4, 8192), 0), lc.LocalNode(Node("b", 4, 8192), 1)]
    spec = TrainingJob("j", "resnet_narrow", 0.0, 1000, 1, 2, Resources(1, 512), Resources(1, 1024), batch=10)
    w.cluster = lc.LocalCluster(nodes, [spec], executor=Executor(w.ops), testbed=Testbed(), workdir=tmp_path,
                                clock=lambda: 0.0)
    w.cluster.observe(0.0)
    w.cluster.actuate([StartJob("j", (Placement(Role.PS, "a", Resources(1, 512)),
                                      Placement(Role.WORKER, "a", Resources(1, 1024)),
                                      Placement(Role.WORKER, "b", Resources(1, 1024))))], 0.0)
    return w


def _spawned(w):
    return [(op[1], op[2]) for op in w.ops if op[0] == "spawn"]


def test_launch_starts_ps_shards_then_workers(world):
    assert _spawned(world) == [("j.ps0", False), ("j.worker1", False), ("j.worker2", False)]
    assert [w.target for w in world.workers] == [50, 50]  # 1000 samples / (10 × 2 workers)


def test_reshape_banks_progress_stops_the_old_shape_and_resumes_the_new_one(world):
    for w in world.workers:
        w.run(10)
    world.ops.clear()
    world.cluster.actuate([AddContainer("j", Placement(Role.PS, "b", Resources(1, 512)))], 5.0)
    # workers leave first; then the PS is asked to checkpoint and exit (it would wait for workers that died)
    assert [op[1] for op in world.ops if op[0] == "sigterm"] == ["j.worker1", "j.worker2", "j.ps0"]
    # the new PS set resumes from the checkpoint; workers start from the step it reports
    assert _spawned(world) == [("j.ps0", True), ("j.ps3", True), ("j.worker1", False), ("j.worker2", False)]
    view = world.cluster.observe(6.0).running[0]
    assert view.samples_done == 200  # 2 workers × 10 steps × batch 10, banked across the restart
    assert len(world.cluster.restarts_s) == 1
    world.ops.clear()
    world.cluster.actuate([RemoveContainer("j/worker2")], 7.0)
    assert ("sigterm", "j.worker2") in world.ops  # the removed worker is stopped too
    assert _spawned(world) == [("j.ps0", True), ("j.ps3", True), ("j.worker1", False)]


def test_resize_rewrites_the_quota_in_place(world):
    world.ops.clear()
    world.cluster.actuate([Resize("j/worker1", Resources(2, 1024))], 1.0)
    assert world.ops == [("cpu", "j.worker1", 2)]


def test_preempt_keeps_progress_and_a_finished_job_is_done(world):
    for w in world.workers:
        w.run(20)
    world.cluster.actuate([Preempt("j")], 3.0)
    snap = world.cluster.observe(4.0)
    assert [v.samples_done for v in snap.queue] == [400] and not snap.running
    world.cluster.actuate([StartJob("j", (Placement(Role.PS, "b", Resources(1, 512)),
                                          Placement(Role.WORKER, "b", Resources(1, 1024))))], 5.0)
    last = world.workers[-1]
    assert _spawned(world)[-2:] == [("j.ps3", True), ("j.worker4", False)]
    assert last.target == 20 + 60  # resumed at step 20, the rest: 600 samples / batch 10
    last.run(1000)
    world.cluster.observe(9.0)
    j = world.cluster.state.jobs["j"]
    assert j.state is JobState.DONE and j.finished_s == 9.0 and world.cluster.finished


def test_a_failed_actuation_is_logged_and_reconciled_next_round(world):
    cluster = world.cluster
    worker = next(cid for cid in cluster.state.owner if "/worker" in cid)
    real = cluster.executor.set_cpu

    def broken(name, cores):
        raise OSError("cgroup write failed")

    cluster.executor.set_cpu = broken
    cluster.actuate([Resize(worker, Resources(2, 1024))], 1.0)  # does not raise
    assert len(cluster.actuation_errors) == 1 and "cgroup write failed" in cluster.actuation_errors[0][2]
    cluster.executor.set_cpu = real
    cluster.observe(2.0)  # the next round writes the state's quotas again
    assert ("cpu", cluster.cgroup_name(worker), 2) in world.ops
    assert not cluster._reconcile


def test_a_dead_worker_restarts_the_job_from_its_checkpoint_until_it_is_given_up(world):
    c = world.cluster
    for w in world.workers:
        w.run(10)
    world.workers[-1].live = False  # kill -9: gone without a "stopped" line
    world.ops.clear()
    view = c.observe(1.0)
    assert _spawned(world) == [("j.ps0", True), ("j.worker1", False), ("j.worker2", False)]  # from the checkpoint
    assert [(f[1], f[2]) for f in c.failures] == [("j", "j/worker2 exited")]
    assert view.running[0].samples_done == 200 and "j" not in c.failed_jobs
    t = 1.0
    for attempt in range(3):  # it keeps dying: restarts back off (2 s, 4 s), then the job is given up
        world.workers[-1].live = False
        t += 1.0
        c.observe(t)
        if attempt < 2:
            assert c.state.jobs["j"].state is JobState.RUNNING and not c.runs["j"].procs  # waiting out the back-off
            t += 2.0 * 2 ** attempt
            c.observe(t)
            assert c.runs["j"].procs  # started again
    assert c.state.jobs["j"].state is JobState.DONE and "gave up after 3 restarts" in c.failed_jobs["j"]
    assert len(c.failures) == 4


def test_a_restart_that_fails_does_not_end_the_run_and_is_reconciled_next_round(world, monkeypatch):
    """The PS of the restart never says it listens: the round goes on (a failed restart is an
    actuation error), and the next round starts the job again from its checkpoint."""
    c = world.cluster
    for w in world.workers:
        w.run(10)
    world.workers[-1].live = False
    real = world.proc

    def silent_ps(argv, cgroup, **kw):
        p = real(argv, cgroup, **kw)
        if "/ps" in cgroup or ".ps" in cgroup:
            def never(event, timeout, peers=()):
                raise RuntimeError(f"{cgroup}: no 'listening' line within {timeout:g}s")
            p.wait_for = never
        return p

    monkeypatch.setattr(lc, "Proc", silent_ps)
    c.observe(1.0)  # does not raise
    assert [e[2].split(":")[0] for e in c.actuation_errors] == ["restart"] and "j" in c._reconcile
    assert [(f[1], f[2]) for f in c.failures] == [("j", "j/worker2 exited")]
    monkeypatch.setattr(lc, "Proc", real)
    world.ops.clear()
    c.observe(2.0)
    assert _spawned(world) == [("j.ps0", True), ("j.worker1", False), ("j.worker2", False)]
    assert not c._reconcile and c.state.jobs["j"].state is JobState.RUNNING


def test_a_failed_spawn_removes_the_cgroup_it_made(world, monkeypatch):
    c = world.cluster
    cid = next(iter(c.runs["j"].procs))

    def fails(*a, **kw):
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(lc, "Proc", fails)
    world.ops.clear()
    with pytest.raises(OSError):
        c._spawn(c.state.jobs["j"].containers[cid], ["ps"])
    assert world.ops[0] == ("create", c.cgroup_name(cid)) and ("remove", c.cgroup_name(cid)) in world.ops


def test_a_crashed_runs_record_resumes_its_job_on_the_same_shape_from_the_checkpoint(world, tmp_path):
    """The durable record (run.json) a controller keeps: a new controller rebuilds the shared
    state from it, relaunches the job on its recorded containers from the checkpoint, counts
    the steps reported beyond the checkpoint as lost, and banks only what the checkpoint holds."""
    from reamer.backends.local.runstate import RunState, read_state

    c = world.cluster
    c.record = RunState(scenario="t", digest="d", controller_pid=1, started_wall=0.0)
    for w in world.workers:
        w.run(25)
    c.observe(1.0)
    ckpt = tmp_path / "checkpoints" / "j"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text(json.dumps({"shards": 1, "step": 20}))
    world.version = 20
    prev = read_state(tmp_path)
    assert [j.status for j in prev.jobs] == ["running"] and len(prev.jobs[0].procs) == 3
    for rec in prev.jobs[0].procs.values():  # what the (dead) workers wrote to their telemetry files
        if rec.role == "worker":
            Path(rec.telemetry).parent.mkdir(parents=True, exist_ok=True)
            Path(rec.telemetry).write_text('{"event": "connected"}\n{"event": "interval", "step": 25}\n')
    world.ops.clear()
    new = lc.LocalCluster(c.local.values(), [c.state.jobs["j"].spec], executor=Executor(world.ops),
                          testbed=Testbed(), workdir=tmp_path, clock=lambda: 0.0, record=c.record)
    said = new.resume(prev)
    assert said == ["j: from the checkpoint at step 20 (its workers had reached step 25)"]
    assert {cid: x.node for cid, x in new.state.jobs["j"].containers.items()} == \
        {cid: x.node for cid, x in c.state.jobs["j"].containers.items()}
    view = new.observe(2.0)
    assert _spawned(world) == [("j.ps0", True), ("j.worker1", False), ("j.worker2", False)]
    assert [(f[1], f[2], f[3]) for f in new.failures] == [("j", "controller restarted", 5)]
    assert view.running[0].samples_done == 400  # 20 steps × 2 workers × batch 10: the checkpoint's
    assert [w.target for w in world.workers[-2:]] == [20 + 30, 20 + 30]  # the 600 samples left


def test_a_worker_that_stops_reporting_is_killed_and_the_job_restarts(world):
    """A worker alive but silent for ``hung_after_s`` (SIGSTOP, a deadlock) is hung: it is killed
    and the job restarts from its checkpoint, as for one that exited."""
    c = world.cluster
    now = [100.0]
    c.clock = lambda: now[0]
    for w in world.workers:
        w.run(10)
        w.lines[-1] = Line(100.0, w.lines[-1].obj)
    c.observe(1.0)
    assert not c.failures  # reported just now
    world.workers[0].lines[-1] = Line(100.0 + c.hung_after_s + 1, world.workers[0].lines[-1].obj)  # still reporting
    now[0] = 100.0 + c.hung_after_s + 2
    world.ops.clear()
    c.observe(2.0)
    assert [(f[1], f[2]) for f in c.failures] == [("j", f"j/worker2 stopped reporting for {c.hung_after_s:g} s")]
    assert _spawned(world) == [("j.ps0", True), ("j.worker1", False), ("j.worker2", False)]


def test_closing_with_a_checkpoint_stops_every_job_and_records_its_progress(world, tmp_path):
    """An interrupted run (``close(checkpoint=True)``): every running job's workers leave at
    once, its PS checkpoints what they reached, and the record keeps that progress for a resume."""
    from reamer.backends.local.runstate import RunState, read_state

    c = world.cluster
    c.record = RunState(scenario="t", digest="d", controller_pid=1, started_wall=0.0)
    for w in world.workers:
        w.run(20)
    c.close(checkpoint=True)
    workers = {c.cgroup_name(cid) for cid in c.state.jobs["j"].containers if "/worker" in cid}
    assert {op[1] for op in world.ops if op[0] == "sigterm"} >= workers
    rec = read_state(tmp_path).jobs[0]
    assert rec.status == "running" and rec.start_step == 20 and rec.samples_base == 400  # 20 steps × 2 × batch 10
    assert json.loads((tmp_path / "checkpoints" / "j" / "manifest.json").read_text())["step"] == 20
    assert not c.runs["j"].procs


def test_a_ps_whose_workers_are_gone_is_asked_to_checkpoint_and_exit(world, tmp_path):
    """A worker that dies before it connects (or is killed) never says BYE: its PS would wait
    for it until the stop's deadline and be killed without a checkpoint. Once the workers are
    gone, the PS is asked to leave (SIGTERM) and checkpoints."""
    world.ps_waits = True
    for w in world.workers:
        w.run(20)
    world.workers[-1].live = False  # died without a word
    world.cluster.close(checkpoint=True)
    ps = world.cluster.cgroup_name(next(cid for cid in world.cluster.state.jobs["j"].containers if "/ps" in cid))
    assert ("sigterm", ps) in world.ops and ("kill", ps) not in world.ops
    assert json.loads((tmp_path / "checkpoints" / "j" / "manifest.json").read_text())["step"] == 20
