"""The local backends of one real run, set up (after sweeping a crashed run's leftovers) and
removed again — on success, on error and on Ctrl-C.

A run with a **state folder** is crash-safe: what runs where (``run.json``), the checkpoints
and the logs live there. A ``kill -9`` of the controller leaves the workloads training (their
telemetry goes to files, not to a pipe that would kill them); the next run on the same
folder has them leave cleanly (workers after their step, each PS writing a last checkpoint),
sweeps what the dead run left (cgroups under ``CGROUP_PREFIX``, namespaces under ``NETNS_PREFIX``)
and resumes every job from its checkpoint — or, with ``fresh``, discards the record and
starts over — and says which. The folder is removed only when the run finished cleanly and
``keep_state`` is off. One run per machine holds the lock (:func:`run_lock`), so the sweep
only ever removes what dead runs left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from reamer.backends.local.cgroups import CgroupError, CgroupExecutor
from reamer.backends.local.cluster import LocalCluster, LocalNode
from reamer.backends.local.inference import LocalInference, LocalService
from reamer.backends.local.netns import NetnsError, Testbed
from reamer.backends.local.netns import sweep as sweep_namespaces
from reamer.backends.local.runstate import STATE_FILE, RunState, read_state, scenario_digest, set_status
from reamer.config.local import LocalScenario
from reamer.errors import InputError
from reamer.domain import Node
from reamer.models.profiles import Profiles

log = logging.getLogger(__name__)
CGROUP_PREFIX = "reamer-local"
LOCK_PATH = Path("/run/lock" if Path("/run/lock").is_dir() else tempfile.gettempdir()) / "reamer-local.lock"
NETNS_PREFIX = "rmrl"
CGROUP_ROOT = Path("/sys/fs/cgroup")
TEMP_PREFIX = "reamer-local-"  # a run without a state folder works in a temporary folder of this name
TEMP_MARK = ".reamer-temporary-run"  # ... holding this file: the folder is the run's, to remove


def default_state_dir(scenario: str) -> Path:
    """Where ``reamer local`` keeps a scenario's run unless told otherwise."""
    return Path.home() / ".local" / "state" / "reamer" / "local" / scenario


def unavailable(root: Path = CGROUP_ROOT) -> str | None:
    """Why a real run cannot happen here (one line), or None when it can."""
    if os.geteuid() != 0:
        return "not root (cgroups and network namespaces need root)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    try:
        import onnxruntime  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        return f"the real workloads need torch and onnxruntime ({e.name} missing)"
    try:
        ex = CgroupExecutor(root, prefix=CGROUP_PREFIX + "-probe", controllers=("cpu", "cpuset"))
        if ex.exists("probe"):  # a probe interrupted before its sweep
            ex.sweep(kill=True)
        try:
            ex.create("probe")
            ex.set_cpu("probe", 0.5)
        finally:
            ex.sweep()
    except (CgroupError, OSError) as e:
        return f"cgroups are not writable ({e})"
    return None


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so the ``finally``
    clauses that remove cgroups, namespaces and processes run for both (SIGTERM's default
    ends the process without them). The previous handler is restored on exit. Main thread only."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def sweep_leftovers(cgroup_root: Path = CGROUP_ROOT) -> list[str]:
    """What a crashed (``kill -9``) run left: its cgroups (and the processes in them) and its
    namespaces. Every run does this first, holding the machine's run lock, so every namespace
    of the prefix but this process's own is a dead run's, even where its owner's pid now
    belongs to another process. Returns what it removed."""
    executor = CgroupExecutor(cgroup_root, prefix=CGROUP_PREFIX, controllers=("cpu", "cpuset"))
    me = os.getpid()
    return executor.sweep(kill=True) + sweep_namespaces(NETNS_PREFIX, alive=lambda pid: pid == me)


def sweep_temp_folders(temp_root: Path, keep: Path | None = None) -> list[Path]:
    """The temporary run folders (:data:`TEMP_PREFIX`, holding :data:`TEMP_MARK`) under
    ``temp_root`` that dead runs left (a run removes its own at its end; a ``kill -9`` does
    not), but ``keep``. Called under the machine's run lock, as :func:`sweep_leftovers`.
    Returns what it removed."""
    removed = []
    for d in sorted(temp_root.glob(TEMP_PREFIX + "*")):
        if d != keep and d.is_dir() and not d.is_symlink() and (d / TEMP_MARK).is_file():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def local_nodes(sc: LocalScenario) -> list[LocalNode]:
    return [LocalNode(Node(h.name, h.cores, h.mem_gib * 1024, nic_gbps=h.nic_gbps, pool="local"), i,
                      tuple(h.cpus) if h.cpus is not None else None, h.link_mbit) for i, h in enumerate(sc.hosts)]


