"""What every configuration model shares: strict frozen models, the number types, one way to
turn a validation error into a one-line :class:`~reamer.errors.InputError`, the YAML reader,
and the ``policy:`` section (which policies run, and their settings) of a simulated and a
local scenario alike."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reamer.errors import InputError, read_user_text

Pos = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """Unknown keys are errors; a loaded model is immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PolicySection(Strict):
    """``policy:`` — the training policy, the harvesting policy of the inference services, and
    per-policy settings by name (each validated by that policy's config model)."""

    training: str = "static"  # the training policy (a name of reamer.policies.REGISTRY; overridden by --policy)
    harvest: str | None = "reamer"  # None: no harvesting (a local run only: a simulated inference: section needs one)
    interval_s: Pos = 60.0  # control interval of the policies that use telemetry
    telemetry_noise_pct: NonNeg = 3.0  # simulator only: std-dev of multiplicative measurement noise
    options: dict[str, dict[str, Any]] = {}  # per policy name, its settings (see the policy options below)


def validate(model: type[M], data: Any, source: str) -> M:
    """``data`` as ``model``, or an InputError naming ``source``, the field and what was expected."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        got = err.get("input") if err["type"] != "missing" else None
        if isinstance(got, dict | list):
            got = None
        msg = err["msg"].removeprefix("Value error, ")  # a model validator's own wording
        raise InputError(source, f"field {where}", msg[:1].lower() + msg[1:], got) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (the second would
    silently win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge key (<<: *anchor) or a complex key: YAML's own rules
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(p: Path, expected: str) -> Any:
    """The parsed YAML file ``p``; a missing file, bad YAML or a key given twice is a one-line
    InputError."""
    text = read_user_text(p, expected)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        raise InputError(str(p), where, f"valid YAML ({getattr(e, 'problem', e)})") from None
