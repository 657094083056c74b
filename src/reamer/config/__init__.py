"""The one validated scenario model and its loader."""

from reamer.config.scenario import Scenario, load_scenario

__all__ = ["Scenario", "load_scenario"]
