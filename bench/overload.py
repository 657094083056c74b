"""The inference server overloaded: does admission control keep the admitted requests within
the SLO and the goodput near capacity?

    python bench/overload.py --json docs/data/overload.json [--model vgg_cifar] [--slo-ms 250]

One real server (``--model``, ``--max-batch 8 --max-wait-ms 0`` as the serving calibration
and the apparatus experiment run it, one ONNX Runtime thread) pinned to the last CPU; every
client (this script's closed loop, the load generator as a process of its own) pinned to
the other CPUs, so that the clients never take the server's core.

1. **Capacity**, measured: closed-loop clients (1, 2, 4, 8, 16 of them; each sends one
   sample, a new connection per request as the load generator does, waits for the answer,
   sends the next) for ``--capacity-s`` each, after a warm-up: the throughput curve. The
   capacity is the median throughput (requests/s = samples/s: one sample a request) of the
   points that kept the server's core busy within the SLO (the plateau).
2. **Open-loop Poisson load** from the load generator (:mod:`reamer.workloads.real.loadgen`
   with ``--deadline-ms`` = the SLO: each request tells the server what is left of its SLO
   less the time it spends outside the server) at ``--loads`` x capacity (1.0 is the
   reference), ``--duration`` s each, ``--rounds`` times interleaved. This machine's speed
   drifts by several percent over minutes (a shared VM), so each run's capacity is measured
   right before it (``REFERENCE_CLIENTS`` closed-loop clients, on the plateau) and the run's
   rate and ratios refer to that.

Per open-loop run: offered rate, admitted (200) and shed (503) requests, other errors, p99
of the admitted requests as the client measured them (from the scheduled arrival), goodput
(successful requests / s over wall time) and goodput / capacity; the time outside the
server (client latency less the server's ``Server-Timing``); from the server's metrics the
shed reasons (``deadline``: refused on arrival; ``expired``: deadline passed in the queue);
the CPU the server (its event loop and its batcher thread apart), the load generator and
everything else on the machine used (cores, from ``/proc``), to tell a saturated apparatus
or a busy machine from the server's own limit. Ratios: goodput / capacity and p99 / SLO per
load and round, and their medians.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from reamer.reports.results import document, run_entry, write_json
from reamer.workloads.real.loadgen import default_payload, percentile
from reamer.workloads.real.serving_metrics import fetch_metrics

SERVER = "reamer.workloads.real.inference_server"
LOADGEN = "reamer.workloads.real.loadgen"
CLIENTS = (1, 2, 4, 8, 16)
SATURATED = 0.95  # server cores busy: the point is on the throughput plateau
REFERENCE_CLIENTS = 8  # each run's capacity reference: on the plateau with a p99 far inside the SLO
# CPU used by the rest of the machine above which a run is disturbed and done again (quiet
# runs here read -0.07..+0.04 cores: the accounting of loopback network work)
DISTURBED_CORES = 0.15
TICK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def loop_and_rest_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of a process's main thread (the server's event loop) and of its other
    threads (the batcher running ONNX Runtime)."""
    main = rest = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        if int(task.name) == pid:
            main += cpu
        else:
            rest += cpu
    return main, rest


