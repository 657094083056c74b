"""Per-model CPU scaling of training: samples/s against threads and against CFS quota.

    python bench/cpu_scaling.py --json docs/data/cpu_scaling.json             (needs root, writable cgroups)
    python bench/cpu_scaling.py --json OUT --threads 1 2 4 8 12 16 --quotas 1 2 4 8 16   (a many-core machine)
    python bench/cpu_scaling.py --json OUT --update-profile src/reamer/data/profiles.json

Each zoo model defined in :mod:`reamer.calibration.archs` (``TRAIN_MODELS``) trains in its own
child process inside its own real cgroup (``CgroupExecutor``): SGD steps, forward + backward
of a synthetic batch at the zoo's input size, loss ``mean(output²)`` (the backward pass costs
what any loss costs). Two sweeps per model, interleaved round by round so machine drift hits
every point alike:

* ``threads``: no CPU quota, ``torch.set_num_threads(t)`` for t in ``--threads`` (≤ the node's CPUs);
* ``quota``: CFS quota of q cores, threads sized as Reamer's launcher does (q rounded half up).

The batch is the zoo's, cut so one step at one thread takes about ``--step-s`` seconds (timed
at batch 1 in the child; on two cores ResNet-50 at batch 32 takes 14 s a step);
``params.batch`` says what ran. Each
window runs at least two steps after one warm-up step. ``other_load_cores`` is what the rest
of the node used during the window (from /proc/stat).

Published curves (``--published``, default ``docs/data/cpu_scaling_published.json``: each with
its citation, hardware, framework, batch and whether it is training or inference) are added as
runs with policy ``published``, never mixed with what this machine measured.

Ratios: ``parallel_fraction_<model>_ratio`` is the Amdahl fraction fitted to the thread sweep
(least squares in log speed-up, :func:`reamer.calibration.training.fit_fraction`), and
``quota_parallel_fraction_<model>_ratio`` the one fitted to the quota sweep,
``published_parallel_fraction_<curve>_ratio`` the one fitted to a published curve.
``--update-profile`` writes the thread sweep into the profile's ``models`` section, so the
simulator's speed model uses each model's own curve, its source and the core range it holds
for (the simulator warns when a container has more cores than the curve measured).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PUBLISHED = Path(__file__).resolve().parents[1] / "docs" / "data" / "cpu_scaling_published.json"
PREFIX = "reamer-bench-cpu-scaling"
THREADS = (1, 2, 4, 8, 12, 16)
QUOTAS = (0.5, 1.0, 1.5, 2.0, 4.0, 8.0, 16.0)
MIN_STEPS = 2


# ---------------------------------------------------------------------------- child
def child(name: str, max_batch: int, step_s: float) -> None:
    """Inside the cgroup. Protocol (one line each): -> loaded {json with the batch}; then per
    window: <- run THREADS SECONDS; -> ready; <- start; -> {json}; finally <- exit."""
    import torch

    from reamer.calibration.archs import build_model

    def say(msg: str) -> None:
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()

    model, x1, _ = build_model(torch, name)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(x) -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        opt.step()

    torch.set_num_threads(1)
    one = []
    for _ in range(3):  # the first step warms up; the batch is sized from the faster of the next two
        t0 = time.perf_counter()
        step(x1)
        one.append(time.perf_counter() - t0)
    batch = max(1, min(max_batch, int(step_s / min(one[1:]))))
    x = x1.repeat(batch, *([1] * (x1.dim() - 1)))
    for _ in range(2):  # warm-up at the batch (allocations, first touch)
        step(x)
    say("loaded " + json.dumps({"batch": batch}))
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "exit":
            return
        threads, run_s = int(cmd[1]), float(cmd[2])
        torch.set_num_threads(threads)
        step(x)
        say("ready")
        if sys.stdin.readline().strip() != "start":
            return
        n, t0 = 0, time.perf_counter()
        while n < MIN_STEPS or time.perf_counter() - t0 < run_s:
            step(x)
            n += 1
        say(json.dumps({"samples": n * batch, "elapsed_s": time.perf_counter() - t0, "threads": threads}))


# ---------------------------------------------------------------------------- parent
class Child:
    def __init__(self, name: str, max_batch: int, step_s: float):
        from reamer.backends.local import launcher

        env = {k: v for k, v in os.environ.items() if k not in launcher.THREAD_ENV_VARS}
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # as the launcher runs every container
        env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", name, str(max_batch), str(step_s)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, bufsize=1)

    def send(self, msg: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(msg + "\n")
        self.proc.stdin.flush()

    def expect(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"child {self.proc.args[3]} exited (rc={self.proc.poll()})")
        return line

    def close(self) -> None:
        try:
            self.send("exit")
            self.proc.wait(timeout=10)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def measure_model(ex, name: str, max_batch: int, step_s: float, configs: list[tuple[int, float | None]],
                  rounds: int, run_s: float, advance) -> list[dict]:  # fmt: skip
    """One child in one cgroup; per round every (threads, quota) config once, order reversed on odd rounds."""
    from threads import (
        node_busy_s,  # bench/threads.py: the node's busy CPU seconds, from /proc/stat
    )

    cg = f"m-{name}"
    ex.create(cg)
    ex.set_cpu(cg, None)
    c = Child(name, max_batch, step_s)
    acc = {cfg: {"samples": 0, "elapsed_s": 0.0, "throttled_s": 0.0, "usage_s": 0.0, "other_s": 0.0} for cfg in configs}
    try:
        line = c.expect()
        if not line.startswith("loaded "):
            raise RuntimeError(f"child {name} said {line!r}")
        batch = json.loads(line.split(" ", 1)[1])["batch"]
        ex.add_process(cg, c.proc.pid)
        for r in range(rounds):
            for threads, quota in configs if r % 2 == 0 else configs[::-1]:
                ex.set_cpu(cg, quota)
                c.send(f"run {threads} {run_s}")
                if c.expect() != "ready":
                    raise RuntimeError(f"child {name} not ready")
                before, (busy0, _) = ex.read_stats(cg), node_busy_s()
                c.send("start")
                res = json.loads(c.expect())
                delta, (busy1, _) = ex.read_stats(cg) - before, node_busy_s()
                a = acc[(threads, quota)]
                a["samples"] += res["samples"]
                a["elapsed_s"] += res["elapsed_s"]
                a["throttled_s"] += delta.throttled_s
                a["usage_s"] += delta.usage_s
                a["other_s"] += max(0.0, (busy1 - busy0) - delta.usage_s)
                advance()
    finally:
        c.close()
        ex.remove(cg, kill=True)
    runs = []
    for (threads, quota), a in acc.items():
        runs.append({"scenario": "threads" if quota is None else "quota", "seed": 0, "policy": "measured",
                     "params": {"model": name, "threads": threads, "quota_cores": quota, "batch": batch},
                     "metrics": {"samples_per_s": a["samples"] / a["elapsed_s"],
                                 "cpu_usage_cores": a["usage_s"] / a["elapsed_s"],
                                 "throttled_s": a["throttled_s"], "other_load_cores": a["other_s"] / a["elapsed_s"],
                                 "window_s": a["elapsed_s"]}})  # fmt: skip
    return runs


def published_runs(path: Path) -> list[dict]:
    """The published curves of ``path`` (docs/data/cpu_scaling_published.json) as runs with
    policy ``published``; a malformed file is one clear error naming the curve and field."""
    doc = json.loads(path.read_text())
    runs = []
    for i, c in enumerate(doc.get("curves", [])):
        for key in ("id", "model", "kind", "points", "source"):
            if key not in c:
                raise SystemExit(f"{path}: curves[{i}].{key}: missing (expected id, model, kind, points, source)")
        if c["kind"] not in ("training", "inference") or not c["points"] or c["points"][0][0] != 1:
            raise SystemExit(f"{path}: curves[{i}] ({c['id']}): expected kind training|inference and points from 1 core")
        for cores, rate in c["points"]:
            runs.append({"scenario": "threads", "seed": 0, "policy": "published",
                         "params": {"model": c["model"], "threads": cores, "quota_cores": None, "batch": None,
                                    "curve": c["id"], "kind": c["kind"], "source": c["source"]},
                         "metrics": {"samples_per_s": rate}})  # fmt: skip
    return runs


def curves(runs: list[dict]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """model -> sweep -> [(cores, samples_per_s)] (threads for the thread sweep, quota for the quota sweep)."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for r in runs:
        if r["policy"] != "measured":
            continue
        p, sweep = r["params"], r["scenario"]
        x = p["threads"] if sweep == "threads" else p["quota_cores"]
        out.setdefault(p["model"], {}).setdefault(sweep, []).append((x, r["metrics"]["samples_per_s"]))
    return out


