"""What a policy may ask a backend to do. Backends apply them in order and skip none silently."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from reamer.domain.cluster import Resources, Role


@dataclass(frozen=True, slots=True)
class Placement:
    role: Role
    node: str
    res: Resources


@dataclass(frozen=True, slots=True)
class StartJob:
    """Start a queued job with these containers (gang: all or nothing)."""

    job: str
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Resize:
    """Change one container's resources in place (vertical scaling)."""

    container: str
    res: Resources


@dataclass(frozen=True, slots=True)
class AddContainer:
    """Add a PS or worker to a running job (horizontal scaling)."""

    job: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class RemoveContainer:
    container: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop a running job and put it back in the queue; its progress is kept (checkpoint)."""

    job: str


Decision = StartJob | Resize | AddContainer | RemoveContainer | Preempt


class InvalidDecision(ValueError):
    """A policy asked for something impossible (a bug in the policy, never ignored)."""


def check_start(d: StartJob, free: Mapping[str, Resources], one_node: bool = False) -> None:
    """A gang start every backend accepts: the placements fit the nodes' free resources
    together, the job gets at least one PS and one worker, and (``one_node``: a job that is
    one pod) all of them are on one node."""
    need: dict[str, Resources] = {}
    for p in d.placements:
        need[p.node] = need.get(p.node, Resources()) + p.res
    for node, res in need.items():
        if node not in free or not res.fits_in(free[node]):
            raise InvalidDecision(f"start {d.job}: {res} does not fit on {node}")
    if one_node and len(need) > 1:
        raise InvalidDecision(f"start {d.job}: a one-node job placed on {len(need)} nodes ({', '.join(sorted(need))})")
    roles = {p.role for p in d.placements}
    if Role.PS not in roles or Role.WORKER not in roles:
        raise InvalidDecision(f"start {d.job}: needs at least one PS and one worker")
