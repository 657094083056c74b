"""Container-aware thread sizing for PyTorch, OpenMP/BLAS, ONNX Runtime and data loaders.

Frameworks size their thread pools from the machine (``os.cpu_count()`` or the physical
cores), not from the container: a job with a 0.5-core CFS quota on a 64-core node starts
64 threads that burn the quota in a fraction of each period and then all sit throttled.
Here every pool is sized from the container's **effective CPUs** =
``min(quota / period, cpuset size, node cores)``, with ``max(1, ceil(cores))`` threads.

Nothing inside a process reports its CFS quota, so :func:`read_own_quota` reads it from
the process's own cgroup files (v1 and v2), and :class:`QuotaWatcher` re-tunes a running
workload when its allocation changes — no restart.

``torch`` and ``onnxruntime`` are imported lazily, inside the functions that need them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reamer.backends.local.cgroups import tightest_quota

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def node_cores() -> int:
    """CPUs this process may run on (its affinity / cpuset), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def effective_cpus(quota_cores: float | None, cpuset_size: int | None, node_cores: int) -> float:
    """``min(quota/period, cpuset size, node cores)``; ``None`` means "no limit of that kind"."""
    if node_cores < 1:
        raise ValueError(f"node_cores: expected >= 1, got {node_cores!r}")
    limits = [float(node_cores)]
    if quota_cores is not None:
        if quota_cores <= 0:
            raise ValueError(f"quota_cores: expected > 0 or None, got {quota_cores!r}")
        limits.append(float(quota_cores))
    if cpuset_size is not None:
        if cpuset_size < 1:
            raise ValueError(f"cpuset_size: expected >= 1 or None, got {cpuset_size!r}")
        limits.append(float(cpuset_size))
    return min(limits)


def threads_for(cores: float) -> int:
    """Thread count for an allocation of ``cores`` CPUs: the quota rounded half up, at least 1.

    Rounding (not ``ceil``) keeps a quota of e.g. 1.2 cores from running 2 threads: a thread
    over the quota costs more than the fraction it could use (``reamer calibrate`` measured
    1 core with 2 threads at 0.68 of 1 thread's speed). The speed model uses the same rule."""
    if not (cores > 0 and math.isfinite(cores)):
        raise ValueError(f"cores: expected a finite number > 0, got {cores!r}")
    return max(1, math.floor(cores + 0.5))


