"""The one shared cluster state every backend uses (as koordlet's statesinformer is for its
plugins): free capacity, job / container / replica records and their ids, and the
validation of every decision, turned into typed effects that a backend carries out."""

from reamer.backends.state.inference import (
    MoveReplica,
    ReplicaEffect,
    ReplicaState,
    ServiceRecord,
    SetReplicaQuota,
    StartReplica,
    StopReplica,
)
from reamer.backends.state.training import (
    ClusterState,
    Effect,
    Growth,
    JobRecord,
    Launch,
    Reshape,
    SetQuota,
    Stop,
    effect_nodes,
)

__all__ = [
    "ClusterState",
    "Effect",
    "Growth",
    "JobRecord",
    "Launch",
    "MoveReplica",
    "ReplicaEffect",
    "ReplicaState",
    "Reshape",
    "ServiceRecord",
    "SetQuota",
    "SetReplicaQuota",
    "StartReplica",
    "Stop",
    "StopReplica",
    "effect_nodes",
]
