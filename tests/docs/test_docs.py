"""The operator docs stay true to the code: no reference to files outside the repository,
links and section anchors that resolve, a metrics glossary that names every metric key the
code writes, and the full Apache-2.0 LICENSE."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = ("design.md", "configuration.md", "metrics.md", "troubleshooting.md")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    keep = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def _files(*globs: str) -> list[Path]:
    return [p for g in globs for p in REPO.glob(g) if "__pycache__" not in p.parts and p != Path(__file__)]


def test_no_reference_to_a_design_file_outside_the_repository():
    for p in _files("docs/*.md", "README.md", "src/reamer/**/*.py", "bench/*.py", "tests/**/*.py"):
        assert "DESIGN.md" not in p.read_text(), f"{p.relative_to(REPO)} cites DESIGN.md (use docs/design.md)"


def test_no_path_outside_the_repository_in_docs_readme_and_sources():
    for p in _files("docs/*.md", "README.md", "src/reamer/**/*.py"):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            assert "../shared" not in line and "/work/" not in line, f"{p.relative_to(REPO)}:{n}: {line.strip()}"


@pytest.mark.parametrize("page", PAGES)
def test_links_of_the_operator_pages_resolve(page):
    src = DOCS / page
    for target in LINK.findall(src.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, frag = target.partition("#")
        dest = (src.parent / path).resolve() if path else src
        assert dest.is_file(), f"{page}: link to a missing file {target}"
        if frag and dest.suffix == ".md":
            assert frag in _anchors(dest), f"{page}: no section #{frag} in {dest.name}"


def test_every_link_into_design_md_names_a_section():
    anchors = _anchors(DOCS / "design.md")
    for p in _files("docs/*.md", "README.md", "src/reamer/**/*.py", "tests/**/*.py", "bench/*.py"):
        for frag in re.findall(r"design\.md#([\w-]+)", p.read_text()):
            assert frag in anchors, f"{p.relative_to(REPO)}: no section #{frag} in docs/design.md"
    for frag in re.findall(r"#([\w-]+)", (REPO / "src/reamer/policies/harvest.py").read_text().split('"""')[1]):
        assert frag in anchors


def _dict_keys(path: str, func: str) -> set[str]:
    """String keys of the dict literals (and ``m["KEY"] =`` stores) inside ``func`` of ``path``."""
    tree = ast.parse((REPO / path).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func)
    keys: set[str] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Dict):
            keys |= {k.value for k in n.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) and isinstance(n.slice, ast.Constant):
            keys.add(n.slice.value)
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) and isinstance(n.slice, ast.JoinedStr):
            head = n.slice.values[0]
            if isinstance(head, ast.Constant):
                keys.add(head.value.rstrip(":"))
    return keys


def _metric_names(path: str) -> set[str]:
    """First arguments of the prometheus_client constructors in ``path``."""
    tree = ast.parse((REPO / path).read_text())
    names = set()
    for n in ast.walk(tree):
        if (isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("Counter", "Gauge", "Histogram", "Summary")
                and n.args and isinstance(n.args[0], ast.Constant)):
            names.add(n.args[0].value)
    for n in ast.walk(tree):  # the fixed-value gauges of the inference server, (name, help, value) tuples
        if isinstance(n, ast.Tuple) and len(n.elts) == 3 and isinstance(n.elts[0], ast.Constant) \
                and str(n.elts[0].value).startswith("reamer_"):
            names.add(n.elts[0].value)
    return names


KEYS = {
    "src/reamer/runtime/sim.py": "_metrics",
    "src/reamer/backends/sim/inference.py": "metrics",
    "src/reamer/reports/local.py": "summarize",
    "bench/k8s_sched.py": "main",
    "bench/overload.py": "load_run",
    "bench/sim_vs_real.py": "server_side",
}


@pytest.mark.parametrize("path", sorted(KEYS))
def test_metrics_glossary_names_every_json_key(path):
    text = (DOCS / "metrics.md").read_text()
    keys = _dict_keys(path, KEYS[path])
    assert keys
    missing = sorted(k for k in keys if f"`{k}" not in text)
    assert not missing, f"docs/metrics.md lacks keys of {path}: {missing}"


@pytest.mark.parametrize("path", ["src/reamer/runtime/k8s.py", "src/reamer/workloads/real/serving_metrics.py",
                                  "src/reamer/workloads/real/ps_training.py"])
def test_metrics_glossary_names_every_prometheus_metric(path):
    text = (DOCS / "metrics.md").read_text()
    names = _metric_names(path)
    assert names
    # prometheus_client adds _total to a counter's name
    missing = sorted(n for n in names if f"`{n}`" not in text and f"`{n}_total`" not in text and f"{n}`" not in text)
    assert not missing, f"docs/metrics.md lacks Prometheus metrics of {path}: {missing}"


def test_license_is_the_full_apache_2_text():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    for part in ("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "9. Accepting Warranty or Additional",
                 "END OF TERMS AND CONDITIONS", "APPENDIX: How to apply the Apache License to your work."):
        assert part in text
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"  # SPDX
