"""The policies of a scenario's ``policy:`` section, built once for a run (simulated or real)."""

from __future__ import annotations

from collections.abc import Mapping

from reamer.config.base import PolicySection
from reamer.control import HarvestPolicy, Policy
from reamer.errors import InputError
from reamer.models.inference import InferenceProfile
from reamer.policies import make_policy


def training_policy(section: PolicySection, source: str, name: str | None = None) -> Policy:
    """``name`` (default: ``section.training``) with its options from the section."""
    name = name or section.training
    return make_policy(name, section.options.get(name), interval_s=section.interval_s, source=source,
                       field="field policy.training")


def harvest_policy(section: PolicySection, source: str, profiles: Mapping[str, InferenceProfile],
                   interval_s: float, name: str | None = None) -> HarvestPolicy:
    """``name`` (default: ``section.harvest``) with its options from the section, deciding every
    ``interval_s``."""
    name = name or section.harvest
    if name is None:
        raise InputError(source, "field policy.harvest", "a harvesting policy for the inference services", None)
    return make_policy(name, section.options.get(name), kind="harvest", interval_s=interval_s, profiles=profiles,
                       source=source, field="field policy.harvest")
