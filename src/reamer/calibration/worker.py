"""The child process a cgroup measurement runs in, and the parent's handle on it.

A measurement that needs a CPU quota or a pinned core cannot run in the calibrating process
itself (it would throttle the controller), so it runs here: the parent starts
``python -m reamer.calibration.worker KIND MODEL BATCH``, waits for ``{"ready": PID}``, moves
the PID into a cgroup (:class:`~reamer.backends.local.cgroups.CgroupExecutor`, in the parent:
this process writes no cgroup file), then sends one JSON command per line:

* ``{"run": SECONDS, "threads": T}`` → set T threads, settle 0.3 s, run back-to-back for
  SECONDS and answer ``{"rate": calls_per_s, "calls", "wall_s", "cpu_s"}``;
* ``{"quit": true}`` → exit.

Kinds: ``train`` (one training step per call: forward + backward, plus an SGD step for the
reference CNN; ``MODEL`` is ``ref_cnn`` or a real-workload model) and ``infer`` (one ONNX
Runtime ``session.run`` of a batch per call; the session is sized like the inference
server's, :func:`~reamer.backends.local.launcher.ort_session_options`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from reamer.backends.local.cgroups import CgroupError, CgroupExecutor

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "reamer-calib"  # every cgroup calibration creates lives under it (swept at start)


def open_cgroups(root: Path = CGROUP_ROOT, prefix: str = PREFIX) -> tuple[CgroupExecutor | None, str]:
    """A cgroup executor for calibration (cpu + cpuset), or None and a one-line reason why not."""
    if os.geteuid() != 0:
        return None, "needs root to write cgroups"
    try:
        ex = CgroupExecutor(root, prefix=prefix, controllers=("cpu", "cpuset"))
        ex.sweep()  # leftovers of an interrupted calibration
        ex.create("probe")
        ex.set_cpu("probe", 0.5)
        ex.remove("probe")
        return ex, ""
    except CgroupError as e:
        return None, f"cgroups not writable: {e}"


# --------------------------------------------------------------------------- child side


def _train_step(name: str, batch: int) -> Callable[[], None]:
    import torch

    from reamer.calibration.training import reference_cnn, step_fn

    if name == "ref_cnn":
        model, x, y = reference_cnn(batch)
        return step_fn(model, x, y, torch.optim.SGD(model.parameters(), lr=0.01))
    from reamer.workloads.real.nets import build_model, synthetic_batch

    model = build_model(name)
    x, y = synthetic_batch(batch, seed=0)
    return step_fn(model, x, y)


class _Infer:
    def __init__(self, name: str, batch: int, tmp: Path):
        import numpy as np

        from reamer.workloads.real.inference_server import export_onnx
        from reamer.workloads.real.nets import INPUT_SHAPE

        self.path = export_onnx(name, tmp / f"{name}.onnx")
        self.feed = {"input": np.random.default_rng(0).standard_normal((batch, *INPUT_SHAPE), dtype=np.float32)}
        self.threads = 0
        self.session = None

    def set_threads(self, threads: int) -> None:
        if threads != self.threads:
            import onnxruntime as ort

            from reamer.backends.local.launcher import ort_session_options

            self.session = ort.InferenceSession(str(self.path), ort_session_options(threads),
                                                providers=["CPUExecutionProvider"])  # fmt: skip
            self.threads = threads

    def __call__(self) -> None:
        self.session.run(None, self.feed)


def _window(fn: Callable[[], None], seconds: float) -> dict:
    n, c0, t0 = 0, time.process_time(), time.perf_counter()
    while (el := time.perf_counter() - t0) < seconds:
        fn()
        n += 1
    return {"rate": n / el, "calls": n, "wall_s": el, "cpu_s": time.process_time() - c0}


def main(argv: list[str] | None = None) -> int:
    kind, name, batch = (argv or sys.argv[1:])[:3]
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="reamer-calib-") as tmp:
        if kind == "train":
            fn = _train_step(name, int(batch))

            def set_threads(t: int) -> None:
                torch.set_num_threads(t)
        elif kind == "infer":
            fn = _Infer(name, int(batch), Path(tmp))
            set_threads = fn.set_threads
        else:
            raise SystemExit(f"kind: expected train or infer, got {kind!r}")
        set_threads(1)
        for _ in range(3):
            fn()  # warm-up (allocations, first-run graph work)
        print(json.dumps({"ready": os.getpid()}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("quit"):
                break
            set_threads(int(cmd.get("threads", 1)))
            _window(fn, float(cmd.get("settle", 0.3)))  # settle under the new quota / threads
            print(json.dumps(_window(fn, float(cmd["run"]))), flush=True)
    return 0


# --------------------------------------------------------------------------- parent side


class Worker:
    """Parent-side handle: start the child, optionally put it in cgroup ``cgroup`` of ``ex``."""

    def __init__(self, kind: str, model: str, batch: int, ex: CgroupExecutor | None = None,
                 cgroup: str | None = None, wait: bool = True):  # fmt: skip
        """``wait=False``: return at once (start several children in parallel), then :meth:`attach`."""
        self.ex, self.cgroup = ex, cgroup
        self.proc = subprocess.Popen([sys.executable, "-m", "reamer.calibration.worker", kind, model, str(batch)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        if wait:
            self.attach()

    def attach(self) -> None:
        """Wait for the child to be ready, then move it into its cgroup."""
        try:
            ready = self._read()
            if self.ex is not None and self.cgroup is not None:
                self.ex.add_process(self.cgroup, int(ready["ready"]))
        except BaseException:
            self.close()
            raise

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"calibration worker exited with code {code}")
        return json.loads(line)

    def send(self, seconds: float, threads: int = 1) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"run": seconds, "threads": threads}) + "\n")
        self.proc.stdin.flush()

    def result(self) -> dict:
        return self._read()

    def run(self, seconds: float, threads: int = 1) -> dict:
        self.send(seconds, threads)
        return self.result()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    raise SystemExit(main())
