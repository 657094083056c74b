"""Training-only simulations give exactly the results recorded in the expected file: every
metric of ``reamer simulate --json`` (but ``wall_s``) and a digest of every job's record and
the time series, for the default scenario under every training policy and openb's first 60
pods, seeds 1-3. A change meant to keep results (a faster data structure) must leave them
bit for bit; one that changes them on purpose rewrites the file with
``tools/sim_golden.py --cases quick --out tests/runtime/data/sim_training_golden.json`` and
says why. ``--cases full`` compares the whole openb trace the same way (minutes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "sim_golden.py"
GOLDEN = Path(__file__).parent / "data" / "sim_training_golden.json"


@pytest.fixture(scope="module")
def golden_tool():
    spec = importlib.util.spec_from_file_location("sim_golden", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sim_golden"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_training_only_runs_are_unchanged(golden_tool, shared_data):
    expected = json.loads(GOLDEN.read_text())["runs"]
    runs = golden_tool.run("quick", log=lambda *a, **k: None)
    assert len(runs) == len(expected) == 12
    assert golden_tool.differences(expected, runs) == []


def test_the_diff_sees_a_changed_job(golden_tool):
    expected = json.loads(GOLDEN.read_text())["runs"]
    changed = json.loads(json.dumps(expected))
    changed[0]["metrics"]["mean_jct_s"] += 1e-9
    changed[1]["digest"] = "0" * 16
    diff = golden_tool.differences(expected, changed)
    assert len(diff) == 2 and "metrics differ" in diff[0] and "digest differ" in diff[1]
