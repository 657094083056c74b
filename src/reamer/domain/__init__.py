"""Plain, typed, immutable snapshots and decisions: the language policies and backends share."""

from reamer.domain.cluster import Container, Node, Resources, Role
from reamer.domain.decisions import (
    AddContainer,
    Decision,
    Preempt,
    RemoveContainer,
    Resize,
    StartJob,
)
from reamer.domain.jobs import InferenceService, JobState, JobView, TrainingJob
from reamer.domain.snapshot import ClusterSnapshot, ContainerTelemetry, JobTelemetry

__all__ = [
    "AddContainer",
    "ClusterSnapshot",
    "Container",
    "ContainerTelemetry",
    "Decision",
    "InferenceService",
    "JobState",
    "JobTelemetry",
    "JobView",
    "Node",
    "Preempt",
    "RemoveContainer",
    "Resize",
    "Resources",
    "Role",
    "StartJob",
    "TrainingJob",
]
