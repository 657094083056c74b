"""What a policy may ask a backend to do. Backends apply them in order and skip none silently."""

from __future__ import annotations

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
