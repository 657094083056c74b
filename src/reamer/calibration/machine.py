"""The machine a profile comes from, and the CPU load of other processes during a measurement."""

from __future__ import annotations

import datetime as dt
import os
import platform
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nproc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_info() -> dict:
    """The ``machine`` section of a profile."""
    info: dict = {"cpu": cpu_model(), "nproc": nproc(), "torch": None, "onnxruntime": None,
                  "python": platform.python_version(), "kernel": platform.release(),
                  "date": dt.date.today().isoformat()}  # fmt: skip
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return info


def busy_s() -> float:
    """Non-idle CPU seconds of all CPUs since boot (/proc/stat), every process included."""
    f = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = f
    return (user + nice + system + irq + softirq + steal) / HZ


def own_cpu_s() -> float:
    """CPU seconds of this process and its reaped children."""
    return sum(os.times()[:4])


class LoadMeter:
    """Cores used by *other* processes over a window: machine busy time minus ``own()``.

    ``own`` returns the CPU seconds of everything the measurement itself runs (default: this
    process and its reaped children; pass the cgroups' usage for live child processes)."""

    def __init__(self, own=own_cpu_s):
        self.own = own
        self.reset()

    def reset(self) -> None:
        self.b0, self.o0, self.t0 = busy_s(), self.own(), time.perf_counter()

    def cores(self) -> float:
        wall = time.perf_counter() - self.t0
        if wall <= 0:
            return 0.0
        return max(0.0, (busy_s() - self.b0) - (self.own() - self.o0)) / wall
