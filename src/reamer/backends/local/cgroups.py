"""The cgroup executor — the only code in Reamer that writes cgroup files.

Like Koordinator's ``resourceexecutor``: every write goes through one private method
(:meth:`CgroupExecutor._write`), every failure is a one-line :class:`CgroupError` naming
the file and what was expected. The root path is injected, so tests run against a temp
directory that imitates a cgroup tree and, when root, against ``/sys/fs/cgroup``.

Layouts
-------
* **v2** (unified): one directory per cgroup, ``ROOT/PREFIX/NAME``; controllers are
  enabled for children through ``cgroup.subtree_control`` of ``ROOT`` and ``ROOT/PREFIX``.
  Files: ``cpu.max``, ``cpu.weight``, ``cpuset.cpus``, ``cpuset.cpus.effective``, ``memory.max``,
  ``cpu.stat`` (``usage_usec nr_periods nr_throttled throttled_usec``), ``cgroup.procs``.
* **v1**: one hierarchy per controller, ``ROOT/cpu/PREFIX/NAME``, ``ROOT/cpuset/...``,
  ``ROOT/memory/...``. ``cpuacct`` is either co-mounted with ``cpu`` (``cpu,cpuacct``) or
  its own hierarchy; both are handled. A new v1 cpuset cgroup has empty ``cpuset.cpus``
  and ``cpuset.mems`` and accepts no task until they are copied from the parent.

Every cgroup Reamer creates lives under ``PREFIX``, so a startup :meth:`~CgroupExecutor.sweep`
finds and removes the leftovers of a crashed run without touching anything else.
"""

from __future__ import annotations

import errno
import math
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
CONTROLLERS = ("cpu", "cpuset", "memory")
# directory names a v1 controller is mounted under, in order of preference
_V1_MOUNTS = {
    "cpu": ("cpu", "cpu,cpuacct", "cpuacct,cpu"),
    "cpuacct": ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"),
    "cpuset": ("cpuset",),
    "memory": ("memory",),
}
MIN_QUOTA_US = 1000  # kernel minimum for cfs_quota_us / cpu.max quota
MIN_PERIOD_US, MAX_PERIOD_US = 1000, 1_000_000
MIN_WEIGHT, DEFAULT_WEIGHT, MAX_WEIGHT = 1, 100, 10_000  # v2 cpu.weight; v1 cpu.shares = weight × 1024 / 100


class CgroupError(Exception):
    """A cgroup operation failed. ``str(err)`` is one line: ``FILE: expected WHAT: REASON``."""

    def __init__(self, path: Path | str, expected: str, reason: str):
        self.path = Path(path)
        self.expected = expected
        self.reason = reason
        super().__init__(f"{path}: expected {expected}: {reason}".replace("\n", " "))


@dataclass(frozen=True, slots=True)
class CpuStats:
    """Cumulative CPU accounting of one cgroup (subtract two readings for a window)."""

    usage_s: float  # CPU time consumed by all tasks
    nr_periods: int  # CFS enforcement periods that had runnable tasks
    nr_throttled: int  # periods in which the group ran out of quota
    throttled_s: float  # total time the group's tasks were throttled

    def __sub__(self, other: CpuStats) -> CpuStats:
        return CpuStats(
            self.usage_s - other.usage_s,
            self.nr_periods - other.nr_periods,
            self.nr_throttled - other.nr_throttled,
            self.throttled_s - other.throttled_s,
        )


