"""Workload processes of the local backend (:mod:`reamer.backends.local.procs`): real child
processes; the cgroup executor is a stand-in recording the pids (cgroups are covered by
``test_cgroups.py``), so these run without root."""

from __future__ import annotations

import os
import sys

import pytest

from reamer.backends.local.procs import Proc


class Executor:
    def __init__(self) -> None:
        self.added: list[tuple[str, int]] = []

    def add_process(self, cgroup: str, pid: int) -> None:
        self.added.append((cgroup, pid))


def _proc(tmp_path, name: str, code: str) -> Proc:
    return Proc([sys.executable, "-c", code], cgroup=name, executor=Executor(), log=tmp_path / f"{name}.log")


def test_a_line_that_arrives_is_returned(tmp_path):
    p = _proc(tmp_path, "w", 'import json; print(json.dumps({"event": "connected", "port": 7}), flush=True)')
    try:
        assert p.wait_for("connected", 60)["port"] == 7
    finally:
        p.kill()
        p.close()


def test_waiting_for_a_line_fails_as_soon_as_a_process_it_depends_on_exits(tmp_path):
    """A worker waiting on a PS that died would otherwise wait out the whole launch timeout."""
    peer = _proc(tmp_path, "ps", "import sys; sys.exit(3)")
    waiter = _proc(tmp_path, "worker", "import time; time.sleep(120)")
    try:
        # the message is not the timeout's: the peer's exit ended the wait
        with pytest.raises(RuntimeError, match=r"^worker: ps exited \(code 3\) before worker's 'connected'"):
            waiter.wait_for("connected", 100, peers=[peer])
        assert waiter.alive()
    finally:
        for p in (waiter, peer):
            p.kill()
            p.close()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs to restrict the parent to one")
def test_a_workload_does_not_inherit_the_controllers_cpu_affinity(tmp_path):
    """The controller may be pinned to the apparatus's CPUs; what it starts runs on its cgroup's
    CPUs (here: no cpuset, so all), not on the controller's."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mine)})
    try:
        p = _proc(tmp_path, "w", 'import json, os; print(json.dumps({"event": "cpus", '
                                 '"cpus": sorted(os.sched_getaffinity(0))}), flush=True)')
    finally:
        os.sched_setaffinity(0, mine)
    try:
        assert mine <= set(p.wait_for("cpus", 60)["cpus"])
    finally:
        p.kill()
        p.close()