def thread_env(cores: float) -> dict[str, str]:
    """Environment for a child process: OpenMP/BLAS pools sized to ``cores``.

    Also sets ``OMP_WAIT_POLICY=PASSIVE``: an idle OpenMP worker that spin-waits burns
    the container's CFS quota doing nothing.
    """
    n = str(threads_for(cores))
    env = {var: n for var in THREAD_ENV_VARS}
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def torch_threads(cores: float) -> tuple[int, int]:
    """``(intra_op, inter_op)`` for PyTorch. Inter-op threads only run ``torch.jit.fork``
    tasks; one per four intra-op threads (at least one) is plenty."""
    n = threads_for(cores)
    return n, max(1, n // 4)


def dataloader_workers(cores: float) -> int:
    """``torch.utils.data.DataLoader`` workers: the allocation minus the training thread,
    0 (load in the main process) below two cores, at most 8."""
    return min(8, max(0, threads_for(cores) - 1)) if cores >= 2 else 0


def ort_session_options(cores: float) -> Any:
    """``onnxruntime.SessionOptions`` with intra-op threads sized to ``cores``, one
    inter-op thread (sequential execution) and no spin-waiting (spinning burns quota)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads_for(cores)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return opts


def apply_torch(cores: float) -> tuple[int, int]:
    """At start-up, before any parallel work: set both PyTorch pools. Returns them."""
    import torch

    intra, inter = torch_threads(cores)
    torch.set_num_threads(intra)
    try:
        torch.set_num_interop_threads(inter)
    except RuntimeError:
        pass  # inter-op pool already started; it can only be set once per process
    return intra, inter


def retune_torch(cores: float) -> int:
    """Re-size PyTorch's intra-op pool of a running process (no restart). Returns it."""
    import torch

    intra, _ = torch_threads(cores)
    if torch.get_num_threads() != intra:
        torch.set_num_threads(intra)
    return intra


# ---------------------------------------------------------------------- own cgroup
def _parse_proc_cgroup(text: str) -> tuple[str | None, dict[str, str]]:
    """``/proc/self/cgroup`` → (v2 path or None, {v1 controller: path})."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            v2 = path
        else:
            for c in ctrls.split(","):
                if c:
                    v1[c] = path
    return v2, v1


def _own_dir(top: Path, rel: str) -> Path:
    """The process's cgroup directory under a mount; without a cgroup namespace the
    path from ``/proc/self/cgroup`` may not exist in the container's view → the mount root."""
    d = top / rel.lstrip("/")
    return d if d.is_dir() else top


def read_own_quota(
    proc_self_cgroup_path: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> float | None:
    """This process's CFS quota in cores (tightest on the path to the root), ``None`` if
    unlimited or unreadable. Handles v2, v1 with ``cpu`` or ``cpu,cpuacct`` mounts, and
    hybrid hosts (v1 cpu controller plus an empty v2 tree)."""
    try:
        v2_path, v1_paths = _parse_proc_cgroup(Path(proc_self_cgroup_path).read_text())
    except OSError:
        return None
    root = Path(cgroup_root)
    if v2_path is not None and (root / "cgroup.controllers").exists():
        return tightest_quota(_own_dir(root, v2_path), root, 2)
    if "cpu" in v1_paths:
        for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            top = root / mount
            if top.is_dir():
                return tightest_quota(_own_dir(top, v1_paths["cpu"]), top, 1)
    return None


def own_effective_cpus(
    proc_self_cgroup_path: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> float:
    """Effective CPUs of this process: its quota, its affinity (which reflects the cpuset)."""
    n = node_cores()
    return effective_cpus(read_own_quota(proc_self_cgroup_path, cgroup_root), n, n)


class QuotaWatcher:
    """Re-tunes a running workload when its CPU allocation changes — no restart.

    ``read`` returns the current effective cores (e.g. :func:`own_effective_cpus`, or
    ``lambda: executor.effective_cpus(name)``; ``None`` = unknown → ``default_cores``);
    ``apply`` gets the new cores whenever the thread count they imply changes (e.g.
    :func:`retune_torch`, or re-creating an ONNX Runtime session).

    Call :meth:`poll` from the thread that runs the framework's work, e.g. between
    training steps: it re-reads at most every ``interval_s`` (two small file reads).
    Not a background thread on purpose — OpenMP's thread count is a per-thread setting,
    so ``torch.set_num_threads`` from another thread does not reach the training loop.
    """

    def __init__(
        self,
        read: Callable[[], float | None],
        apply: Callable[[float], Any],
        *,
        interval_s: float = 1.0,
        default_cores: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.read = read
        self.apply = apply
        self.interval_s = interval_s
        self.default_cores = float(default_cores) if default_cores is not None else float(node_cores())
        self.clock = clock
        self.cores: float | None = None
        self.threads: int | None = None
        self._last: float | None = None

    def poll(self, *, force: bool = False) -> bool:
        """Re-read (if ``interval_s`` passed, or ``force``) and apply on a change.
        Returns True when ``apply`` was called."""
        now = self.clock()
        if not force and self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        try:
            cores = self.read()
        except (OSError, ValueError):
            return False  # transient read failure: keep the current sizing
        cores = self.default_cores if cores is None else cores
        self.cores = cores
        n = threads_for(cores)
        if n == self.threads:
            return False
        self.apply(cores)
        self.threads = n
        return True


def watch_quota(
    read: Callable[[], float | None] = own_effective_cpus,
    apply: Callable[[float], Any] = retune_torch,
    *,
    interval_s: float = 1.0,
) -> QuotaWatcher:
    """A :class:`QuotaWatcher`, applied once now; call ``.poll()`` from the training loop."""
    w = QuotaWatcher(read, apply, interval_s=interval_s)
    w.poll(force=True)
    return w