def machine_busy_s() -> float:
    """CPU seconds every CPU of the machine has been busy (not idle / iowait) since boot."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK  # user nice system idle iowait irq softirq steal


def pinned(cpus: set[int]) -> list[str]:
    """A command prefix that runs it on ``cpus`` only (util-linux ``taskset``)."""
    return ["taskset", "-c", ",".join(map(str, sorted(cpus)))]


def closed_loop(port: int, clients: int, seconds: float, body: bytes) -> dict[str, float]:
    """``clients`` threads, each sending its next request as soon as the last one is answered."""
    lat: list[float] = []
    path: list[float] = []  # client latency − the server's own (Server-Timing): the way there and back
    errors = [0]
    lock = threading.Lock()
    start = time.perf_counter()
    end = start + seconds

    def one() -> None:
        while time.perf_counter() < end:
            t = time.perf_counter()
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    c.request("POST", "/infer", body=body, headers={"Content-Type": "application/octet-stream"})
                    r = c.getresponse()
                    r.read()
                    ok = r.status == 200
                    timing = r.getheader("Server-Timing") or ""
                finally:
                    c.close()
            except (OSError, http.client.HTTPException):
                ok = False
            dt = time.perf_counter() - t
            with lock:
                if ok:
                    lat.append(dt)
                    if timing.startswith("app;dur="):
                        path.append(dt - float(timing[8:]) / 1e3)
                else:
                    errors[0] += 1

    ts = [threading.Thread(target=one, daemon=True) for _ in range(clients)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    wall = time.perf_counter() - start
    s, pth = sorted(lat), sorted(path)
    return {"clients": clients, "throughput_per_s": len(s) / wall, "p50_ms": 1e3 * (percentile(s, 50) or 0.0),
            "p99_ms": 1e3 * (percentile(s, 99) or 0.0), "requests": len(s), "errors": errors[0],
            "path_p50_ms": 1e3 * (percentile(pth, 50) or 0.0), "path_p99_ms": 1e3 * (percentile(pth, 99) or 0.0)}


def shed_counts(port: int) -> dict[str, float]:
    m = fetch_metrics(port)
    return {k.split('"')[1]: v for k, v in m.items() if k.startswith("reamer_infer_shed_total{")} | {
        "samples": m.get("reamer_infer_samples_total", 0.0), "batches": m.get("reamer_infer_batch_size_count", 0.0)}


def open_loop(port: int, rate: float, seconds: float, deadline_ms: float, inflight: int, cpus: set[int],
              env: dict[str, str]) -> dict[str, float]:
    s0, busy0, t0 = shed_counts(port), machine_busy_s(), time.monotonic()
    argv = [sys.executable, "-m", LOADGEN, "--url", f"http://127.0.0.1:{port}/infer", "--rate", f"{rate:.3f}",
            "--duration", f"{seconds:g}", "--seed", "1", "--deadline-ms", f"{deadline_ms:.3f}", "--max-inflight",
            str(inflight), "--timeout", "10"]
    p = subprocess.Popen([*pinned(cpus), *argv], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    out = p.stdout.read()  # to its exit
    p.stdout.close()
    _, status, usage = os.wait4(p.pid, 0)  # reaped here, with its CPU use
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 1):  # 1: no request succeeded (still a report)
        raise RuntimeError(f"load generator exited {p.returncode}")
    rep = json.loads(out.strip().splitlines()[-1])
    return {"report": rep, "shed_before": s0, "shed_after": shed_counts(port), "wall_s": time.monotonic() - t0,
            "busy_s": machine_busy_s() - busy0, "usage": usage}


def capacity_points(srv: subprocess.Popen, port: int, seconds: float, slo_ms: float, model: str, when: str,
                    runs: list[dict]) -> tuple[float, float]:
    """The closed-loop points (logged, kept as runs), the capacity they give and the p99 of the
    time outside the server (the way to it and back) at capacity."""
    body = default_payload(0)
    points = []
    for c in CLIENTS:
        cpu0, (loop0, rest0), busy0, me0, t0 = (proc_cpu_s(srv.pid), loop_and_rest_cpu_s(srv.pid), machine_busy_s(),
                                                sum(os.times()[:2]), time.monotonic())
        pt = closed_loop(port, c, seconds, body)
        dt = time.monotonic() - t0
        loop1, rest1 = loop_and_rest_cpu_s(srv.pid)
        pt["server_cpu_cores"] = (proc_cpu_s(srv.pid) - cpu0) / dt
        pt["server_loop_cpu_cores"], pt["server_batcher_cpu_cores"] = (loop1 - loop0) / dt, (rest1 - rest0) / dt
        pt["client_cpu_cores"] = (sum(os.times()[:2]) - me0) / dt
        pt["other_cpu_cores"] = (machine_busy_s() - busy0) / dt - pt["server_cpu_cores"] - pt["client_cpu_cores"]
        points.append(pt)
        log(f"  closed loop ({when}), {c:2d} clients: {pt['throughput_per_s']:.1f} req/s, p50 {pt['p50_ms']:.1f} ms, "
            f"p99 {pt['p99_ms']:.1f} ms (outside the server: p50 {pt['path_p50_ms']:.1f}, p99 {pt['path_p99_ms']:.1f}); "
            f"CPU server {pt['server_cpu_cores']:.2f} (event loop {pt['server_loop_cpu_cores']:.2f}, batcher "
            f"{pt['server_batcher_cpu_cores']:.2f}), clients {pt['client_cpu_cores']:.2f}, other "
            f"{pt['other_cpu_cores']:.2f} cores")
        runs.append(run_entry("overload", 1, "closed_loop", {k: v for k, v in pt.items() if k != "clients"},
                              {"phase": f"capacity_{when}", "clients": c, "model": model, "slo_ms": slo_ms}))
    # the plateau: points that kept the server's core busy (one client leaves it idle between
    # requests) and met the SLO; their median, not their maximum (the highest of five noisy
    # measurements of one throughput overstates it)
    plateau = [p for p in points if p["p99_ms"] <= slo_ms and p["server_cpu_cores"] >= SATURATED]
    if not plateau:
        raise RuntimeError(f"no closed-loop point saturated the server within the {slo_ms:g} ms SLO")
    capacity = statistics.median(p["throughput_per_s"] for p in plateau)
    path = statistics.median(p["path_p99_ms"] for p in plateau)
    log(f"  capacity ({when}) {capacity:.1f} req/s: the median of {len(plateau)} saturated points "
        f"({', '.join(str(p['clients']) for p in plateau)} clients); outside the server p99 {path:.1f} ms")
    return float(capacity), float(path)  # path: for the record (the load generator measures its own)


def reference(srv: subprocess.Popen, port: int, seconds: float) -> dict[str, float]:
    """The capacity right before an open-loop run: ``REFERENCE_CLIENTS`` closed-loop clients (on
    the plateau), with the CPU the rest of the machine used meanwhile."""
    busy0, cpu0, me0, t0 = machine_busy_s(), proc_cpu_s(srv.pid), sum(os.times()[:2]), time.monotonic()
    pt = closed_loop(port, REFERENCE_CLIENTS, seconds, default_payload(0))
    dt = time.monotonic() - t0
    pt["other_cpu_cores"] = ((machine_busy_s() - busy0) - (proc_cpu_s(srv.pid) - cpu0) - (sum(os.times()[:2]) - me0)) / dt
    return pt


def load_run(srv: subprocess.Popen, port: int, load: float, capacity: float, a: argparse.Namespace,
             cpus: set[int], env: dict[str, str]) -> dict[str, float]:
    """One open-loop run at ``load`` x ``capacity``: its metrics."""
    cpu0, (loop0, rest0) = proc_cpu_s(srv.pid), loop_and_rest_cpu_s(srv.pid)
    got = open_loop(port, load * capacity, a.duration, a.slo_ms, a.max_inflight, cpus, env)
    rep, wall = got["report"], got["wall_s"]
    server_cores = (proc_cpu_s(srv.pid) - cpu0) / wall
    loop1, rest1 = loop_and_rest_cpu_s(srv.pid)
    usage = got["usage"]
    loadgen_cores = (usage.ru_utime + usage.ru_stime) / wall
    sb, sa = got["shed_before"], got["shed_after"]
    p99 = rep["latency_ms"]["p99"]
    return {"offered_rate_per_s": rep["offered_rate"], "sent": rep["sent"], "admitted": rep["ok"],
            "shed": rep["shed"], "other_errors": sum(rep["errors"].values()) - rep["shed"],
            "p99_admitted_ms": p99 if p99 is not None else float("nan"), "p50_admitted_ms": rep["latency_ms"]["p50"],
            "p99_admitted_over_slo": (p99 if p99 is not None else float("nan")) / a.slo_ms,
            "goodput_per_s": rep["achieved_rate"], "capacity_per_s": capacity,
            "goodput_over_capacity": rep["achieved_rate"] / capacity,
            "outside_server_p50_ms": rep["outside_server_ms"]["p50"] or float("nan"),
            "outside_server_p99_ms": rep["outside_server_ms"]["p99"] or float("nan"),
            "shed_deadline": sa["deadline"] - sb["deadline"], "shed_expired": sa["expired"] - sb["expired"],
            "shed_queue_full": sa["queue_full"] - sb["queue_full"],
            "server_batch_mean": (sa["samples"] - sb["samples"]) / max(1.0, sa["batches"] - sb["batches"]),
            "late_dispatches": rep["late_dispatches"], "server_cpu_cores": server_cores,
            "server_loop_cpu_cores": (loop1 - loop0) / wall, "server_batcher_cpu_cores": (rest1 - rest0) / wall,
            "loadgen_cpu_cores": loadgen_cores, "other_cpu_cores": got["busy_s"] / wall - server_cores - loadgen_cores}


def wait_quiet(server_pid: int, max_s: float) -> float:
    """Wait (at most ``max_s``) until the rest of the machine has used under
    ``DISTURBED_CORES`` for 3 s; what it used in the last 3 s."""
    end = time.monotonic() + max_s
    while True:
        busy0, cpu0, me0 = machine_busy_s(), proc_cpu_s(server_pid), sum(os.times()[:2])
        time.sleep(3.0)
        other = ((machine_busy_s() - busy0) - (proc_cpu_s(server_pid) - cpu0) - (sum(os.times()[:2]) - me0)) / 3.0
        if other < DISTURBED_CORES or time.monotonic() > end:
            return other
        log(f"  the machine is busy ({other:.2f} cores besides this benchmark): waiting")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_out", type=Path, help="write results here")
    ap.add_argument("--model", default="vgg_cifar")
    ap.add_argument("--slo-ms", type=float, default=250.0,
                    help="p99 SLO (default: vgg_cifar's in src/reamer/data/local.yaml)")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--loads", default="1.0,1.5,3.0", help="open-loop rates, x the measured capacity")
    ap.add_argument("--rounds", type=int, default=2, help="each load this many times, interleaved")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per open-loop run")
    ap.add_argument("--capacity-s", type=float, default=10.0, help="seconds per closed-loop point")
    ap.add_argument("--attempts", type=int, default=3, help="tries of a run the rest of the machine disturbed")
    ap.add_argument("--max-inflight", type=int, default=256,
                    help="load generator senders (>= rate x SLO at the highest load, or it lags)")
    a = ap.parse_args()
    ncpu = os.cpu_count() or 1
    if ncpu < 2:
        log("error: bench/overload.py needs 2 CPUs (the server's and the clients')")
        return 2
    server_cpu, client_cpus = ncpu - 1, set(range(ncpu - 1))
    os.sched_setaffinity(0, client_cpus)  # this script's closed-loop clients too
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "PYTHONWARNINGS": "ignore"}
    loads = [float(x) for x in a.loads.split(",")]
    srv = subprocess.Popen([*pinned({server_cpu}), sys.executable, "-m", SERVER, "--model", a.model, "--max-batch",
                            str(a.max_batch), "--max-wait-ms", "0", "--threads", "1"], stdout=subprocess.PIPE, text=True,
                           env=env)
    runs: list[dict] = []
    ratios: dict[str, float] = {}
    try:
        hello = json.loads(srv.stdout.readline() or "{}")
        if hello.get("event") != "listening":
            raise RuntimeError(f"server did not start (exit {srv.poll()})")
        port = int(hello["port"])
        log(f"overload: {a.model} on CPU {server_cpu}, clients on {sorted(client_cpus)}, SLO {a.slo_ms:g} ms")
        closed_loop(port, 4, 5.0, default_payload(0))  # warm-up
        capacity_points(srv, port, a.capacity_s, a.slo_ms, a.model, "curve", runs)
        by_load: dict[float, list[dict[str, float]]] = {x: [] for x in loads}
        for rnd in range(1, a.rounds + 1):
            for load in loads:
                for attempt in range(1, a.attempts + 1):
                    wait_quiet(srv.pid, 600.0)
                    ref = reference(srv, port, a.capacity_s)
                    if ref["p99_ms"] > a.slo_ms:
                        raise RuntimeError(f"{REFERENCE_CLIENTS} closed-loop clients missed the SLO: p99 "
                                           f"{ref['p99_ms']:.1f} ms")
                    capacity = ref["throughput_per_s"]
                    m = load_run(srv, port, load, capacity, a, client_cpus, env)
                    m["capacity_other_cpu_cores"] = ref["other_cpu_cores"]
                    disturbed = max(m["other_cpu_cores"], ref["other_cpu_cores"]) > DISTURBED_CORES
                    m["disturbed"] = float(disturbed)
                    log(f"  round {rnd}, {load:g}x of {capacity:.1f}/s (offered {m['offered_rate_per_s']:.1f}/s): admitted "
                        f"{m['admitted']:.0f}, shed {m['shed']:.0f} (deadline {m['shed_deadline']:.0f}, expired "
                        f"{m['shed_expired']:.0f}), other errors {m['other_errors']:.0f}, p99 admitted "
                        f"{m['p99_admitted_ms']:.1f} ms (outside the server p99 {m['outside_server_p99_ms']:.1f} ms), "
                        f"goodput {m['goodput_per_s']:.1f}/s = {m['goodput_over_capacity']:.2f} x capacity; CPU server "
                        f"{m['server_cpu_cores']:.2f} (event loop {m['server_loop_cpu_cores']:.2f}, batcher "
                        f"{m['server_batcher_cpu_cores']:.2f}), load generator {m['loadgen_cpu_cores']:.2f}, other "
                        f"{m['other_cpu_cores']:.2f} (during the capacity run {ref['other_cpu_cores']:.2f}) cores; "
                        f"late dispatches {m['late_dispatches']:.0f}{'; DISTURBED' if disturbed else ''}")
                    runs.append(run_entry("overload", rnd, "open_loop", m, {
                        "phase": "load", "load_x_capacity": load, "round": rnd, "attempt": attempt, "model": a.model,
                        "slo_ms": a.slo_ms, "max_batch": a.max_batch, "max_inflight": a.max_inflight,
                        "reference_clients": REFERENCE_CLIENTS}))
                    if not disturbed or attempt == a.attempts:
                        by_load[load].append(m)
                        break
                    log(f"  round {rnd}, {load:g}x again: the rest of the machine used {m['other_cpu_cores']:.2f} cores")

        for load, ms in by_load.items():
            tag = f"{load:g}x".replace(".", "_")
            for k in ("goodput_over_capacity", "p99_admitted_over_slo"):
                for rnd, m in enumerate(ms, 1):
                    ratios[f"{k}_{tag}_r{rnd}"] = m[k]
                ratios[f"{k}_{tag}_median"] = statistics.median(m[k] for m in ms)
    finally:
        srv.terminate()
        try:
            srv.wait(15)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait(5)
    if a.json_out:
        write_json(a.json_out, document("overload", runs, ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
