"""The durable state of a real run: what runs where, written atomically to ``run.json`` in the
run's state folder (beside its checkpoints and logs) at the end of every observe and actuate.

A controller that dies (``kill -9``, a crash, a reboot) loses nothing with it: the next
``reamer local`` on the same folder reads this file, has the crashed run's workloads leave
cleanly (their PS write a last checkpoint), and resumes every job from its checkpoint on the
shape it had (:meth:`reamer.backends.local.cluster.LocalCluster.resume`). The file is only a
record: the shared :class:`~reamer.backends.state.ClusterState` is rebuilt from it with
``ClusterState.restore``, as the Kubernetes controller rebuilds it from TrainingJob status.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from reamer.errors import InputError

STATE_FILE = "run.json"
Status = Literal["running", "interrupted", "failed", "finished"]
JobStatus = Literal["pending", "queued", "running", "done", "failed"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContainerRecord(_Model):
    id: str
    role: Literal["ps", "worker"]
    node: str
    cpu: float
    mem_mib: float
    cpuset: list[int] | None = None


class ProcRecord(_Model):
    """A process of the job's current incarnation: its pid and the file it reports to."""

    pid: int
    cgroup: str
    role: Literal["ps", "worker"]
    telemetry: str


class JobRecordFile(_Model):
    id: str
    status: JobStatus
    containers: list[ContainerRecord] = []
    next_id: int = 0
    queued_since: float = 0.0
    queue_s: float = 0.0
    started_s: float | None = None
    finished_s: float | None = None
    last_change_s: float | None = None
    reconfigs: int = 0
    samples_base: float = 0.0  # samples banked before the current incarnation
    start_step: int = 0  # the global step the current incarnation resumed at
    restarts: int = 0  # restarts after a process of the job died (bounded by max_restarts)
    failed: str | None = None  # why it was given up
    procs: dict[str, ProcRecord] = {}  # container id → process


class RunState(_Model):
    scenario: str
    digest: str  # of the scenario: a folder resumes only the run it belongs to
    controller_pid: int
    started_wall: float  # time.time() at the run's first start: its timeline goes on across restarts
    status: Status = "running"
    jobs: list[JobRecordFile] = []


def scenario_digest(scenario_json: str) -> str:
    return hashlib.sha256(scenario_json.encode()).hexdigest()[:16]


def write_state(folder: Path, st: RunState) -> None:
    """Replace ``folder/run.json`` atomically (temp file, fsync, rename): a crash leaves the old
    record or the new one, never half of one."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{STATE_FILE}.{os.getpid()}.tmp"
    with tmp.open("w") as f:
        f.write(st.model_dump_json(indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / STATE_FILE)


def read_state(folder: Path) -> RunState | None:
    """The record in ``folder``; None when there is none; a one-line InputError naming the file
    and field when it is not one."""
    f = folder / STATE_FILE
    try:
        text = f.read_text()
    except FileNotFoundError:
        return None
    try:
        return RunState.model_validate(json.loads(text))
    except json.JSONDecodeError as e:
        raise InputError(str(f), f"line {e.lineno}", "a JSON run record (or pass --fresh to discard it)") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise InputError(str(f), f"field {where}", err["msg"].lower() + " (or pass --fresh to discard it)") from None


def set_status(folder: Path, status: Status) -> None:
    """Record how the run ended (nothing when it never wrote a record)."""
    st = read_state(folder)
    if st is not None:
        write_state(folder, st.model_copy(update={"status": status}))
