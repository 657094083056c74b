"""Write docs/configuration.md from the configuration models.

Usage: ``.venv/bin/python tools/gen_config_reference.py [--check] [--out PATH]``

Sections: the simulated scenario (``reamer.config.scenario``), the local scenario
(``reamer.config.local``), the shared ``policy:`` section and every registered policy's options
model (``reamer.policies.REGISTRY``). Per field: name, type, default, constraint and
description. A description is the field's ``Field(description=...)``, else the comment on the
field's line (or the comment lines right above it) in the model's source, else the one in a
parent model, else the short text in :data:`FALLBACK` below (for policy fields the policy
module leaves uncommented). The checks of a model's validators are listed from their
``raise ValueError(...)`` messages. ``--check`` exits 1 when the file differs from what this
script writes now (tests/docs/test_config_reference.py does the same).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import textwrap
import tokenize
import types
import typing
from io import StringIO
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "configuration.md"

# Descriptions of policy options whose source line has no comment (the policy modules' and
# docs/nearchus.md's wording). Keyed "Model.field".
FALLBACK = {
    "StaticConfig.backfill": "a queued job may start ahead of the FIFO head when the head does not fit",
    "OptimusConfig.min_points": "distinct (PS, workers) configurations observed before the speed model is fitted",
    "OptimusConfig.explore": "small (PS, workers) configurations tried in order, one per interval, until "
                             "`min_points` exist",
    "OptimusConfig.placement": "`pack`: put a job's containers on as few nodes as possible; `spread`: fewest "
                               "containers per node first",
    "StaticConfig.placement": "`spread`: fewest containers per node first (kube-scheduler LeastAllocated); "
                              "`pack`: as few nodes as possible",
    "NearchusConfig.placement": "`spread`: new PS/workers go to the node with the fewest PS/worker containers "
                                "(NIC sharing); `pack`: as few nodes as possible",
    "NearchusConfig.stable_samples": "a job is stable when its last this many interval speeds ...",
    "NearchusConfig.stable_cv": "... have a coefficient of variation at most this",
    "NearchusConfig.max_wait_samples": "after this many intervals since a change, act even if not stable",
    "NearchusConfig.cpu_saturation": "CPU (or GPU) busy share at or above which a container is compute-bound",
    "NearchusConfig.net_saturation": "link utilization at or above which a job is network-bound",
    "NearchusConfig.upscale_factor": "vertical upscale multiplies the CPU limits by this",
    "NearchusConfig.trim": "trim worker limits down to their use (+ `trim_margin`) when they use little",
    "NearchusConfig.trim_margin": "trimmed limit = use × (1 + this)",
    "NearchusConfig.reclaim": "while jobs queue, take back increments NEARCHUS gave (least gain per core first) "
                              "so the queue head can start",
    "UsageReclaimConfig.evict_cooldown_s": "seconds between two evictions on one node",
}

# Fields a loader sets itself; a value in a file is replaced.
INTERNAL = {"source"}


# ------------------------------------------------------------------------------ source reading


def _comments(cls: type) -> tuple[dict[str, str], list[str]]:
    """Per field name, the comment on its line or right above it in ``cls``'s body; and the
    messages of the class's ``raise ValueError(...)`` checks."""
    src = textwrap.dedent(inspect.getsource(cls))
    lines = src.splitlines()
    by_line: dict[int, str] = {}
    for tok in tokenize.generate_tokens(StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
    tree = ast.parse(src).body[0]
    assert isinstance(tree, ast.ClassDef)
    out: dict[str, str] = {}
    checks: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            trailing = [by_line[n] for n in range(node.lineno, node.end_lineno + 1) if n in by_line]
            above: list[str] = []
            n = node.lineno - 1
            while n >= 1 and lines[n - 1].strip().startswith("#"):
                above.insert(0, by_line.get(n, ""))
                n -= 1
            text = " ".join(above + trailing).strip()
            if text:
                out[node.target.id] = text
        elif isinstance(node, ast.FunctionDef):
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Raise) and isinstance(sub.exc, ast.Call)
                        and getattr(sub.exc.func, "id", "") == "ValueError" and sub.exc.args):
                    checks.append(_message(sub.exc.args[0]))
    return out, checks


