"""Policies, models and the domain never import a backend (docs/design.md#architecture)."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import reamer

PKG = Path(reamer.__file__).parent
PURE = ("policies", "models", "domain")
FORBIDDEN = ("reamer.backends", "reamer.cli", "reamer.reports", "reamer.workloads")


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_pure_packages_import_no_backend():
    bad = []
    for sub in PURE:
        for f in (PKG / sub).rglob("*.py"):
            bad += [f"{f.relative_to(PKG)} imports {m}" for m in imports_of(f) if m.startswith(FORBIDDEN)]
    assert not bad, bad


def test_checker_catches_a_backend_import(tmp_path):
    f = tmp_path / "p.py"
    f.write_text("from reamer.backends.sim.cluster import SimCluster\n")
    assert any(m.startswith(FORBIDDEN) for m in imports_of(f))


def test_import_linter_contract():
    exe = shutil.which("lint-imports") or str(Path(__import__("sys").executable).parent / "lint-imports")
    res = subprocess.run([exe], cwd=PKG.parents[1], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
