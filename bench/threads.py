"""Framework-default vs container-aware threads under real CFS CPU quotas.

For each quota (0.5, 1.0, 1.5 cores) and workload

* ``torch_train`` — SGD training steps of a small CNN, synthetic CIFAR-shaped batch of 32;
* ``ort_infer``   — ONNX Runtime inference of the same CNN (exported from PyTorch), batch 8;

two child processes are started, each in its own real cgroup (``CgroupExecutor`` on
``/sys/fs/cgroup``) with the same quota:

* ``default`` — the frameworks' own sizing (PyTorch: one thread per core of the node;
  ONNX Runtime: ``SessionOptions()``), thread env variables removed;
* ``aware``   — ``reamer.backends.local.launcher``: OMP/MKL env (thread counts and
  ``OMP_WAIT_POLICY=PASSIVE``) from the cgroup's effective CPUs, set by the parent like a
  container runtime would; inside the container the child reads its own quota from its
  cgroup files and sizes PyTorch / ONNX Runtime pools (ORT: no spin-waiting).

Children load outside the quota, then are moved into their cgroup; measured windows of
the two policies alternate (D A D A ...) so drifting background load hits both alike.
``throughput_per_s`` is samples per second inside the child's window; ``throttled_s`` is
the growth of ``cpu.stat`` throttled time over the window, summed over windows. The kernel
sums throttled time over the per-CPU run queues, so a group running on both CPUs of this
node can be throttled for up to 2 s per wall second. ``other_load_cores`` is the CPU that
everything else on the node used during the windows (from /proc/stat): on a shared machine
a value near a full core means the 1.5-core runs had less than 1.5 cores to run on.
``threads`` is the intra-op pool size (0 = ONNX Runtime's own default, one per core).

Usage: python bench/threads.py --json OUT [--quick]       (needs root and writable cgroups)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUOTAS = (0.5, 1.0, 1.5)
WORKLOADS = ("torch_train", "ort_infer")
POLICIES = ("default", "aware")
TRAIN_BATCH = 32
INFER_BATCH = 8
PREFIX = "reamer-bench-threads"  # own prefix: the start-up sweep touches nothing else
THROTTLE_EPS_S = 0.1  # one CFS period: keeps the throttled ratio finite (and sane) near zero


# ---------------------------------------------------------------------------- model
def build_cnn(torch):
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10),
    )  # fmt: skip


def export_onnx(path: Path) -> None:
    import torch

    model = build_cnn(torch).eval()
    x = torch.randn(INFER_BATCH, 3, 32, 32)
    torch.onnx.export(
        model, (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17,
    )  # fmt: skip


# ---------------------------------------------------------------------------- child
def child(workload: str, policy: str, onnx_path: str) -> None:
    """Runs inside the container. Protocol (one line each): -> loaded; <- go;
    then per window: <- run WARM_S SECONDS; -> ready; <- start; -> {json}; finally <- exit."""
    from reamer.backends.local import launcher

    def say(msg: str) -> None:
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()

    def hear() -> str:
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)
        return line.strip()

    if workload == "torch_train":
        import torch

        model = build_cnn(torch)
        x = torch.randn(TRAIN_BATCH, 3, 32, 32)
        y = torch.randint(0, 10, (TRAIN_BATCH,))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step() -> int:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            return TRAIN_BATCH

        make_session = None
    else:
        import numpy as np
        import onnxruntime as ort

        x = np.random.default_rng(0).standard_normal((INFER_BATCH, 3, 32, 32), dtype=np.float32)

        def make_session(cores: float | None):
            opts = ort.SessionOptions() if cores is None else launcher.ort_session_options(cores)
            return ort.InferenceSession(onnx_path, sess_options=opts, providers=["CPUExecutionProvider"])

    say("loaded")
    assert hear() == "go"  # now inside the cgroup
    threads = 0
    if policy == "aware":
        cores = launcher.own_effective_cpus()  # read from this process's own cgroup files
        if workload == "torch_train":
            threads = launcher.apply_torch(cores)[0]
        else:
            sess = make_session(cores)
            threads = launcher.threads_for(cores)
    else:
        cores = None
        if workload == "torch_train":
            threads = torch.get_num_threads()
        else:
            sess = make_session(None)
            threads = 0  # ORT default (one per physical core)
    if make_session is not None:

        def step() -> int:
            sess.run(None, {"x": x})
            return INFER_BATCH

    while True:
        cmd = hear().split()
        if cmd[0] == "exit":
            return
        warm_s, run_s = float(cmd[1]), float(cmd[2])
        t_end = time.perf_counter() + warm_s
        while time.perf_counter() < t_end:
            step()
        say("ready")
        assert hear() == "start"
        samples = 0
        t0 = time.perf_counter()
        t_end = t0 + run_s
        while time.perf_counter() < t_end:
            samples += step()
        elapsed = time.perf_counter() - t0
        say(json.dumps({"samples": samples, "elapsed_s": elapsed, "threads": threads, "cores": cores}))


# ---------------------------------------------------------------------------- parent
class Child:
    def __init__(self, workload: str, policy: str, onnx_path: Path, env: dict[str, str]):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, policy, str(onnx_path)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, bufsize=1
        )  # fmt: skip

    def send(self, msg: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(msg + "\n")
        self.proc.stdin.flush()

    def expect(self, what: str | None = None) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"child {self.proc.args[3:5]} exited (rc={self.proc.poll()})")
        if what is not None and line != what:
            raise RuntimeError(f"child said {line!r}, expected {what!r}")
        return line

    def close(self) -> None:
        try:
            self.send("exit")
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def child_env(policy: str, cores: float) -> dict[str, str]:
    from reamer.backends.local import launcher

    env = {k: v for k, v in os.environ.items() if k not in launcher.THREAD_ENV_VARS and k != "OMP_WAIT_POLICY"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if policy == "aware":
        env.update(launcher.thread_env(cores))
    return env


def node_busy_s() -> tuple[float, float]:
    """(busy CPU seconds of the whole node, wall clock) from /proc/stat — to see how much
    CPU other processes took during a window (this machine is shared)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"), time.monotonic()