def _message(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = [str(v.value) if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}" for v in node.values]
        text = "".join(parts).split(" (got {")[0]
        return f"`{text}`" if "{" in text else text
    return ast.unparse(node)


def _description(model: type[BaseModel], name: str, info: FieldInfo) -> str:
    if info.description:
        return info.description
    if name == "kind" and get_origin(info.annotation) is Literal:
        return "selects this form"
    for cls in model.__mro__:
        if cls is BaseModel or not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            continue
        if name in inspect.get_annotations(cls):
            text = _comments(cls)[0].get(name)
            if text:
                return text
    for cls in model.__mro__:
        if f"{cls.__name__}.{name}" in FALLBACK:
            return FALLBACK[f"{cls.__name__}.{name}"]
    return ""


# ------------------------------------------------------------------------------ rendering


def _constraints(meta: list[Any]) -> list[str]:
    out = []
    for m in meta:
        for cls, attr, sym in ((at.Gt, "gt", ">"), (at.Ge, "ge", "≥"), (at.Lt, "lt", "<"), (at.Le, "le", "≤")):
            if isinstance(m, cls):
                out.append(f"{sym} {_num(getattr(m, attr))}")
        if isinstance(m, at.MinLen):
            out.append(f"at least {m.min_length} item" + ("s" if m.min_length != 1 else ""))
        if isinstance(m, at.MaxLen):
            out.append(f"at most {m.max_length} items")
    return out


def _num(v: Any) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _type(tp: Any, links: dict[type, str]) -> str:
    """A YAML-level name of ``tp``; constraints of nested items inline."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        base, *meta = args
        inner = _type(base, links)
        for m in meta:
            if isinstance(m, FieldInfo) and m.discriminator:
                return inner + f" (by `{m.discriminator}`)"
        cons = _constraints([x for m in meta for x in (m.metadata if isinstance(m, FieldInfo) else [m])])
        return f"{inner} {' '.join(cons)}".strip() if cons else inner
    if origin in (Union, types.UnionType):
        parts = [a for a in args if a is not type(None)]
        s = " \\| ".join(_type(a, links) for a in parts)
        return s + (" \\| null" if len(parts) < len(args) else "")
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (list, tuple, dict):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return "[" + ", ".join(_type(a, links) for a in args) + "]"
        if origin is dict:
            return f"mapping {_type(args[0], links)} → {_type(args[1], links)}"
        return f"list of {_type(args[0], links)}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"[{tp.__name__}](#{_anchor(links[tp])})" if tp in links else tp.__name__
    if tp is typing.Any:
        return "any"
    return {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}.get(tp, getattr(
        tp, "__name__", str(tp)))


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def _yaml(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float | int):
        return _num(v)
    if isinstance(v, str):
        return f'"{v}"' if v == "" else v
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_yaml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_yaml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, BaseModel):
        return "defaults of its section"
    return str(v)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return f"`{_yaml(info.default_factory())}`"
    if info.default is PydanticUndefined:
        return "**required**"
    d = _yaml(info.default)
    return d if d == "defaults of its section" else f"`{d}`"


def _row_constraint(info: FieldInfo) -> str:
    cons = _constraints(info.metadata)
    if not cons and get_origin(info.annotation) in (Union, types.UnionType):  # ``Pos | None``: the non-null member's
        for a in get_args(info.annotation):
            if get_origin(a) is Annotated:
                cons += _constraints([x for m in get_args(a)[1:]
                                      for x in (m.metadata if isinstance(m, FieldInfo) else [m])])
    return ", ".join(cons)


def _bare(tp: Any) -> Any:
    """``tp`` without the top-level constraint metadata (they go to the constraint column)."""
    if get_origin(tp) is Annotated and not any(isinstance(m, FieldInfo) and m.discriminator for m in get_args(tp)[1:]):
        return get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        parts = [_bare(a) for a in get_args(tp)]
        return Union[tuple(parts)]  # noqa: UP007
    return tp


def _table(model: type[BaseModel], links: dict[type, str]) -> list[str]:
    rows = ["| field | type | default | constraint | description |", "|---|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if name in INTERNAL:
            continue
        desc = _description(model, name, info).replace("``", "`").replace("|", "\\|")
        kind = _type(_bare(info.annotation), links) + (f" (by `{info.discriminator}`)" if info.discriminator else "")
        rows.append(f"| `{name}` | {kind} | {_default(info)} | "
                    f"{_row_constraint(info)} | {desc} |")
    return rows


def _section(title: str, model: type[BaseModel], links: dict[type, str], intro: str = "") -> list[str]:
    doc = inspect.cleandoc(model.__doc__ or "") if model.__doc__ not in (None, BaseModel.__doc__) else ""
    out = [f"### {title}", ""]
    if intro:
        out += [intro, ""]
    if doc:
        out += [" ".join(doc.split()).replace("``", "`"), ""]
    out += _table(model, links)
    checks = [c for cls in model.__mro__ if isinstance(cls, type) and issubclass(cls, BaseModel)
              and cls is not BaseModel and "__annotations__" in cls.__dict__ for c in _comments(cls)[1]]
    if checks:
        out += ["", "Checks: " + "; ".join(checks) + "."]
    return out + [""]


def render() -> str:
    from reamer.config import base, local, scenario
    from reamer.policies import REGISTRY

    sim = [
        ("`(top level)` — Scenario", scenario.Scenario, "A scenario file for `reamer simulate`."),
        ("`cluster` — Cluster", scenario.Cluster, ""),
        ("`cluster.node_pools[]` — NodePool", scenario.NodePool, ""),
        ("`cluster.overrides[]` — NodeOverride", scenario.NodeOverride, ""),
        ("`workload` (`kind: synthetic`) — Synthetic", scenario.Synthetic, ""),
        ("`workload` (`kind: openb`) — Openb", scenario.Openb, ""),
        ("`workload` (`kind: joblist`) — JobList", scenario.JobList, ""),
        ("`inference` — InferenceSection", scenario.InferenceSection, ""),
        ("`inference.services[]` — ServiceSpec", scenario.ServiceSpec, ""),
        ("`inference.services[].rate` (`kind: diurnal`) — DiurnalRate", scenario.DiurnalRate, ""),
        ("`inference.services[].rate` (`kind: genai`) — GenaiRate", scenario.GenaiRate, ""),
        ("`inference.pool` — DedicatedPool", scenario.DedicatedPool, ""),
        ("`policy` — PolicySection", base.PolicySection, ""),
    ]
    loc = [
        ("`(top level)` — LocalScenario", local.LocalScenario, "A local scenario file for `reamer local`."),
        ("`hosts[]` — HostSpec", local.HostSpec, ""),
        ("`jobs[]` — LocalJobSpec", local.LocalJobSpec, ""),
        ("`services[]` — LocalServiceSpec", local.LocalServiceSpec, ""),
        ("`policy` — LocalPolicySection", local.LocalPolicySection, ""),
    ]
    links = {m: t for t, m, _ in sim + loc}
    kinds = {"training": "training policy (`policy.training`, `--policy`)",
             "harvest": "harvesting policy (`policy.harvest`, `--harvest`)"}
    pol = [(f"`policy.options.{n}` — {e.config.__name__}", e.config, f"The {kinds[e.kind]} `{n}`.")
           for n, e in REGISTRY.items()]

    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by tools/gen_config_reference.py from the pydantic models; do not edit by hand.",
        "     tests/docs/test_config_reference.py fails when this file is not what the script writes. -->",
        "",
        "Every scenario file is YAML validated against the models below. Unknown keys are errors,",
        "and every error is one line naming the file, the field and what was expected (exit",
        "status 2; see [troubleshooting](troubleshooting.md)). Relative paths in a simulated scenario",
        "are resolved against the scenario file's folder. How the workloads are generated is in",
        "[scenarios](scenarios.md); a local run is described in [local](local.md).",
        "",
        "Types: *number* is a float, *path* a file path string, `A \\| B` either form, `null` YAML's",
        "null (*None* in a description). A constraint such as `> 0` applies to the value (or, written",
        "inside the type, to each item). A field `kind` picks the form of a section that has several.",
        "",
        "## Simulated scenario (`reamer simulate SCENARIO.yaml`)",
        "",
        "Models: `reamer.config.scenario`, `reamer.config.base`. The embedded default is",
        "`src/reamer/data/default.yaml`.",
        "",
    ]
    for t, m, i in sim:
        out += _section(t, m, links, i)
    out += ["## Local scenario (`reamer local LOCAL.yaml`)", "",
            "Model: `reamer.config.local`. The embedded default is `src/reamer/data/local.yaml`.", ""]
    for t, m, i in loc:
        out += _section(t, m, links, i)
    out += ["## Policy options (`policy.options.NAME`)", "",
            "`policy.options` maps a policy's name to its settings; each is validated against that",
            "policy's model (registered in `reamer.policies.REGISTRY`), and a bad one is reported as",
            "`policy.options.NAME.FIELD`. A policy's options are validated when that policy is built",
            "for a run, so a bad option of a policy that does not run goes unreported. Example:",
            "",
            "```yaml",
            "policy:",
            "  training: nearchus",
            "  harvest: reamer",
            "  options:",
            "    nearchus: {max_growth: 3.0, outscale: false}",
            "    reamer: {headroom: 0.2}",
            "```",
            ""]
    for t, m, i in pol:
        out += _section(t, m, links, i)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the file is not what would be written")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    text = render()
    if a.check:
        ok = a.out.is_file() and a.out.read_text() == text
        if not ok:
            print(f"{a.out} is out of date: run .venv/bin/python tools/gen_config_reference.py", file=sys.stderr)
        return 0 if ok else 1
    a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
