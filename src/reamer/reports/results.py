"""The one result shape every benchmark and ``reamer simulate --json`` writes (docs/results-format.md):

``{"bench": NAME, "runs": [{"scenario", "seed", "policy", "params", "metrics"}], "ratios": {}}``
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def run_entry(scenario: str, seed: int, policy: str, metrics: dict[str, float],
              params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "seed": int(seed),
        "policy": policy,
        "params": dict(params or {}),
        "metrics": {k: _num(v) for k, v in metrics.items()},
    }


def _num(v: float) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def document(bench: str, runs: list[dict[str, Any]], ratios: dict[str, float] | None = None) -> dict[str, Any]:
    return {"bench": bench, "runs": runs, "ratios": {k: _num(v) for k, v in (ratios or {}).items()}}


def _mode_of_new_file() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0o666 less the process's umask (a temp
    file is made 0o600, which a web server publishing a report could not read)."""
    try:
        status = Path("/proc/self/status").read_text()  # (os.umask can only be read by setting it)
    except OSError:
        return 0o644
    umask = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("Umask:")), "022")
    return 0o666 & ~int(umask, 8)


def write_atomic(path: str | Path, text: str) -> None:
    """Write all or nothing: a temp file in the same folder, then rename. The file gets the
    mode it had, or that of a new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o7777 if path.is_file() else _mode_of_new_file()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, doc: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(doc, indent=2, sort_keys=False) + "\n")