def local_services(sc: LocalScenario) -> list[LocalService]:
    return [LocalService(s.id, s.model, s.slo_p99_ms / 1e3, tuple(s.rates), s.window_s) for s in sc.services]


@dataclass
class LocalSession:
    """The backends of one real run, and what the startup sweep removed."""

    cluster: LocalCluster
    inference: LocalInference | None
    swept: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)  # what became of a crashed run's jobs (one line each)
    state_dir: Path | None = None  # None: a temporary folder, removed at the end
    finished: bool = False  # set by the caller when every job finished: the state folder may go

    def events(self) -> list[tuple[float, str, str]]:
        return sorted(self.cluster.events + (self.inference.events if self.inference else []))


class RunLocked(RuntimeError):
    """Another real run holds this machine (one run per machine: they share cgroups and
    network-namespace names)."""


@contextlib.contextmanager
def run_lock(path: Path = LOCK_PATH) -> Iterator[None]:
    """Hold the machine's one-run lock (an exclusive ``flock``; the holder's pid is written in
    the file); :class:`RunLocked` names the holder when it is taken. The kernel frees it when
    the holder dies, so a crashed run never blocks the next one."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise RunLocked(f"another reamer real run (pid {holder}) holds {path}: one run per machine") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def stop_crashed(prev: RunState, executor: CgroupExecutor, *, timeout_s: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """The training processes a dead controller left (found by their cgroups, so a reused pid
    is never hit) leave: workers after their current step (SIGTERM), then each PS writes its
    last checkpoint and exits — waited for up to ``timeout_s``; what is still running after
    that the sweep kills."""
    cgroups = [(pr.cgroup, pr.role) for j in prev.jobs for pr in j.procs.values()]
    for cg, role in cgroups:
        if role == "worker":
            for pid in executor.procs(cg):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_live(executor.procs(cg)) for cg, _ in cgroups):
        sleep(0.2)


def _live(pids: list[int]) -> bool:
    """Any of ``pids`` running (a zombie that nobody reaps yet counts as gone)."""
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return True
    return False


@contextlib.contextmanager
def open_session(
    sc: LocalScenario,
    profiles: Profiles,
    *,
    state_dir: Path | None = None,
    fresh: bool = False,
    keep_state: bool = False,
    cgroup_root: Path = CGROUP_ROOT,
    replica_cpus: list[int] | None = None,
    apparatus_cpus: list[int] | None = None,
    lock_path: Path = LOCK_PATH,
) -> Iterator[LocalSession]:
    """The testbed, cgroups and backends of ``sc``; every process and cgroup is removed on exit.
    ``state_dir`` holds the run's durable record, checkpoints and logs (None: a temporary
    folder, removed at the end): a crashed run found there is resumed (``fresh``: discarded),
    and the folder stays unless the run finished cleanly (``session.finished``) and not
    ``keep_state``. ``replica_cpus`` pins every inference replica (default: its node's CPUs);
    ``apparatus_cpus`` pins this controller and the load generators away from what is measured.
    The machine's one-run lock is held throughout (:class:`RunLocked` when another run has
    it), so the startup sweep only ever removes what dead runs left."""
    with run_lock(lock_path), _session(sc, profiles, state_dir, fresh, keep_state, cgroup_root, replica_cpus,
                                       apparatus_cpus) as s:
        yield s


OWN_ENTRIES = (STATE_FILE, "checkpoints", "logs", "endpoints")  # what a run writes in its state folder


def _previous(sc: LocalScenario, folder: Path, fresh: bool,
              executor: CgroupExecutor) -> tuple[RunState | None, list[str]]:
    """The unfinished run in ``folder`` to resume (its processes stopped) and what became of
    it; with ``fresh`` it is discarded (the sweep kills its processes) and said so."""
    try:
        prev = read_state(folder)
    except InputError:
        if not fresh:
            raise
        prev = None
    if prev is None or prev.status == "finished":
        _clear(folder)
        return None, []
    if fresh:
        _clear(folder)
        return None, [f"discarded the {_how(prev)} run of {prev.scenario!r} in {folder} (--fresh): "
                      + ", ".join(f"{j.id} was {j.status}" for j in prev.jobs)]
    if prev.digest != scenario_digest(_scenario_json(sc)):
        raise InputError(str(folder / STATE_FILE), "scenario",
                         f"the unfinished run of scenario {prev.scenario!r} exactly as it was, to resume it "
                         "(or pass --fresh to discard it)")
    stop_crashed(prev, executor)
    return prev, []


def _how(prev: RunState) -> str:
    """How a run ended: one still marked running has a dead controller (we hold the lock)."""
    return "crashed" if prev.status == "running" else prev.status


def _clear(folder: Path) -> None:
    """Remove what a run wrote in ``folder`` (only that: the folder may be the user's), and the
    folder when that leaves it empty."""
    for what in OWN_ENTRIES:
        target = folder / what
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


def _scenario_json(sc: LocalScenario) -> str:
    return sc.model_dump_json(exclude={"source"})


@contextlib.contextmanager
def _session(sc: LocalScenario, profiles: Profiles, state_dir: Path | None, fresh: bool, keep_state: bool,
             cgroup_root: Path, replica_cpus: list[int] | None,
             apparatus_cpus: list[int] | None) -> Iterator[LocalSession]:
    if apparatus_cpus is not None:
        os.sched_setaffinity(0, set(apparatus_cpus))
    executor = CgroupExecutor(cgroup_root, prefix=CGROUP_PREFIX, controllers=("cpu", "cpuset"))
    if state_dir is None:
        wd = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        (wd / TEMP_MARK).write_text(f"{os.getpid()}\n")
    else:
        wd = Path(state_dir)
    prev, said = _previous(sc, wd, fresh, executor) if state_dir is not None else (None, [])
    swept = sweep_leftovers(cgroup_root) + [str(d) for d in sweep_temp_folders(Path(tempfile.gettempdir()), wd)]
    if swept:
        log.warning("removed leftovers of an earlier run: %s", ", ".join(swept))
    record = None
    if state_dir is not None:
        record = RunState(scenario=sc.name, digest=scenario_digest(_scenario_json(sc)), controller_pid=os.getpid(),
                          started_wall=prev.started_wall if prev is not None else time.time())
    testbed = Testbed(len(sc.hosts), prefix=NETNS_PREFIX)
    cluster = inference = None
    sess = None
    status = "failed"
    try:
        for i, h in enumerate(sc.hosts):
            if h.link_mbit is not None:
                testbed.set_bandwidth(i, h.link_mbit)
        cluster = LocalCluster(local_nodes(sc), sc.training_jobs(), executor=executor, testbed=testbed, workdir=wd,
                               seed=sc.seed, record=record,
                               t_offset=time.time() - record.started_wall if record is not None else 0.0)
        if prev is not None:
            resumed = cluster.resume(prev)
            said = [f"resumed the {_how(prev)} run of {prev.scenario!r} in {wd}: "
                    + ("; ".join(resumed) or "no job was running")]
        for line in said:
            log.warning("%s", line)
        cluster.persist()
        if sc.services:
            inference = LocalInference(cluster, local_services(sc), executor=executor, workdir=wd,
                                       profiles=profiles.inference, system_reserve_cores=sc.system_reserve_cores,
                                       seed=sc.seed, replica_cpus=replica_cpus, load_cpus=apparatus_cpus)
        sess = LocalSession(cluster, inference, swept, said, state_dir)
        yield sess
        status = "finished" if sess.finished else "interrupted"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        # every step runs, whatever the one before it raised, and a second Ctrl-C or SIGTERM
        # does not cut them short: what is left running here would outlive the run
        errors: list[Exception] = []

        def step(fn: Callable[[], object]) -> None:
            try:
                fn()
            except NetnsError as e:  # swept by the next run's start (or reamer cleanup)
                log.warning("network namespaces not all removed: %s", e)
            except Exception as e:  # noqa: BLE001 - the rest of the cleanup still runs
                log.warning("cleanup: %s", e)
                errors.append(e)

        with _signals_held():
            if inference is not None:
                step(inference.close)
            if cluster is not None:
                step(lambda: cluster.close(checkpoint=record is not None and status != "finished"))
            step(testbed.close)
            step(lambda: executor.sweep(kill=True))
            if state_dir is None:
                shutil.rmtree(wd, ignore_errors=True)
            elif status == "finished" and not keep_state:
                step(lambda: _clear(wd))
            else:
                step(lambda: set_status(wd, status))  # type: ignore[arg-type]
        if errors and sys.exc_info()[1] is None:
            raise errors[0]


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM are noted, not acted on, inside the block (main thread only: elsewhere
    signals are the main thread's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.signal(s, lambda n, _f: got.append(n)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if got:
            log.warning("%s during the cleanup: waited for it to finish", signal.Signals(got[0]).name)
