"""Validate a policy's options (from a scenario's ``policy.options``) into its config model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from reamer.errors import InputError


def parse_options(config_model: type[BaseModel], options: dict[str, Any] | None, name: str, source: str) -> BaseModel:
    """The validated config, or an :class:`InputError` naming ``policy.options.NAME.FIELD``."""
    try:
        return config_model.model_validate(options or {})
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise InputError(source, f"policy.options.{name}.{where}", err["msg"].lower()) from None