def measure_pair(ex, quota: float, workload: str, onnx_path: Path, reps: int, first_warm_s: float,
                 warm_s: float, run_s: float, advance) -> dict[str, dict]:  # fmt: skip
    """Both policies' children for one (quota, workload), windows alternating D A D A ..."""
    children: dict[str, Child] = {}
    names = {p: f"q{quota}-{workload}-{p}" for p in POLICIES}
    acc = {p: {"samples": 0, "elapsed_s": 0.0, "throttled_s": 0.0, "nr_throttled": 0, "usage_s": 0.0,
                "other_s": 0.0}
           for p in POLICIES}  # fmt: skip
    info: dict[str, dict] = {}
    try:
        for p in POLICIES:
            ex.create(names[p])
            ex.set_cpu(names[p], quota)
            children[p] = Child(workload, p, onnx_path, child_env(p, ex.effective_cpus(names[p])))
        for p in POLICIES:
            children[p].expect("loaded")
            ex.add_process(names[p], children[p].proc.pid)
            children[p].send("go")
        for r in range(reps):
            order = POLICIES if r % 2 == 0 else POLICIES[::-1]
            for p in order:
                c = children[p]
                c.send(f"run {first_warm_s if r == 0 else warm_s} {run_s}")
                c.expect("ready")
                before, busy0 = ex.read_stats(names[p]), node_busy_s()
                c.send("start")
                res = json.loads(c.expect())
                delta, busy1 = ex.read_stats(names[p]) - before, node_busy_s()
                a = acc[p]
                a["samples"] += res["samples"]
                a["elapsed_s"] += res["elapsed_s"]
                a["throttled_s"] += delta.throttled_s
                a["nr_throttled"] += delta.nr_throttled
                a["usage_s"] += delta.usage_s
                a["other_s"] += max(0.0, (busy1[0] - busy0[0]) - delta.usage_s) / (busy1[1] - busy0[1]) * res["elapsed_s"]
                info[p] = res
                advance()
    finally:
        for c in children.values():
            c.close()
        for n in names.values():
            ex.remove(n, kill=True)
    out = {}
    for p in POLICIES:
        a = acc[p]
        out[p] = {
            "throughput_per_s": a["samples"] / a["elapsed_s"],
            "throttled_s": a["throttled_s"],
            "nr_throttled": a["nr_throttled"],
            "cpu_usage_cores": a["usage_s"] / a["elapsed_s"],
            "other_load_cores": a["other_s"] / a["elapsed_s"],  # CPU used by everything else on the node
            "window_s": a["elapsed_s"],
            "threads": info[p]["threads"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="output file")
    ap.add_argument("--quick", action="store_true", help="shorter windows (~1 min)")
    ap.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"))
    args = ap.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from reamer.backends.local.cgroups import CgroupError, CgroupExecutor

    console = Console(stderr=True)
    if args.quick:
        reps, first_warm_s, warm_s, run_s = 2, 0.8, 0.3, 2.0
    else:
        reps, first_warm_s, warm_s, run_s = 3, 1.5, 0.5, 3.0
    try:
        ex = CgroupExecutor(args.cgroup_root, prefix=PREFIX, controllers=("cpu",))
        leftovers = ex.sweep()
        ex.create("probe")  # fail here, with one line, when cgroups are not writable
        ex.remove("probe")
    except (CgroupError, PermissionError) as err:
        console.print(f"[red]threads bench needs root and writable cgroups: {err}")
        return 2
    if leftovers:
        console.print(f"swept leftover cgroups: {leftovers}")

    t_start = time.monotonic()
    runs: list[dict] = []
    ratios: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="reamer-threads-") as tmp:
            onnx_path = Path(tmp) / "cnn.onnx"
            export_onnx(onnx_path)
            total = len(QUOTAS) * len(WORKLOADS) * len(POLICIES) * reps
            with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TimeElapsedColumn(), console=console) as progress:  # fmt: skip
                task = progress.add_task("threads", total=total)
                for quota in QUOTAS:
                    for workload in WORKLOADS:
                        progress.update(task, description=f"q={quota} {workload}")
                        res = measure_pair(ex, quota, workload, onnx_path, reps, first_warm_s, warm_s, run_s,
                                           lambda: progress.advance(task))  # fmt: skip
                        for p in POLICIES:
                            runs.append({"scenario": "quota", "seed": 0, "policy": p,
                                         "params": {"quota_cores": quota, "workload": workload},
                                         "metrics": res[p]})  # fmt: skip
                        d, a = res["default"], res["aware"]
                        key = f"q{quota}_{workload}"
                        ratios[f"aware_over_default_{key}"] = a["throughput_per_s"] / d["throughput_per_s"]
                        ratios[f"throttled_aware_over_default_{key}"] = (a["throttled_s"] + THROTTLE_EPS_S) / (
                            d["throttled_s"] + THROTTLE_EPS_S
                        )
    finally:
        ex.sweep()
    out = {
        "bench": "threads",
        "runs": runs,
        "ratios": ratios,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"{os.cpu_count()} cpus, cgroup v{ex.version}, reps={reps} x {run_s}s windows, "
                  f"wall {time.monotonic() - t_start:.0f}s")
    for k, v in ratios.items():
        console.print(f"{k:50s} {v:7.3f}")
    busy = [r for r in runs if r["metrics"]["other_load_cores"] > 0.25]
    if busy:
        console.print(f"[yellow]warning: other processes used > 0.25 core during {len(busy)} of {len(runs)} runs "
                      f"(max {max(r['metrics']['other_load_cores'] for r in busy):.2f}): shared machine, see other_load_cores")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(main())
