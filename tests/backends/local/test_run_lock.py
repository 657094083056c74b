"""One real run per machine: a second one refuses in one line naming the holder, before it
sweeps anything; a holder that died (kill -9) frees the lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from reamer.backends.local.session import RunLocked, run_lock


def _holder(path):
    code = (f"import time, pathlib; from reamer.backends.local.session import run_lock\n"
            f"with run_lock(pathlib.Path({str(path)!r})):\n    print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_run_is_refused_naming_the_holder_and_a_dead_holder_frees_the_lock(tmp_path):
    lock = tmp_path / "reamer-local.lock"
    p = _holder(lock)
    try:
        with pytest.raises(RunLocked, match=f"pid {p.pid}"):
            with run_lock(lock):
                pass
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    with run_lock(lock):  # the kernel freed it with its holder
        assert lock.read_text().strip() == str(os.getpid())


def test_the_cli_refuses_a_second_run_in_one_line(tmp_path):
    from reamer.backends.local import session

    if session.unavailable() is not None:
        pytest.skip(f"no real local run here: {session.unavailable()}")
    p = _holder(session.LOCK_PATH)
    try:
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "reamer.cli.main", "local"], capture_output=True, text=True,
                           timeout=60)
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert r.returncode == 2 and len(errors) == 1 and f"pid {p.pid}" in errors[0]  # (after the run's banner)
        assert time.monotonic() - t < 30
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
