"""Pure policies: a snapshot in, decisions out. None imports a backend (checked by import-linter).

``make_policy(name, options, rng)`` builds a fresh policy for one run; ``POLICIES`` lists names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel

from reamer.errors import InputError
from reamer.policies.nearchus import Nearchus, NearchusConfig
from reamer.policies.options import parse_options
from reamer.policies.optimus import Optimus, OptimusConfig
from reamer.policies.static import Static, StaticConfig

# name -> (config model, factory(config, rng, interval_s))
_REGISTRY: dict[str, tuple[type[BaseModel], Callable[..., Any]]] = {
    "static": (StaticConfig, lambda cfg, rng, interval_s: Static(cfg)),
    "optimus": (OptimusConfig, lambda cfg, rng, interval_s: Optimus(cfg, interval_s)),
    "nearchus": (NearchusConfig, lambda cfg, rng, interval_s: Nearchus(cfg, interval_s)),
}


def register(name: str, config: type[BaseModel], factory: Callable[..., Any]) -> None:
    _REGISTRY[name] = (config, factory)


def policy_names() -> list[str]:
    return list(_REGISTRY)


def make_policy(name: str, options: dict[str, Any] | None = None, rng: np.random.Generator | None = None,
                interval_s: float = 60.0, source: str = "--policy"):
    if name not in _REGISTRY:
        raise InputError(source, "policy", f"one of {', '.join(_REGISTRY)}", name)
    config_model, factory = _REGISTRY[name]
    return factory(parse_options(config_model, options, name, source), rng or np.random.default_rng(0), interval_s)
