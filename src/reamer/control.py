"""The control round — the architecture in one function: observe → decide → actuate.

Every backend (the simulator, the local backend) implements :class:`Backend` (and, for
inference, :class:`HarvestBackend`); every policy implements :class:`Policy` (or
:class:`HarvestPolicy`). Neither knows which of the others it talks to. The runtime
(:mod:`reamer.runtime`) decides when a round runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from reamer.domain import ClusterSnapshot, Decision
from reamer.domain.inference import HarvestDecision, HarvestSnapshot


class Policy(Protocol):
    """A pure policy: plain snapshot in, decisions out. May keep its own history."""

    name: str
    interval_s: float | None  # periodic rounds with telemetry; None = only on events

    def decide(self, snapshot: ClusterSnapshot) -> Sequence[Decision]: ...


class HarvestPolicy(Protocol):
    """A pure inference-harvesting policy (Cloud Reamer and its baselines)."""

    name: str
    interval_s: float | None

    def decide(self, snapshot: HarvestSnapshot) -> Sequence[HarvestDecision]: ...


class Backend(Protocol):
    def observe(self, now: float) -> ClusterSnapshot: ...

    def actuate(self, decisions: Sequence[Decision], now: float) -> None: ...


class HarvestBackend(Protocol):
    def observe(self, now: float) -> HarvestSnapshot: ...

    def actuate(self, decisions: Sequence[HarvestDecision], now: float) -> None: ...


class JointHarvestBackend(HarvestBackend, Protocol):
    def expect(self, decisions: Sequence[Decision]) -> None:
        """Training is about to apply ``decisions``: count the CPU they take as taken."""
        ...


@dataclass(frozen=True, slots=True)
class Round:
    now: float
    decisions: tuple[Decision, ...] | tuple[HarvestDecision, ...]
    snapshot: ClusterSnapshot | HarvestSnapshot | None = None  # what the policy saw


def control_round(backend: Backend, policy: Policy, now: float) -> Round:
    snapshot = backend.observe(now)  # observe
    decisions = tuple(policy.decide(snapshot))  # decide
    backend.actuate(decisions, now)  # actuate
    return Round(now, decisions, snapshot)


def harvest_round(backend: HarvestBackend, policy: HarvestPolicy, now: float) -> Round:
    """The same round for inference harvesting: node usage and services in, replica decisions out."""
    snapshot = backend.observe(now)  # observe
    decisions = tuple(policy.decide(snapshot))  # decide
    backend.actuate(decisions, now)  # actuate
    return Round(now, decisions, snapshot)


def joint_round(backend: Backend, policy: Policy, harvest: JointHarvestBackend, harvest_policy: HarvestPolicy,
                now: float, *, harvest_if: Callable[[Sequence[Decision]], bool] | None = None,
                ) -> tuple[Round, Round | None]:
    """The joint loop: training decides first; inference is harvested against the allocation
    training is *about to* take, and moves (shrink / migrate / evict) before training
    actuates — inference yields first when training needs its CPU back.

    ``harvest_if`` (None: always): whether training's decisions need a harvest round now. An
    event-driven backend's rounds between inference's measurement windows (a job's arrival or
    end) harvest only when training is about to take cores a replica holds (no harvest
    round: None)."""
    snapshot = backend.observe(now)  # observe
    decisions = tuple(policy.decide(snapshot))  # decide (training)
    if harvest_if is not None and not harvest_if(decisions):
        backend.actuate(decisions, now)
        return Round(now, decisions, snapshot), None
    harvest.expect(decisions)
    hsnap = harvest.observe(now)
    hdecisions = tuple(harvest_policy.decide(hsnap))  # decide (inference, on what is left)
    harvest.actuate(hdecisions, now)  # actuate: inference moves first ...
    backend.actuate(decisions, now)  # ... then training takes its cores
    return Round(now, decisions, snapshot), Round(now, hdecisions, hsnap)
