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


def write_atomic(path: str | Path, text: str) -> None:
    """Write all or nothing: a temp file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, doc: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(doc, indent=2, sort_keys=False) + "\n")
