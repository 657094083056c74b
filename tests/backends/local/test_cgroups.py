"""CgroupExecutor against imitation v1/v2 trees in a temp dir, and (root only) the real tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reamer.backends.local.cgroups import (
    CgroupError,
    CgroupExecutor,
    CpuStats,
    detect_version,
    format_cpus,
    parse_cpu_max,
    parse_cpus,
    parse_kv,
)

V1_STAT = "nr_periods 0\nnr_throttled 0\nthrottled_time 0\nnr_bursts 0\nburst_time 0\n"
V2_STAT = "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"


# ----------------------------------------------------------------------------- fake kernel
def _v1_files(kind: str, parent: Path | None) -> dict[str, str]:
    files = {"cgroup.procs": "", "tasks": ""}
    if "cpu" in kind.split(","):
        files |= {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1", "cpu.stat": V1_STAT, "cpu.shares": "1024"}
    if "cpuacct" in kind.split(","):
        files |= {"cpuacct.usage": "0"}
    if kind == "cpuset":
        # a new v1 cpuset cgroup starts empty; the hierarchy root has everything
        files |= {"cpuset.cpus": "" if parent else "0-3", "cpuset.mems": "" if parent else "0"}
        files |= {"cpuset.effective_cpus": "" if parent else "0-3"}
    if kind == "memory":
        files |= {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "0"}
    return files


def _v2_files(parent: Path | None) -> dict[str, str]:
    ctrls = "cpuset cpu io memory pids" if parent is None else (parent / "cgroup.subtree_control").read_text()
    eff = "0-3" if parent is None else (parent / "cpuset.cpus.effective").read_text()
    files = {"cgroup.controllers": ctrls, "cgroup.subtree_control": "", "cgroup.procs": "", "cpu.stat": V2_STAT}
    if parent is not None:
        files |= {"cpu.max": "max 100000", "cpu.weight": "100", "cpuset.cpus": "", "cpuset.cpus.effective": eff, "memory.max": "max"}
    else:
        files |= {"cpuset.cpus.effective": eff}
    return files


def _populate(d: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (d / name).write_text(text)


class FakeExecutor(CgroupExecutor):
    """Imitates the kernel: a new cgroup directory gets its control files; subtree_control
    accumulates ``+ctrl`` writes; cgroup.procs lists only live processes; every write is logged."""

    writes: list[tuple[str, str]]

    def __init__(self, *a, **kw):
        self.writes = []
        super().__init__(*a, **kw)

    def _mkdir(self, path: Path) -> bool:
        made = super()._mkdir(path)
        if made:
            if self.version == 2:
                _populate(path, _v2_files(path.parent))
            else:
                kind = path.relative_to(self.root).parts[0]
                _populate(path, _v1_files(kind, path.parent))
        return made

    def _write(self, path: Path, value, expected: str = "a writable cgroup file") -> None:
        self.writes.append((str(path.relative_to(self.root)), str(value)))
        if path.name == "cgroup.subtree_control" and path.exists():
            have = path.read_text().split()
            have.append(str(value).lstrip("+"))
            value = " ".join(have)
        if path.name == "cgroup.procs" and path.exists():
            value = (path.read_text() + f"{value}\n").strip()
        super()._write(path, value, expected)

    def procs(self, name: str) -> list[int]:
        return [p for p in super().procs(name) if _alive(p)]

    def _rmdir(self, path: Path) -> None:
        # cgroupfs drops a cgroup's control files with it; here they are plain files
        for f in path.iterdir():
            if f.is_file():
                f.unlink()
        super()._rmdir(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # zombies are gone from a real cgroup
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def v2_root(tmp_path: Path) -> Path:
    root = tmp_path / "cg2"
    root.mkdir()
    _populate(root, _v2_files(None))
    return root


@pytest.fixture
def v1_root(tmp_path: Path) -> Path:
    """v1 with cpu and cpuacct in separate hierarchies (as on this machine)."""
    root = tmp_path / "cg1"
    for kind in ("cpu", "cpuacct", "cpuset", "memory"):
        (root / kind).mkdir(parents=True)
        _populate(root / kind, _v1_files(kind, None))
    return root


@pytest.fixture
def v1_comounted(tmp_path: Path) -> Path:
    """v1 with the common ``cpu,cpuacct`` co-mount (``cpu`` and ``cpuacct`` are symlinks)."""
    root = tmp_path / "cg1c"
    (root / "cpu,cpuacct").mkdir(parents=True)
    _populate(root / "cpu,cpuacct", _v1_files("cpu,cpuacct", None))
    (root / "cpu").symlink_to("cpu,cpuacct")
    (root / "cpuacct").symlink_to("cpu,cpuacct")
    (root / "cpuset").mkdir()
    _populate(root / "cpuset", _v1_files("cpuset", None))
    return root


def read(p: Path) -> str:
    return p.read_text().strip()


# ----------------------------------------------------------------------------- parsing
def test_cpu_list_round_trip():
    assert format_cpus([5, 0, 1, 2]) == "0-2,5"
    assert format_cpus([3]) == "3"
    assert parse_cpus("0-2,5\n") == [0, 1, 2, 5]
    assert parse_cpus("") == []
    with pytest.raises(ValueError):
        parse_cpus("3-1")


def test_parse_kv_and_cpu_max():
    assert parse_kv("a 1\nb 22\njunk\nc x\n") == {"a": 1, "b": 22}
    assert parse_cpu_max("max 100000\n") == (None, 100000)
    assert parse_cpu_max("50000 100000") == (50000, 100000)


def test_detect_version(v1_root: Path, v2_root: Path):
    assert detect_version(v2_root) == 2 and CgroupExecutor(v2_root).version == 2
    assert detect_version(v1_root) == 1 and CgroupExecutor(v1_root).version == 1


# ----------------------------------------------------------------------------- v2
def test_v2_create_enables_controllers_and_writes_limits(v2_root: Path):
    ex = FakeExecutor(v2_root)
    d = ex.create("job1")
    assert d == v2_root / "reamer" / "job1" and d.is_dir()
    assert set(read(v2_root / "cgroup.subtree_control").split()) == {"cpu", "cpuset", "memory"}
    assert set(read(v2_root / "reamer" / "cgroup.subtree_control").split()) == {"cpu", "cpuset", "memory"}

    ex.set_cpu("job1", 1.5)
    assert read(d / "cpu.max") == "150000 100000"
    ex.set_cpu("job1", 0.5, period_us=50_000)
    assert read(d / "cpu.max") == "25000 50000"
    ex.set_cpu("job1", None)
    assert read(d / "cpu.max") == "max 100000"
    ex.set_cpuset("job1", [0, 1, 3])
    assert read(d / "cpuset.cpus") == "0-1,3"
    ex.set_cpuset("job1", None)
    assert read(d / "cpuset.cpus") == ""
    ex.set_memory("job1", 2 << 30)
    assert read(d / "memory.max") == str(2 << 30)
    ex.set_memory("job1", None)
    assert read(d / "memory.max") == "max"
    ex.set_cpu_weight("job1", 1000)
    assert read(d / "cpu.weight") == "1000"
    # every change went through _write
    assert ("reamer/job1/cpu.max", "150000 100000") in ex.writes


def test_v2_controllers_already_enabled_are_not_rewritten(v2_root: Path):
    (v2_root / "cgroup.subtree_control").write_text("cpu cpuset memory")
    ex = FakeExecutor(v2_root, controllers=("cpu",))
    ex.create("a")
    assert not any(p == "cgroup.subtree_control" for p, _ in ex.writes)
    assert ("reamer/cgroup.subtree_control", "+cpu") in ex.writes


def test_v2_missing_controller_is_a_clear_error(v2_root: Path):
    (v2_root / "cgroup.controllers").write_text("cpu io")
    ex = FakeExecutor(v2_root)
    with pytest.raises(CgroupError, match=r"cgroup.controllers: expected controller 'cpuset' available"):
        ex.create("a")


def test_v2_read_stats_and_effective_cpus(v2_root: Path):
    ex = FakeExecutor(v2_root)
    d = ex.create("svc")
    (d / "cpu.stat").write_text(
        "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 40\nnr_throttled 12\nthrottled_usec 750000\n"
    )
    assert ex.read_stats("svc") == CpuStats(2.5, 40, 12, 0.75)
    assert ex.effective_cpus("svc") == 4.0  # no quota, cpuset 0-3
    ex.set_cpu("svc", 1.5)
    assert ex.effective_cpus("svc") == 1.5
    cpu_only = FakeExecutor(v2_root, controllers=("cpu",))
    (v2_root / "cpuset.cpus.effective").write_text("0-2")
    assert cpu_only.cpus("svc") == [0, 1, 2]  # cpuset not managed: the root's
    ex.set_cpu("svc", 8)
    (d / "cpuset.cpus.effective").write_text("0-1")
    assert ex.effective_cpus("svc") == 2.0  # cpuset binds
    (v2_root / "reamer" / "cpu.max").write_text("50000 100000")  # a tighter ancestor quota
    assert ex.effective_cpus("svc") == 0.5
    assert ex.quota_cores("svc") == 0.5


def test_v2_read_stats_missing_key_names_file_and_key(v2_root: Path):
    ex = FakeExecutor(v2_root)
    d = ex.create("svc")
    (d / "cpu.stat").write_text("usage_usec 1\n")
    with pytest.raises(CgroupError) as err:
        ex.read_stats("svc")
    msg = str(err.value)
    assert "cpu.stat" in msg and "nr_throttled" in msg and "\n" not in msg


# ----------------------------------------------------------------------------- v1
def test_v1_create_makes_every_hierarchy_and_inits_cpuset(v1_root: Path):
    ex = FakeExecutor(v1_root)
    ex.create("job")
    for kind in ("cpu", "cpuacct", "cpuset", "memory"):
        assert (v1_root / kind / "reamer" / "job").is_dir()
    for level in (v1_root / "cpuset" / "reamer", v1_root / "cpuset" / "reamer" / "job"):
        assert read(level / "cpuset.cpus") == "0-3"
        assert read(level / "cpuset.mems") == "0"


def test_v1_controllers_subset_leaves_other_hierarchies_alone(v1_root: Path):
    ex = FakeExecutor(v1_root, controllers=("cpu",))
    ex.create("job")
    assert (v1_root / "cpu" / "reamer" / "job").is_dir()
    assert (v1_root / "cpuacct" / "reamer" / "job").is_dir()  # usage lives there
    assert not (v1_root / "cpuset" / "reamer").exists()
    assert not (v1_root / "memory" / "reamer").exists()
    with pytest.raises(CgroupError, match="controller 'memory' in use"):
        ex.set_memory("job", 1 << 30)


def test_v1_limits(v1_root: Path):
    ex = FakeExecutor(v1_root)
    ex.create("job")
    cpu = v1_root / "cpu" / "reamer" / "job"
    ex.set_cpu("job", 1.5)
    assert (read(cpu / "cpu.cfs_quota_us"), read(cpu / "cpu.cfs_period_us")) == ("150000", "100000")
    ex.writes.clear()
    ex.set_cpu("job", 0.5, period_us=20_000)
    # a period change unlimits first, so no transient quota/period pair can be rejected
    assert ex.writes == [
        ("cpu/reamer/job/cpu.cfs_quota_us", "-1"),
        ("cpu/reamer/job/cpu.cfs_period_us", "20000"),
        ("cpu/reamer/job/cpu.cfs_quota_us", "10000"),
    ]
    ex.set_cpu("job", None, period_us=20_000)
    assert read(cpu / "cpu.cfs_quota_us") == "-1"
    ex.set_cpuset("job", [2, 3])
    assert read(v1_root / "cpuset" / "reamer" / "job" / "cpuset.cpus") == "2-3"
    ex.set_cpuset("job", None)
    assert read(v1_root / "cpuset" / "reamer" / "job" / "cpuset.cpus") == "0-3"
    ex.set_memory("job", 512 << 20)
    assert read(v1_root / "memory" / "reamer" / "job" / "memory.limit_in_bytes") == str(512 << 20)
    ex.set_memory("job", None)
    assert read(v1_root / "memory" / "reamer" / "job" / "memory.limit_in_bytes") == "-1"
    ex.set_cpu_weight("job", 1000)  # v2 units; v1 shares scale the default 1024
    assert read(cpu / "cpu.shares") == "10240"
    ex.set_cpu_weight("job", 1)
    assert read(cpu / "cpu.shares") == "10"


@pytest.mark.parametrize("bad", [0, 10_001, 1.5, "100"])
def test_cpu_weight_out_of_range_is_a_clear_error(v2_root: Path, bad: object):
    ex = FakeExecutor(v2_root)
    ex.create("job")
    with pytest.raises(CgroupError, match=r"reamer/job: expected an integer weight in \[1, 10000\]"):
        ex.set_cpu_weight("job", bad)  # type: ignore[arg-type]
    assert read(v2_root / "reamer" / "job" / "cpu.weight") == "100"  # nothing written


def test_v1_read_stats_separate_cpuacct(v1_root: Path):
    ex = FakeExecutor(v1_root)
    ex.create("job")
    (v1_root / "cpu" / "reamer" / "job" / "cpu.stat").write_text(
        "nr_periods 100\nnr_throttled 30\nthrottled_time 1500000000\nnr_bursts 0\nburst_time 0\n"
    )
    (v1_root / "cpuacct" / "reamer" / "job" / "cpuacct.usage").write_text("4250000000\n")
    assert ex.read_stats("job") == CpuStats(4.25, 100, 30, 1.5)
    a = CpuStats(1.0, 10, 2, 0.5)
    assert CpuStats(4.25, 100, 30, 1.5) - a == CpuStats(3.25, 90, 28, 1.0)


def test_v1_comounted_cpu_cpuacct(v1_comounted: Path):
    ex = FakeExecutor(v1_comounted, controllers=("cpu", "cpuset"))
    ex.create("job")
    d = v1_comounted / "cpu,cpuacct" / "reamer" / "job"
    assert d.is_dir()
    (d / "cpu.stat").write_text("nr_periods 5\nnr_throttled 1\nthrottled_time 20000000\n")
    (d / "cpuacct.usage").write_text("300000000")
    assert ex.read_stats("job") == CpuStats(0.3, 5, 1, 0.02)
    ex.set_cpu("job", 2.5)
    (v1_comounted / "cpuset" / "reamer" / "job" / "cpuset.effective_cpus").write_text("0-1")
    assert ex.effective_cpus("job") == 2.0
    ex.set_cpu("job", 0.25)
    assert ex.effective_cpus("job") == 0.25
    ex.remove("job")
    assert ex.list_owned() == []


def test_v1_missing_hierarchy_is_a_clear_error(tmp_path: Path):
    (tmp_path / "cpu").mkdir()
    with pytest.raises(CgroupError, match=r"cpuset: expected a mounted cgroup-v1 'cpuset' hierarchy"):
        CgroupExecutor(tmp_path)


# ----------------------------------------------------------------------------- lifecycle
@pytest.mark.parametrize("tree", ["v1_root", "v2_root"])
def test_add_process_and_remove(tree: str, request: pytest.FixtureRequest):
    root: Path = request.getfixturevalue(tree)
    ex = FakeExecutor(root)
    ex.create("w")
    proc = subprocess.Popen(["sleep", "30"])
    try:
        ex.add_process("w", proc.pid)
        procs_files = [p for p, v in ex.writes if p.endswith("cgroup.procs") and v == str(proc.pid)]
        assert len(procs_files) == (4 if tree == "v1_root" else 1)  # every v1 hierarchy
        assert ex.procs("w") == [proc.pid]
        with pytest.raises(CgroupError, match=r"cgroup.procs: expected no processes before removal"):
            ex.remove("w")
        assert ex.exists("w") and proc.poll() is None  # nothing moved or killed silently
        ex.remove("w", kill=True)
        assert not ex.exists("w")
        assert proc.wait(timeout=5) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_list_owned_and_sweep_touch_only_the_prefix(v1_root: Path):
    other = v1_root / "cpu" / "someone-else"
    other.mkdir()
    ex = FakeExecutor(v1_root)
    for n in ("a", "b"):
        ex.create(n)
    # a leftover that exists in one hierarchy only (crash half-way through create)
    (v1_root / "cpu" / "reamer" / "c").mkdir()
    assert ex.list_owned() == ["a", "b", "c"]
    assert ex.sweep() == ["a", "b", "c"]
    assert ex.list_owned() == []
    for kind in ("cpu", "cpuacct", "cpuset", "memory"):
        assert not (v1_root / kind / "reamer").exists()
    assert other.is_dir()
    assert FakeExecutor(v1_root, prefix="reamer").sweep() == []  # idempotent


def test_sweep_with_prefix_only_v2(v2_root: Path):
    ex = FakeExecutor(v2_root, prefix="reamer-x")
    ex.create("a")
    assert ex.sweep() == ["a"]
    assert not (v2_root / "reamer-x").exists()


def test_rmdir_failure_is_a_clear_error(v2_root: Path):
    ex = FakeExecutor(v2_root)
    ex.create("a")
    (v2_root / "reamer" / "a" / "child").mkdir()  # a nested cgroup Reamer did not make
    with pytest.raises(CgroupError, match=r"reamer/a: expected a cgroup without processes or child cgroups"):
        ex.remove("a")


def test_rmdir_retries_a_busy_cgroup_while_its_last_threads_exit(v2_root: Path, monkeypatch):
    """The kernel answers EBUSY while a killed process's last threads still exit, although
    cgroup.procs already reads empty: the removal waits for them rather than failing."""
    import errno

    ex = FakeExecutor(v2_root)
    ex.create("a")
    real, busy = Path.rmdir, [2]

    def rmdir(self):
        if self.name == "a" and busy[0]:
            busy[0] -= 1
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real(self)

    monkeypatch.setattr(Path, "rmdir", rmdir)
    ex.remove("a")
    assert busy == [0] and not (v2_root / "reamer" / "a").exists()


def test_errors_are_one_line_and_name_the_file(v2_root: Path, v1_root: Path):
    ex = FakeExecutor(v2_root)
    ex.create("a")
    with pytest.raises(CgroupError, match="already exists"):
        ex.create("a")
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(CgroupError, match="cores > 0 or None"):
            ex.set_cpu("a", bad)
    with pytest.raises(CgroupError, match="at least 1000 us"):
        ex.set_cpu("a", 0.005)
    with pytest.raises(CgroupError, match="period_us"):
        ex.set_cpu("a", 1.0, period_us=500)
    with pytest.raises(CgroupError, match="cgroup name"):
        ex.create("../etc")
    with pytest.raises(CgroupError, match="cpu ids"):
        ex.set_cpuset("a", [])
    with pytest.raises(CgroupError, match="limit_bytes"):
        ex.set_memory("a", 0)
    with pytest.raises(CgroupError, match="positive pid"):
        ex.add_process("a", 0)
    with pytest.raises(CgroupError, match="call create first"):
        ex.add_process("nope", os.getpid())
    with pytest.raises(CgroupError, match="no such cgroup"):
        ex.remove("nope", missing_ok=False)
    ex.remove("nope")  # missing_ok by default
    # a failed write names the file and the value
    (v2_root / "reamer" / "a" / "cpu.max").unlink()
    (v2_root / "reamer" / "a" / "cpu.max").mkdir()
    with pytest.raises(CgroupError) as err:
        ex.set_cpu("a", 1.0)
    msg = str(err.value)
    assert msg.startswith(str(v2_root / "reamer" / "a" / "cpu.max") + ": expected cpu.max")
    assert "'100000 100000'" in msg and "\n" not in msg


# ----------------------------------------------------------------------------- real tree
REAL = Path("/sys/fs/cgroup")


def _real_executor(prefix: str) -> CgroupExecutor:
    if os.geteuid() != 0:
        pytest.skip("needs root to write cgroups")
    if not REAL.is_dir() or not os.access(REAL, os.W_OK) and not any(
        os.access(REAL / d, os.W_OK) for d in ("cpu", "cpu,cpuacct")
    ):
        pytest.skip(f"{REAL} is not a writable cgroup tree")
    try:
        ex = CgroupExecutor(REAL, prefix=prefix, controllers=("cpu",))
        ex.sweep()
        ex.create("probe")
        ex.remove("probe")
    except (CgroupError, OSError) as err:
        pytest.skip(f"cgroups not writable here: {err}")
    return ex


@pytest.mark.privileged
def test_real_cgroup_lifecycle_leaves_nothing():
    ex = _real_executor(f"reamer-test-{os.getpid()}")
    name = "lifecycle"
    sleeper = None
    try:
        ex.create(name)
        ex.set_cpu(name, 0.5)
        assert ex.quota_cores(name) == 0.5
        assert 0 < ex.effective_cpus(name) <= 0.5
        sleeper = subprocess.Popen(["sleep", "30"])
        ex.add_process(name, sleeper.pid)
        assert sleeper.pid in ex.procs(name)
        # a CPU-bound child started inside the cgroup: is throttled and sees its own quota
        code = (
            "import time\nfrom reamer.backends.local.launcher import read_own_quota\n"
            "print(read_own_quota())\nt = time.time()\nwhile time.time() - t < 0.6: pass\n"
        )
        before = ex.read_stats(name)
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
            preexec_fn=lambda: ex.add_process(name, os.getpid()),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert float(out.stdout.strip()) == 0.5
        delta = ex.read_stats(name) - before
        assert delta.usage_s > 0.2
        assert delta.nr_periods > 0 and delta.nr_throttled > 0 and delta.throttled_s > 0
        with pytest.raises(CgroupError, match="no processes before removal"):
            ex.remove(name)
        ex.remove(name, kill=True)
        assert sleeper.wait(timeout=5) == -9
        assert not ex.exists(name)
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        ex.sweep()
    deadline = time.monotonic() + 2
    leftovers = [h / ex.prefix for h in ex._hier_roots() if (h / ex.prefix).exists()]
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        leftovers = [h / ex.prefix for h in ex._hier_roots() if (h / ex.prefix).exists()]
    assert leftovers == []
