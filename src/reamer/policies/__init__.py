"""Pure policies: a snapshot in, decisions out. None imports a backend (checked by import-linter).

One registry for every policy, training (``static``, ``optimus``, ``nearchus``: decide on a
:class:`~reamer.domain.ClusterSnapshot`) and harvesting (``dedicated``, ``naive``,
``usage-reclaim``, ``reamer``: decide on a :class:`~reamer.domain.inference.HarvestSnapshot`).
A new policy is one entry here: its kind, its config model (validated from a scenario's
``policy.options.NAME``) and how to build it. ``make_policy(name, options, ...)`` builds a
fresh one for one run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from reamer.errors import InputError
from reamer.models.inference import InferenceProfile
from reamer.policies.harvest import Reamer, ReamerConfig
from reamer.policies.harvest_baselines import (
    Dedicated,
    DedicatedConfig,
    Naive,
    NaiveConfig,
    UsageReclaim,
    UsageReclaimConfig,
)
from reamer.policies.nearchus import Nearchus, NearchusConfig
from reamer.policies.options import parse_options
from reamer.policies.optimus import Optimus, OptimusConfig
from reamer.policies.static import Static, StaticConfig

Kind = Literal["training", "harvest"]
Profiles = Mapping[str, InferenceProfile] | None


@dataclass(frozen=True, slots=True)
class Entry:
    kind: Kind
    config: type[BaseModel]
    build: Callable[[Any, float, Profiles], Any]  # (config, interval_s, inference profiles) -> policy


REGISTRY: dict[str, Entry] = {
    "static": Entry("training", StaticConfig, lambda cfg, interval_s, prof: Static(cfg)),
    "optimus": Entry("training", OptimusConfig, lambda cfg, interval_s, prof: Optimus(cfg, interval_s)),
    "nearchus": Entry("training", NearchusConfig, lambda cfg, interval_s, prof: Nearchus(cfg, interval_s)),
    "dedicated": Entry("harvest", DedicatedConfig, lambda cfg, interval_s, prof: Dedicated(cfg, interval_s, prof)),
    "naive": Entry("harvest", NaiveConfig, lambda cfg, interval_s, prof: Naive(cfg, interval_s, prof)),
    "usage-reclaim": Entry("harvest", UsageReclaimConfig,
                           lambda cfg, interval_s, prof: UsageReclaim(cfg, interval_s, prof)),
    "reamer": Entry("harvest", ReamerConfig, lambda cfg, interval_s, prof: Reamer(cfg, interval_s, prof)),
}


def policy_names(kind: Kind = "training") -> list[str]:
    """The registered policies of one kind, in registry order."""
    return [n for n, e in REGISTRY.items() if e.kind == kind]


def make_policy(name: str, options: dict[str, Any] | None = None, *, kind: Kind = "training",
                interval_s: float = 60.0, profiles: Profiles = None, source: str = "--policy",
                field: str = "policy"):
    """A fresh ``kind`` policy ``name`` with ``options`` validated against its config model.
    An unknown name or a bad option is an :class:`InputError` naming ``source`` and ``field``."""
    entry = REGISTRY.get(name)
    if entry is None or entry.kind != kind:
        raise InputError(source, field, f"one of {', '.join(policy_names(kind))} ({kind} policies)", name)
    return entry.build(parse_options(entry.config, options, name, source), interval_s, profiles)
