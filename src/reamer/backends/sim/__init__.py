"""Discrete-event simulator backend."""

from reamer.backends.sim.cluster import SimCluster
from reamer.backends.sim.engine import EventQueue
from reamer.backends.sim.run import RunResult, simulate

__all__ = ["EventQueue", "RunResult", "SimCluster", "simulate"]