def format_cpus(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"`` (the kernel's cpu-list format)."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def parse_cpus(text: str) -> list[int]:
    """``"0-2,5"`` → ``[0, 1, 2, 5]``; empty text → ``[]``. Raises ValueError on bad text."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        a = int(lo)
        b = int(hi) if sep else a
        if b < a or a < 0:
            raise ValueError(f"bad cpu range {part!r}")
        cpus.extend(range(a, b + 1))
    return sorted(set(cpus))


def parse_kv(text: str) -> dict[str, int]:
    """Flat-keyed cgroup file (``cpu.stat``, ``memory.stat``): ``key value`` per line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def parse_cpu_max(text: str) -> tuple[int | None, int]:
    """v2 ``cpu.max`` → ``(quota_us or None for "max", period_us)``."""
    parts = text.split()
    if not parts or len(parts) > 2:
        raise ValueError(f"bad cpu.max {text!r}")
    period = int(parts[1]) if len(parts) == 2 else 100_000
    return (None if parts[0] == "max" else int(parts[0])), period


def detect_version(root: Path) -> Literal[1, 2]:
    """v2 when ``root`` is a unified hierarchy (has ``cgroup.controllers``), else v1."""
    return 2 if (root / "cgroup.controllers").exists() else 1


class CgroupExecutor:
    """Creates, configures, reads and removes Reamer-owned cgroups under ``root``.

    ``controllers`` limits which controllers are used (v1: which hierarchies get a
    directory; v2: which are enabled in ``cgroup.subtree_control``). The default is all
    three; pass ``("cpu", "cpuset")`` to leave the memory hierarchy alone.
    """

    def __init__(
        self,
        root: Path | str,
        version: Literal[1, 2] | None = None,
        prefix: str = "reamer",
        controllers: Sequence[str] = CONTROLLERS,
    ):
        self.root = Path(root)
        if not self.root.is_dir():
            raise CgroupError(self.root, "a mounted cgroup tree (directory)", "not a directory")
        self.version: Literal[1, 2] = version if version is not None else detect_version(self.root)
        if self.version not in (1, 2):
            raise CgroupError(self.root, "cgroup version 1 or 2", f"got {self.version!r}")
        if not _NAME.match(prefix):
            raise CgroupError(self.root / prefix, "a prefix of [A-Za-z0-9_.-]", f"got {prefix!r}")
        self.prefix = prefix
        bad = [c for c in controllers if c not in CONTROLLERS]
        if bad or not controllers:
            raise CgroupError(self.root, f"controllers among {CONTROLLERS}", f"got {tuple(controllers)!r}")
        self.controllers = tuple(dict.fromkeys(controllers))
        self._hier: dict[str, Path] = self._hierarchies() if self.version == 1 else {}

    # ------------------------------------------------------------------ layout
    def _hierarchies(self) -> dict[str, Path]:
        """v1: controller → mount directory (``cpuacct`` rides along with ``cpu``)."""
        wanted = list(self.controllers)
        if "cpu" in wanted:
            wanted.append("cpuacct")
        out: dict[str, Path] = {}
        for ctrl in wanted:
            found = next((self.root / d for d in _V1_MOUNTS[ctrl] if (self.root / d).is_dir()), None)
            if ctrl == "cpuacct" and "cpu" in out and (out["cpu"] / "cpuacct.usage").exists():
                found = out["cpu"]  # co-mounted cpu,cpuacct
            if found is None:
                if ctrl == "cpuacct":
                    continue  # usage then unavailable; read_stats says so
                raise CgroupError(
                    self.root / _V1_MOUNTS[ctrl][0],
                    f"a mounted cgroup-v1 {ctrl!r} hierarchy",
                    "directory missing",
                )
            out[ctrl] = found
        return out

    def _hier_roots(self) -> list[Path]:
        """Distinct hierarchy roots in use (v2: just ``root``)."""
        if self.version == 2:
            return [self.root]
        seen: dict[Path, Path] = {}
        for p in self._hier.values():
            seen.setdefault(p.resolve(), p)
        return list(seen.values())

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise CgroupError(self.root / self.prefix / str(name), "a cgroup name of [A-Za-z0-9_.-]", f"got {name!r}")

    def path(self, name: str, controller: str = "cpu") -> Path:
        """Directory of cgroup ``name`` for ``controller`` (v2: the one directory)."""
        self._check_name(name)
        if self.version == 2:
            return self.root / self.prefix / name
        if controller not in self._hier:
            raise CgroupError(
                self.root / controller, f"controller {controller!r} in use", f"in use: {tuple(self._hier)}"
            )
        return self._hier[controller] / self.prefix / name

    def _dirs(self, name: str) -> list[Path]:
        self._check_name(name)
        return [h / self.prefix / name for h in self._hier_roots()]

    def exists(self, name: str) -> bool:
        return any(d.is_dir() for d in self._dirs(name))

    # ------------------------------------------------------------------ io
    def _write(self, path: Path, value: str | int, expected: str = "a writable cgroup file") -> None:
        """The one place that writes a cgroup file. One value per ``write(2)``."""
        text = f"{value}\n"
        try:
            with open(path, "w") as fh:
                fh.write(text)
        except OSError as err:
            raise CgroupError(path, expected, f"writing {str(value)!r} failed: {err.strerror or err}") from None

    def _read(self, path: Path, expected: str = "a readable cgroup file") -> str:
        return _read_file(path, expected)

    def _mkdir(self, path: Path) -> bool:
        try:
            path.mkdir()
            return True
        except FileExistsError:
            return False
        except OSError as err:
            raise CgroupError(path, "to create a cgroup directory", err.strerror or str(err)) from None

    def _rmdir(self, path: Path, busy_s: float = 2.0) -> None:
        """Remove a cgroup directory (cgroupfs removes its control files with it). ``EBUSY`` is
        retried for ``busy_s``: ``cgroup.procs`` reads empty while a killed process's last
        threads still exit (a large address space takes a moment), as container runtimes retry."""
        deadline = time.monotonic() + busy_s
        while True:
            try:
                path.rmdir()
                return
            except OSError as err:
                if err.errno == errno.EBUSY and time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                raise CgroupError(path, "a cgroup without processes or child cgroups to rmdir",
                                  err.strerror or str(err)) from None

    def _init_cpuset_v1(self, child: Path) -> None:
        """A new v1 cpuset cgroup has empty cpus/mems: copy them from the parent."""
        for f in ("cpuset.cpus", "cpuset.mems"):
            if not self._read(child / f, f"{f} of a v1 cpuset cgroup").strip():
                parent = self._read(child.parent / f, f"{f} of the parent cpuset").strip()
                self._write(child / f, parent, f"{f} copied from the parent ({parent!r})")

    def _enable_v2(self, directory: Path) -> None:
        ctl = directory / "cgroup.subtree_control"
        have = set(self._read(ctl, "cgroup.subtree_control of a v2 cgroup").split())
        avail = set(self._read(directory / "cgroup.controllers", "cgroup.controllers of a v2 cgroup").split())
        for c in self.controllers:
            if c in have:
                continue
            if c not in avail:
                raise CgroupError(directory / "cgroup.controllers", f"controller {c!r} available", f"have {sorted(avail)}")
            self._write(ctl, f"+{c}", f"controller {c!r} enabled for children")

    def _ensure_prefix(self) -> None:
        if self.version == 2:
            self._enable_v2(self.root)
            pdir = self.root / self.prefix
            self._mkdir(pdir)
            self._enable_v2(pdir)
            return
        for h in self._hier_roots():
            pdir = h / self.prefix
            self._mkdir(pdir)
            if (pdir / "cpuset.cpus").exists():
                self._init_cpuset_v1(pdir)

    # ------------------------------------------------------------------ lifecycle
    def create(self, name: str) -> Path:
        """Create cgroup ``name`` (in every hierarchy in use on v1). Returns its (first) directory."""
        self._check_name(name)
        if self.exists(name):
            raise CgroupError(self._dirs(name)[0], "a cgroup that does not exist yet", "already exists (sweep leftovers?)")
        self._ensure_prefix()
        for d in self._dirs(name):
            self._mkdir(d)
            if self.version == 1 and (d / "cpuset.cpus").exists():
                self._init_cpuset_v1(d)
        return self._dirs(name)[0]

    def procs(self, name: str) -> list[int]:
        """PIDs in the cgroup (union over v1 hierarchies)."""
        pids: set[int] = set()
        for d in self._dirs(name):
            f = d / "cgroup.procs"
            if f.exists():
                pids.update(int(x) for x in self._read(f, "a list of pids").split())
        return sorted(pids)

    def remove(self, name: str, *, kill: bool = False, timeout_s: float = 5.0, missing_ok: bool = True) -> None:
        """Remove cgroup ``name``. Fails if processes remain, unless ``kill`` (SIGKILL, then wait)."""
        dirs = [d for d in self._dirs(name) if d.is_dir()]
        if not dirs:
            if missing_ok:
                return
            raise CgroupError(self._dirs(name)[0], "an existing cgroup to remove", "no such cgroup")
        pids = self.procs(name)
        if pids and not kill:
            raise CgroupError(
                dirs[0] / "cgroup.procs",
                "no processes before removal (pass kill=True to SIGKILL them)",
                f"pids {pids} still inside",
            )
        deadline = time.monotonic() + timeout_s
        while pids:
            cg_kill = dirs[0] / "cgroup.kill"
            if self.version == 2 and cg_kill.exists():
                self._write(cg_kill, 1, "cgroup.kill to accept 1")
            else:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    except PermissionError as err:
                        raise CgroupError(dirs[0] / "cgroup.procs", f"permission to kill pid {pid}", str(err)) from None
            if time.monotonic() > deadline:
                raise CgroupError(dirs[0] / "cgroup.procs", f"empty within {timeout_s}s of SIGKILL", f"pids {pids} remain")
            time.sleep(0.01)
            pids = self.procs(name)
        for d in dirs:
            self._rmdir(d)

    def list_owned(self) -> list[str]:
        """Names of all cgroups under the prefix, in any hierarchy (leftovers included)."""
        names: set[str] = set()
        for h in self._hier_roots():
            pdir = h / self.prefix
            if pdir.is_dir():
                names.update(p.name for p in pdir.iterdir() if p.is_dir())
        return sorted(names)

    def sweep(self, *, kill: bool = True) -> list[str]:
        """Startup sweep: remove every owned cgroup (SIGKILLing what is left inside when
        ``kill``) and the prefix directories. Returns the names removed."""
        removed = []
        for name in self.list_owned():
            self.remove(name, kill=kill)
            removed.append(name)
        for h in self._hier_roots():
            pdir = h / self.prefix
            if pdir.is_dir():
                self._rmdir(pdir)
        return removed

    def add_process(self, name: str, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the cgroup, in every hierarchy."""
        if not isinstance(pid, int) or pid <= 0:
            raise CgroupError(self._dirs(name)[0] / "cgroup.procs", "a positive pid", f"got {pid!r}")
        for d in self._dirs(name):
            if not d.is_dir():
                raise CgroupError(d, "an existing cgroup (call create first)", "no such cgroup")
            self._write(d / "cgroup.procs", pid, f"pid {pid} to join")

    # ------------------------------------------------------------------ limits
    def set_cpu(self, name: str, cores: float | None, period_us: int = 100_000) -> None:
        """CFS bandwidth: ``cores`` CPUs' worth of time per period; ``None`` = unlimited."""
        d = self.path(name, "cpu")
        if not (MIN_PERIOD_US <= int(period_us) <= MAX_PERIOD_US):
            raise CgroupError(d, f"period_us in [{MIN_PERIOD_US}, {MAX_PERIOD_US}]", f"got {period_us!r}")
        period_us = int(period_us)
        quota: int | None = None
        if cores is not None:
            if not (isinstance(cores, int | float) and math.isfinite(cores) and cores > 0):
                raise CgroupError(d, "cores > 0 or None", f"got {cores!r}")
            quota = round(cores * period_us)
            if quota < MIN_QUOTA_US:
                raise CgroupError(d, f"a quota of at least {MIN_QUOTA_US} us", f"{cores} cores x {period_us} us = {quota} us")
        if self.version == 2:
            value = f"{'max' if quota is None else quota} {period_us}"
            self._write(d / "cpu.max", value, "cpu.max to accept 'QUOTA PERIOD'")
            return
        cur_period = self._read(d / "cpu.cfs_period_us", "cpu.cfs_period_us").strip()
        if cur_period != str(period_us):
            # unlimit first so the new period never meets an incompatible old quota
            self._write(d / "cpu.cfs_quota_us", -1, "cpu.cfs_quota_us to accept -1")
            self._write(d / "cpu.cfs_period_us", period_us, f"cpu.cfs_period_us to accept {period_us}")
        self._write(d / "cpu.cfs_quota_us", -1 if quota is None else quota, "cpu.cfs_quota_us to accept the quota")

    def set_cpu_weight(self, name: str, weight: int) -> None:
        """CPU share when CPUs are contended, relative to its siblings: v2 ``cpu.weight``
        (default 100); v1 ``cpu.shares`` = ``weight`` × 1024 / 100 (default 1024)."""
        d = self.path(name, "cpu")
        if not isinstance(weight, int) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
            raise CgroupError(d, f"an integer weight in [{MIN_WEIGHT}, {MAX_WEIGHT}]", f"got {weight!r}")
        if self.version == 2:
            self._write(d / "cpu.weight", weight, f"cpu.weight to accept {weight}")
        else:
            shares = max(2, round(weight * 1024 / DEFAULT_WEIGHT))
            self._write(d / "cpu.shares", shares, f"cpu.shares to accept {shares}")

    def set_cpuset(self, name: str, cpus: Sequence[int] | None) -> None:
        """Pin the cgroup to ``cpus``; ``None`` = the parent's CPUs."""
        d = self.path(name, "cpuset")
        if cpus is not None:
            if not cpus or any(not isinstance(c, int) or c < 0 for c in cpus):
                raise CgroupError(d / "cpuset.cpus", "a non-empty list of cpu ids >= 0 or None", f"got {cpus!r}")
            value = format_cpus(cpus)
        elif self.version == 2:
            value = ""  # v2: empty = inherit from the nearest ancestor
        else:
            value = self._read(d.parent / "cpuset.cpus", "the parent's cpuset.cpus").strip()
        self._write(d / "cpuset.cpus", value, f"cpuset.cpus to accept {value!r} (a subset of the parent's)")

    def set_memory(self, name: str, limit_bytes: int | None) -> None:
        """Hard memory limit in bytes; ``None`` = unlimited."""
        d = self.path(name, "memory")
        if limit_bytes is not None and (not isinstance(limit_bytes, int) or limit_bytes <= 0):
            raise CgroupError(d, "limit_bytes > 0 (int) or None", f"got {limit_bytes!r}")
        if self.version == 2:
            self._write(d / "memory.max", "max" if limit_bytes is None else limit_bytes, "memory.max to accept the limit")
        else:
            self._write(
                d / "memory.limit_in_bytes", -1 if limit_bytes is None else limit_bytes, "memory.limit_in_bytes to accept the limit"
            )

    # ------------------------------------------------------------------ reads
    def read_stats(self, name: str) -> CpuStats:
        """Cumulative usage and throttling from ``cpu.stat`` (v1: plus ``cpuacct.usage``)."""
        if self.version == 1 and "cpuacct" not in self._hier:
            raise CgroupError(self.root / "cpuacct", "a mounted cgroup-v1 cpuacct hierarchy for usage", "not mounted")
        usage = self._hier["cpuacct"] / self.prefix / name if self.version == 1 else None
        return read_cpu_stats(self.path(name, "cpu"), self.version, usage)

    def quota_cores(self, name: str) -> float | None:
        """Tightest CFS quota/period on the path from the cgroup up to the root; None = unlimited."""
        return tightest_quota(self.path(name, "cpu"), self.root if self.version == 2 else self._hier["cpu"], self.version)

    def cpus(self, name: str) -> list[int]:
        """The CPUs the cgroup may run on (effective cpuset)."""
        if "cpuset" not in self.controllers:
            # not managed here: the cgroup runs on the root cpuset
            root_file = (
                self.root / "cpuset.cpus.effective" if self.version == 2 else self.root / "cpuset" / "cpuset.effective_cpus"
            )
            try:
                cpus = parse_cpus(root_file.read_text())
            except (OSError, ValueError):
                cpus = []
            return cpus or list(range(os.cpu_count() or 1))
        d = self.path(name, "cpuset")
        top = self.root if self.version == 2 else self._hier["cpuset"]
        eff = "cpuset.cpus.effective" if self.version == 2 else "cpuset.effective_cpus"
        while True:
            for f in (eff, "cpuset.cpus"):
                if (d / f).exists():
                    cpus = parse_cpus(self._read(d / f, "a cpu list"))
                    if cpus:
                        return cpus
            if d == top or top not in d.parents:
                return list(range(os.cpu_count() or 1))
            d = d.parent

    def effective_cpus(self, name: str) -> float:
        """``min(quota/period, cpuset size)`` — the CPUs a workload in the cgroup can really use."""
        n = float(len(self.cpus(name)))
        q = self.quota_cores(name)
        return n if q is None else min(q, n)


def read_cpu_stats(d: Path, version: int, usage_dir: Path | None = None) -> CpuStats:
    """Cumulative usage and throttling of any cgroup directory ``d`` (the one reader of
    ``cpu.stat``): v2 from ``cpu.stat``; v1 from ``cpu.stat`` and ``usage_dir``'s
    ``cpuacct.usage`` (default ``d``: a co-mounted ``cpu,cpuacct``)."""
    stat_file = d / "cpu.stat"
    kv = parse_kv(_read_file(stat_file, "cpu.stat"))
    if version == 2:
        keys = ("usage_usec", "nr_periods", "nr_throttled", "throttled_usec")
        _need(kv, keys, stat_file)
        return CpuStats(kv["usage_usec"] / 1e6, kv["nr_periods"], kv["nr_throttled"], kv["throttled_usec"] / 1e6)
    _need(kv, ("nr_periods", "nr_throttled", "throttled_time"), stat_file)
    usage_file = (usage_dir or d) / "cpuacct.usage"
    try:
        usage_ns = int(_read_file(usage_file, "cpuacct.usage (ns)").strip())
    except ValueError:
        raise CgroupError(usage_file, "an integer of nanoseconds", "unparsable") from None
    return CpuStats(usage_ns / 1e9, kv["nr_periods"], kv["nr_throttled"], kv["throttled_time"] / 1e9)


def _read_file(path: Path, expected: str) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise CgroupError(path, expected, e.strerror or str(e)) from None


def read_quota(d: Path, version: int) -> float | None:
    """The CFS quota of cgroup directory ``d`` in cores (``cpu.max`` on v2, ``cpu.cfs_quota_us``
    / ``cpu.cfs_period_us`` on v1); None when unlimited or unreadable."""
    try:
        if version == 2:
            quota, period = parse_cpu_max((d / "cpu.max").read_text())
        else:
            quota = int((d / "cpu.cfs_quota_us").read_text())
            period = int((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota is None or quota <= 0 or period <= 0:
        return None
    return quota / period


def tightest_quota(d: Path, top: Path, version: int) -> float | None:
    """The tightest quota on the path from ``d`` up to ``top`` (a parent's quota binds its
    children too); None when none is set."""
    best: float | None = None
    while True:
        q = read_quota(d, version)
        if q is not None:
            best = q if best is None else min(best, q)
        if d == top or top not in d.parents:
            return best
        d = d.parent


def _need(kv: dict[str, int], keys: Sequence[str], path: Path) -> None:
    missing = [k for k in keys if k not in kv]
    if missing:
        raise CgroupError(path, f"keys {', '.join(keys)}", f"missing {', '.join(missing)}")
