"""The local backends of one real run, set up (after sweeping a crashed run's leftovers) and
removed again — on success, on error and on Ctrl-C. A ``kill -9`` of the controller leaves
things behind; the next run's startup sweep removes them (cgroups under ``CGROUP_PREFIX``
with the processes in them, namespaces of dead owners).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from reamer.backends.local.cgroups import CgroupError, CgroupExecutor
from reamer.backends.local.cluster import LocalCluster, LocalNode
from reamer.backends.local.inference import LocalInference, LocalService
from reamer.backends.local.netns import NetnsError, Testbed
from reamer.backends.local.netns import sweep as sweep_namespaces
from reamer.config.local import LocalScenario
from reamer.domain import Node
from reamer.models.profiles import Profiles

log = logging.getLogger(__name__)
CGROUP_PREFIX = "reamer-local"
LOCK_PATH = Path("/run/lock" if Path("/run/lock").is_dir() else tempfile.gettempdir()) / "reamer-local.lock"
NETNS_PREFIX = "rmrl"
CGROUP_ROOT = Path("/sys/fs/cgroup")


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
        ex.create("probe")
        ex.set_cpu("probe", 0.5)
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
    namespaces (whose owner pid is dead). Every run does this first. Returns what it removed."""
    executor = CgroupExecutor(cgroup_root, prefix=CGROUP_PREFIX, controllers=("cpu", "cpuset"))
    return executor.sweep(kill=True) + sweep_namespaces(NETNS_PREFIX)


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


@contextlib.contextmanager
def open_session(
    sc: LocalScenario,
    profiles: Profiles,
    *,
    workdir: Path | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    replica_cpus: list[int] | None = None,
    apparatus_cpus: list[int] | None = None,
    lock_path: Path = LOCK_PATH,
) -> Iterator[LocalSession]:
    """The testbed, cgroups and backends of ``sc``; everything is removed on exit.
    ``replica_cpus`` pins every inference replica (default: its node's CPUs);
    ``apparatus_cpus`` pins this controller and the load generators away from what is measured.
    The machine's one-run lock is held throughout (:class:`RunLocked` when another run has
    it), so the startup sweep only ever removes what dead runs left."""
    with run_lock(lock_path), _session(sc, profiles, workdir, cgroup_root, replica_cpus, apparatus_cpus) as s:
        yield s


@contextlib.contextmanager
def _session(sc: LocalScenario, profiles: Profiles, workdir: Path | None, cgroup_root: Path,
             replica_cpus: list[int] | None, apparatus_cpus: list[int] | None) -> Iterator[LocalSession]:
    if apparatus_cpus is not None:
        os.sched_setaffinity(0, set(apparatus_cpus))
    swept = sweep_leftovers(cgroup_root)
    if swept:
        log.warning("removed leftovers of an earlier run: %s", ", ".join(swept))
    executor = CgroupExecutor(cgroup_root, prefix=CGROUP_PREFIX, controllers=("cpu", "cpuset"))
    own_tmp = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="reamer-local-")) if workdir is None else Path(workdir)
    testbed = Testbed(len(sc.hosts), prefix=NETNS_PREFIX)
    cluster = inference = None
    try:
        for i, h in enumerate(sc.hosts):
            if h.link_mbit is not None:
                testbed.set_bandwidth(i, h.link_mbit)
        cluster = LocalCluster(local_nodes(sc), sc.training_jobs(), executor=executor, testbed=testbed, workdir=wd,
                               seed=sc.seed)
        if sc.services:
            inference = LocalInference(cluster, local_services(sc), executor=executor, workdir=wd,
                                       profiles=profiles.inference, system_reserve_cores=sc.system_reserve_cores,
                                       seed=sc.seed, replica_cpus=replica_cpus, load_cpus=apparatus_cpus)
        yield LocalSession(cluster, inference, swept)
    finally:
        for backend in (inference, cluster):
            if backend is not None:
                backend.close()
        try:
            testbed.close()
        except NetnsError:
            pass
        executor.sweep(kill=True)
        if own_tmp:
            shutil.rmtree(wd, ignore_errors=True)
