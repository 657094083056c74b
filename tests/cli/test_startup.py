"""`reamer --help` stays fast: importing the CLI (and printing its help) loads none of the heavy
modules — the simulator's numpy/scipy, plotly, the ML runtimes, the Kubernetes client, pydantic
and the config models, the policy registry. A module-set check (what `-X importtime` reports
in a fresh interpreter), not a timing assertion; the measured time is in docs/cli.md."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = (
    "scipy", "numpy", "plotly", "torch", "onnxruntime", "onnx", "kubernetes", "pydantic", "pydantic_core",
    "yaml", "prometheus_client", "uvicorn", "starlette",
    "reamer.config", "reamer.models", "reamer.policies", "reamer.runtime", "reamer.reports",
    "reamer.backends", "reamer.calibration", "reamer.workloads", "reamer.domain", "reamer.cli.local",
)


def imported(*args: str) -> set[str]:
    """The modules a fresh ``python -X importtime ARGS`` imported."""
    r = subprocess.run([sys.executable, "-X", "importtime", *args], check=False, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return {ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines()
            if ln.startswith("import time:") and "imported package" not in ln}


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)}


def test_importing_the_cli_loads_no_heavy_module():
    mods = imported("-c", "import reamer.cli.main")
    assert {"reamer.cli.main", "reamer.cli.k8s", "typer"} <= mods  # (the check sees the imports at all)
    assert heavy(mods) == set()


@pytest.mark.parametrize("args", [["--help"], ["--version"]])
def test_help_and_version_load_no_heavy_module(args):
    assert heavy(imported("-m", "reamer.cli.main", *args)) == set()


def test_a_group_help_loads_only_what_typer_needs():
    """Below the top level, typer 0.29 parses the top-level options (--log-level) with pydantic:
    that is typer's cost; ours (the config models, the registry, numpy ...) stays out."""
    assert {m for m in heavy(imported("-m", "reamer.cli.main", "k8s", "--help"))
            if not m.startswith(("pydantic", "pydantic_core"))} == set()


def test_a_command_still_gets_what_it_needs():
    """The other side: the imports moved into the commands are there when one runs."""
    mods = imported("-m", "reamer.cli.main", "simulate", "--help")
    assert "reamer.policies" in mods  # its --policy choices come from the registry
