"""Container-aware thread sizing and reading a process's own CPU quota."""

from __future__ import annotations

from pathlib import Path

import pytest

from reamer.backends.local import launcher as L


def test_effective_cpus_is_the_tightest_limit():
    assert L.effective_cpus(None, None, 64) == 64.0
    assert L.effective_cpus(0.5, None, 64) == 0.5
    assert L.effective_cpus(3.0, 2, 64) == 2.0
    assert L.effective_cpus(1.5, 4, 64) == 1.5
    assert L.effective_cpus(100.0, None, 8) == 8.0
    for bad in [(0.0, None, 4), (None, 0, 4), (None, None, 0)]:
        with pytest.raises(ValueError):
            L.effective_cpus(*bad)


@pytest.mark.parametrize(
    ("cores", "threads"), [(0.1, 1), (0.5, 1), (1.0, 1), (1.0000000001, 1), (1.2, 1), (1.5, 2), (2.0, 2), (7.2, 7), (7.5, 8)]
)
def test_threads_for(cores: float, threads: int):
    assert L.threads_for(cores) == threads


def test_threads_for_rejects_nonsense():
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            L.threads_for(bad)


def test_thread_env():
    env = L.thread_env(0.5)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        assert env[var] == "1"
    assert L.thread_env(2.5)["OMP_NUM_THREADS"] == "3"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert all(isinstance(v, str) for v in env.values())


def test_torch_threads_and_dataloader_workers():
    assert L.torch_threads(0.5) == (1, 1)
    assert L.torch_threads(1.5) == (2, 1)
    assert L.torch_threads(16) == (16, 4)
    assert L.dataloader_workers(0.5) == 0
    assert L.dataloader_workers(1.5) == 0
    assert L.dataloader_workers(4) == 3
    assert L.dataloader_workers(64) == 8


def test_ort_session_options():
    pytest.importorskip("onnxruntime")
    opts = L.ort_session_options(1.5)
    assert opts.intra_op_num_threads == 2
    assert opts.inter_op_num_threads == 1
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_retune_torch():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        assert L.retune_torch(0.5) == 1 and torch.get_num_threads() == 1
        assert L.retune_torch(1.5) == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- own quota
def _proc(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "proc_self_cgroup"
    p.write_text(text)
    return p


def _dir(root: Path, rel: str, **files: str) -> Path:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("_", ".", 1)).write_text(text)
    return d


def test_read_own_quota_v2(tmp_path: Path):
    root = tmp_path / "cg"
    _dir(root, "", cgroup_controllers="cpu cpuset memory")
    _dir(root, "kubepods/pod1", cpu_max="max 100000")
    _dir(root, "kubepods/pod1/ctr", cpu_max="150000 100000")
    proc = _proc(tmp_path, "0::/kubepods/pod1/ctr\n")
    assert L.read_own_quota(proc, root) == 1.5
    (root / "kubepods/pod1/cpu.max").write_text("50000 100000")  # tighter pod-level limit
    assert L.read_own_quota(proc, root) == 0.5
    (root / "kubepods/pod1/cpu.max").write_text("max 100000")
    (root / "kubepods/pod1/ctr/cpu.max").write_text("max 100000")
    assert L.read_own_quota(proc, root) is None


def test_read_own_quota_v2_in_cgroup_namespace(tmp_path: Path):
    """Inside a container with its own cgroup namespace the path is "/" and the quota
    sits on the mount root."""
    root = tmp_path / "cg"
    _dir(root, "", cgroup_controllers="cpu", cpu_max="25000 50000")
    assert L.read_own_quota(_proc(tmp_path, "0::/\n"), root) == 0.5


@pytest.mark.parametrize("mount", ["cpu", "cpu,cpuacct"])
def test_read_own_quota_v1(tmp_path: Path, mount: str):
    root = tmp_path / "cg"
    _dir(root, f"{mount}/docker/abc", cpu_cfs_quota_us="50000", cpu_cfs_period_us="100000")
    proc = _proc(tmp_path, f"12:memory:/docker/abc\n4:{mount}:/docker/abc\n1:name=systemd:/x\n0::/\n")
    assert L.read_own_quota(proc, root) == 0.5  # hybrid host: "0::/" but no v2 controllers


def test_read_own_quota_v1_without_cgroupns_falls_back_to_mount_root(tmp_path: Path):
    root = tmp_path / "cg"
    _dir(root, "cpu", cpu_cfs_quota_us="200000", cpu_cfs_period_us="100000")
    proc = _proc(tmp_path, "3:cpu:/host/path/not/visible\n")
    assert L.read_own_quota(proc, root) == 2.0


def test_read_own_quota_unlimited_or_unreadable(tmp_path: Path):
    root = tmp_path / "cg"
    _dir(root, "cpu/a", cpu_cfs_quota_us="-1", cpu_cfs_period_us="100000")
    assert L.read_own_quota(_proc(tmp_path, "3:cpu:/a\n"), root) is None
    assert L.read_own_quota(tmp_path / "missing", root) is None
    assert L.read_own_quota(_proc(tmp_path, "3:memory:/a\n"), root) is None


def test_own_effective_cpus_is_bounded_by_affinity(tmp_path: Path):
    root = tmp_path / "cg"
    _dir(root, "", cgroup_controllers="cpu", cpu_max="25000 100000")
    assert L.own_effective_cpus(_proc(tmp_path, "0::/\n"), root) == 0.25
    _dir(root, "", cpu_max="max 100000")
    assert L.own_effective_cpus(_proc(tmp_path, "0::/\n"), root) == float(L.node_cores())


# ----------------------------------------------------------------------------- re-tuning
def test_quota_watcher_applies_only_on_thread_count_changes():
    readings = iter([0.5, 0.8, 1.5, 1.5, None, OSError("gone"), 3.0])
    applied: list[float] = []
    now = [0.0]
    w = L.QuotaWatcher(lambda: _next(readings), applied.append, interval_s=1.0, default_cores=4, clock=lambda: now[0])
    assert w.poll() is True and applied == [0.5] and w.threads == 1
    now[0] = 0.5
    assert w.poll() is False  # within the interval: not even read
    now[0] = 1.0
    assert w.poll() is False and w.cores == 0.8  # still one thread
    now[0] = 2.0
    assert w.poll() is True and applied == [0.5, 1.5]
    now[0] = 3.0
    assert w.poll() is False  # unchanged
    now[0] = 4.0
    assert w.poll() is True and applied[-1] == 4.0  # unknown → default cores
    now[0] = 5.0
    assert w.poll() is False and w.threads == 4  # a failed read keeps the sizing
    assert w.poll(force=True) is True and applied[-1] == 3.0


def _next(it):
    v = next(it)
    if isinstance(v, Exception):
        raise v
    return v


def test_watch_quota_applies_at_once():
    seen: list[float] = []
    w = L.watch_quota(lambda: 2.0, seen.append, interval_s=10)
    assert seen == [2.0] and w.threads == 2
