"""Processes of the local backend: started inside a cgroup (and a testbed host's network
namespace) before they run a single instruction of their own, with their JSON telemetry
lines collected by a reader thread.

A workload writes its telemetry to a file (``<log>.jsonl`` beside its stderr log), not to a
pipe: when the controller dies, the reader of a pipe is gone and the next line the workload
writes kills it (EPIPE); a file outlives the reader, so the workload trains on and the next
controller finds its lines.

The child is ``sh -c 'read _ && exec "$@"'``: it blocks on stdin until the executor has
put its pid in the cgroup, then execs the workload — so the workload's threads are sized
from the container's quota from its first line (no race with the cgroup write).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from reamer.backends.local.cgroups import CgroupExecutor

GATE = 'read _ && exec "$@"'


def workload_env() -> dict[str, str]:
    """The environment of a workload process: this package importable (from a checkout too),
    unbuffered output, no inherited thread-count settings (each workload sizes its pools
    from its own container)."""
    src = str(Path(__file__).resolve().parents[3])  # the package's parent folder
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    return env


@dataclass(frozen=True, slots=True)
class Line:
    t: float  # clock() when the line arrived
    obj: dict[str, Any]


TAIL_POLL_S = 0.02  # how often the reader looks for new lines: ≤ 1 % of a 2 s telemetry window


def telemetry_path(log: Path) -> Path:
    """Where the workload logging to ``log`` writes its telemetry lines."""
    return log.with_suffix(".jsonl")


def read_telemetry(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a telemetry file (a crashed run's, say); [] when none."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for raw in path.read_text(errors="replace").splitlines():
            obj = _parse(raw)
            if obj is not None:
                out.append(obj)
    return out


def _parse(raw: str) -> dict[str, Any] | None:
    raw = raw.strip()
    if not raw.startswith("{"):
        return None
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class Proc:
    """One workload process in cgroup ``cgroup``. ``clock`` stamps each telemetry line."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cgroup: str,
        executor: CgroupExecutor,
        log: Path,
        env: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cgroup = cgroup
        self.argv = list(argv)
        self._clock = clock
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.lines: list[Line] = []
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[str] = log.open("a")
        self.telemetry = telemetry_path(log)
        out = self.telemetry.open("ab")
        self._tail: IO[bytes] = self.telemetry.open("rb")
        self._tail.seek(0, os.SEEK_END)  # an earlier incarnation's lines are not this one's
        try:
            self.p = subprocess.Popen(
                ["sh", "-c", GATE, "sh", *self.argv],
                stdin=subprocess.PIPE, stdout=out, stderr=self._log, text=True,
                env=env, start_new_session=True,  # Ctrl-C on the controller does not reach it directly
            )  # fmt: skip
        except BaseException:  # not started: its files are not left open
            self._log.close()
            self._tail.close()
            raise
        finally:
            out.close()
        try:
            executor.add_process(cgroup, self.p.pid)
            # its CPUs are its cgroup's cpuset, not the controller's affinity (--apparatus-cpus): a
            # child inherits that, and cgroup v2 keeps an inherited mask across the move (kernel 6.2+)
            os.sched_setaffinity(self.p.pid, range(os.cpu_count() or 1))
            assert self.p.stdin is not None
            self.p.stdin.write("\n")
            self.p.stdin.close()
        except BaseException:
            self.kill()
            raise
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"reamer-read-{cgroup}")
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.p.pid

    def _read(self) -> None:
        """Tail the telemetry file until the process has exited and every line is read."""
        partial = b""
        while True:
            exited = self.p.poll() is not None  # checked before reading: nothing written after is missed
            chunk = self._tail.readline()
            while chunk:
                partial += chunk
                if partial.endswith(b"\n"):
                    obj = _parse(partial.decode(errors="replace"))
                    partial = b""
                    if obj is not None:
                        with self._cond:
                            self.lines.append(Line(self._clock(), obj))
                            self._cond.notify_all()
                chunk = self._tail.readline()
            if exited:
                break
            time.sleep(TAIL_POLL_S)
        with self._cond:
            self._cond.notify_all()

    def last_seen(self) -> float | None:
        """clock() when its last telemetry line arrived; None before the first."""
        with self._lock:
            return self.lines[-1].t if self.lines else None

    def since(self, index: int) -> list[Line]:
        with self._lock:
            return self.lines[index:]

    def wait_for(self, event: str, timeout_s: float, *, peers: Sequence[Proc] = ()) -> dict[str, Any]:
        """The first line with ``"event": event``; a one-line RuntimeError when the process
        exits first, when one of ``peers`` (processes it depends on) exits, or ``timeout_s``
        passes."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for ln in self.lines:
                    if ln.obj.get("event") == event:
                        return ln.obj
                if self.p.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError(f"{self.cgroup}: exited (code {self.p.returncode}) before {event!r}; "
                                       f"see {self._log.name}")
                for peer in peers:
                    if not peer.alive():
                        raise RuntimeError(f"{self.cgroup}: {peer.cgroup} exited (code {peer.p.returncode}) before "
                                           f"{self.cgroup}'s {event!r}; see {peer._log.name}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.cgroup}: no {event!r} line within {timeout_s:g}s; see {self._log.name}")
                self._cond.wait(min(left, 0.2))

    def alive(self) -> bool:
        return self.p.poll() is None

    def signal(self, sig: int) -> None:
        """``sig`` to the process unless it was reaped (its pid may belong to another by now)."""
        with contextlib.suppress(ProcessLookupError):
            self.p.send_signal(sig)  # (polls first: no signal once reaped)

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(5)
        self.close()

    def close(self) -> None:
        """After the process ended: let the reader drain its pipe, then close files."""
        reader = getattr(self, "_reader", None)  # absent when the constructor failed
        if reader is not None:
            reader.join(timeout=2.0)
        for f in (self._tail, self._log):
            with contextlib.suppress(Exception):
                f.close()
