"""docs/configuration.md is what tools/gen_config_reference.py writes from the models now, and
it covers every field of every configuration model and registered policy."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", REPO / "tools" / "gen_config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_configuration_md_is_what_the_script_generates():
    text = _generator().render()
    assert DOC.read_text() == text, (
        "docs/configuration.md is out of date: run .venv/bin/python tools/gen_config_reference.py")


def test_check_mode_reports_a_stale_file(tmp_path):
    gen = _generator()
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n")
    assert gen.main(["--check", "--out", str(stale)]) == 1
    assert gen.main(["--out", str(stale)]) == 0
    assert gen.main(["--check", "--out", str(stale)]) == 0


def _models() -> list[type[BaseModel]]:
    from reamer.config import base, local, scenario
    from reamer.policies import REGISTRY

    mods = [m for mod in (base, scenario, local) for m in vars(mod).values()
            if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == mod.__name__
            and m.__name__ != "Strict"]
    return mods + [e.config for e in REGISTRY.values()]


def test_every_model_and_field_is_documented_with_a_description():
    text = DOC.read_text()
    gen = _generator()
    for model in _models():
        heading = re.search(rf"^### .* — {model.__name__}$", text, re.MULTILINE)
        assert heading, f"{model.__name__} has no section"
        section = text[heading.end():].split("\n### ", 1)[0]
        for name in model.model_fields:
            if name in gen.INTERNAL:
                continue
            row = re.search(rf"^\| `{re.escape(name)}` \|.*\| ([^|]*) \|$", section, re.MULTILINE)
            assert row, f"{model.__name__}.{name} is not in its table"
            assert row.group(1).strip(), f"{model.__name__}.{name} has no description"


def test_every_registered_policy_has_an_options_section():
    from reamer.policies import REGISTRY

    text = DOC.read_text()
    for name in REGISTRY:
        assert f"### `policy.options.{name}` —" in text
