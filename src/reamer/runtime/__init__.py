"""The runtime layer: wires a scenario's policies to a backend and runs the control rounds
(training, or the joint round with inference), with a round hook that the console, reports
and benchmarks subscribe to. ``simulate`` drives the simulator; ``local`` real runs."""

from reamer.runtime.rounds import RoundHook, RoundRecord
from reamer.runtime.sim import JobRecord, RunResult, simulate

__all__ = ["JobRecord", "RoundHook", "RoundRecord", "RunResult", "simulate"]