def fractions(runs: list[dict]) -> dict[str, float]:
    from reamer.calibration.training import fit_fraction

    ratios = {}
    for model, sweeps in curves(runs).items():
        for sweep, key in (("threads", "parallel_fraction"), ("quota", "quota_parallel_fraction")):
            f = fit_fraction(sorted(sweeps.get(sweep, [])))
            if f is not None:
                ratios[f"{key}_{model}_ratio"] = f
    pub: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        if r["policy"] == "published":
            pub.setdefault(r["params"]["curve"], []).append((r["params"]["threads"], r["metrics"]["samples_per_s"]))
    for curve, pts in pub.items():
        f = fit_fraction(sorted(pts))
        if f is not None:
            ratios[f"published_parallel_fraction_{curve}_ratio"] = f
    return ratios


def update_profile(path: Path, runs: list[dict], source: str) -> list[str]:
    """Write each model's thread sweep into the profile's ``models`` section (params and FLOPs
    from the zoo, the published figures the speed model uses); returns the models written."""
    from reamer.calibration.run import dumps
    from reamer.calibration.training import fit_fraction
    from reamer.models.profiles import parse_profiles
    from reamer.models.zoo import ZOO
    from reamer.reports.results import write_atomic

    doc = json.loads(path.read_text())
    written = []
    for model, sweeps in curves(runs).items():
        pts = sorted(sweeps.get("threads", []))
        if not pts or pts[0][0] != 1:
            continue
        batch = next(r["params"]["batch"] for r in runs if r["params"]["model"] == model)
        f = fit_fraction(pts)
        doc.setdefault("models", {})[model] = {  # jobs keep the zoo's batch: the measured one is per sample
            "params_m": ZOO[model].params_m, "fwd_gflops": ZOO[model].fwd_gflops,
            "core_s_per_sample": round(1.0 / pts[0][1], 8),
            "parallel_fraction": None if f is None else round(f, 4), "batch": ZOO[model].batch,
            "measured": [[int(c), round(s, 3)] for c, s in pts],
            "source": f"{source}; measured at batch {batch}; params and FLOPs published (zoo)",
        }  # fmt: skip
        written.append(model)
    parse_profiles(doc, str(path))  # the result must load
    write_atomic(path, dumps(doc))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="output file")
    ap.add_argument("--models", nargs="+", help="default: every TRAIN_MODELS model of reamer.calibration.archs")
    ap.add_argument("--threads", type=int, nargs="+", default=list(THREADS), help="kept where ≤ the node's CPUs")
    ap.add_argument("--quotas", type=float, nargs="+", default=list(QUOTAS), help="kept where ≤ the node's CPUs")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--run-s", type=float, default=3.0, help="seconds per window (at least two steps)")
    ap.add_argument("--step-s", type=float, default=3.0, help="target seconds of one step at one thread (sets the batch)")
    ap.add_argument("--published", type=Path, default=PUBLISHED, help="published curves to include (cited)")
    ap.add_argument("--update-profile", type=Path, help="write the thread sweeps into this profile JSON")
    ap.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"))
    args = ap.parse_args(argv)

    sys.path.insert(0, str(SRC))
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from reamer.backends.local.cgroups import CgroupError, CgroupExecutor
    from reamer.backends.local.launcher import node_cores, threads_for
    from reamer.calibration.archs import TRAIN_MODELS
    from reamer.models.zoo import ZOO
    from reamer.reports.results import document, write_json

    console = Console(stderr=True)
    models = args.models or list(TRAIN_MODELS)
    unknown = sorted(set(models) - set(TRAIN_MODELS))
    if unknown:
        console.print(f"--models: {unknown} not in {list(TRAIN_MODELS)}")
        return 2
    ncpu = node_cores()
    configs = [(t, None) for t in args.threads if t <= ncpu] + [(threads_for(q), q) for q in args.quotas if q <= ncpu]
    if not any(q is None and t == 1 for t, q in configs):
        console.print("--threads: must include 1 (speed-ups are relative to one thread)")
        return 2
    try:
        ex = CgroupExecutor(args.cgroup_root, prefix=PREFIX, controllers=("cpu",))
        ex.sweep()
        ex.create("probe")
        ex.remove("probe")
    except (CgroupError, PermissionError) as err:
        console.print(f"cpu_scaling needs root and writable cgroups: {err}")
        return 2
    t_start = time.monotonic()
    runs: list[dict] = []
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console) as progress:  # fmt: skip
            task = progress.add_task("cpu scaling", total=len(models) * len(configs) * args.rounds)
            for name in models:
                progress.update(task, description=name)
                runs += measure_model(ex, name, ZOO[name].batch, args.step_s, configs, args.rounds, args.run_s,
                                      lambda: progress.advance(task))  # fmt: skip
    finally:
        ex.sweep()
    import torch

    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    source = (f"bench/cpu_scaling.py on {cpu}, {ncpu} cores, cgroup v{ex.version}, torch {torch.__version__}, "
              f"{date.today().isoformat()}; threads {min(t for t, q in configs if q is None)}–"
              f"{max(t for t, q in configs if q is None)}")  # fmt: skip
    runs += published_runs(args.published)
    ratios = fractions(runs)
    doc = document("cpu_scaling", runs, ratios)
    doc["machine"] = {"cpu": cpu, "nproc": ncpu, "torch": torch.__version__, "cgroup": ex.version, "source": source}
    write_json(args.json, doc)
    console.print(f"{len(runs)} points, {len(models)} models, wall {time.monotonic() - t_start:.0f} s → {args.json}")
    for k, v in ratios.items():
        console.print(f"  {k:45s} {v:.3f}")
    busy = [r for r in runs if r["metrics"].get("other_load_cores", 0.0) > 0.25]
    if busy:
        console.print(f"[yellow]other processes used > 0.25 core during {len(busy)} of {len(runs)} points: "
                      "see other_load_cores")
    if args.update_profile:
        console.print(f"profile {args.update_profile}: models {update_profile(args.update_profile, runs, source)}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        sys.path.insert(0, str(SRC))
        child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit(main())
