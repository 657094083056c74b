"""Discrete-event simulator backend: the physics (speeds, latency, contention, time integrals)
over the shared cluster state. :func:`reamer.runtime.simulate` runs it."""

from reamer.backends.sim.cluster import SimCluster
from reamer.backends.sim.engine import EventQueue
from reamer.backends.sim.inference import SimInference

__all__ = ["EventQueue", "SimCluster", "SimInference"]
