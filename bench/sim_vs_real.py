"""Does the simulator predict reality? The same small scenario run for real (local backend:
testbed hosts, cgroups, real PS training over tc-limited links, the ONNX Runtime server
under open-loop load) and simulated with the calibrated profile.

    python bench/sim_vs_real.py --json OUT [--scenario local.yaml] [--profiles profiles.json]

Both sides run the same ``nearchus`` policy module on the same job. Compared, per shape the
job had (PS, workers): mean measured training speed (first round after a change left out)
and the bottleneck NEARCHUS diagnosed; for the service (one fixed replica, so both sides
serve with the same shape): p99 latency over the run, and per one-window.

The real scenario runs ``--trials`` times (3) as valid trials, at most ``--tries`` runs. The
served model's service time and serving path are measured before the first run and after
every run (``reamer.calibration.inference`` / ``serving``; a run's calibration after is the
next run's before; each trial uses the mean of its two): this VM's speed drifts by tens of
percent over minutes (the same ONNX Runtime call took 4.6-7.6 ms within 30 s here). A trial
whose two calibrations differ by more than ``--max-drift`` (15%), or during which the
hypervisor stole more than ``--max-steal-pct`` of a CPU, is not a valid comparison. Each
trial is simulated with its own calibrations and restart time; the verdict compares the mean
over the valid trials of each real value with the mean of the simulated one: the same
replica alone at the same load ranged 33.7-42.6 ms between 45 s windows here
(``bench/experiments/apparatus.py``), and single valid trials missed 15% on p99 in about a
quarter of cases: one run cannot resolve 15%, so the verdict is the mean of 3. Every trial's
own figures, valid or not, are in the output's ``trials``. ``--replica-cpus`` /
``--apparatus-cpus`` keep the measuring apparatus (controller, load generator) off the
replica's CPU; ``--exclusive-replica-cpus`` keeps the training containers off it too, so
that the replica shares its host with training as the interference calibration measured it
(training on the other core): by default the worker's compute bursts also land on the
replica's CPU and take half of it while they last, which the simulator's one mean slowdown
factor does not represent.

Simulated side: :func:`reamer.runtime.simulate` with the scenario's hosts as nodes (link
limit = NIC), the job, the measured restart time of the real run, and a round hook that
keeps every round's record; the replica by :func:`reamer.models.inference.simulate_replica`
(request level, the calibrated service time, slowed by the profile's interference
coefficient × the simulated training CPU use on its node) fed the very arrival times the
real load generator sent (``loadgen.schedule_of`` of its options: same trace, same seed), as
the serving path was fitted on the calibrations' own schedules: a p99 of a few thousand
requests depends on the sample's bursts (a separate Poisson sample of the same rates, both
seeds fixed, gives a p99 4-16 % lower, the same way every time).

Beside them, what the replica measured itself (:func:`server_side`): the model's time per
batch in the run against the calibrations' fit, and the latency inside the server against the
client's.

Metrics (over the valid trials, or every run when none was valid: ``trials_valid`` says):
``speed_error_pct`` (the first shape), ``speed_error_after_pct`` (the shape after
NEARCHUS's change, when both sides made it), ``p99_error_pct``, ``bottleneck_match`` (1/0,
first shape, 1 only when every trial matched), the real and simulated means, and the largest
single-trial errors (``max_trial_speed_error_pct``, ``max_trial_p99_error_pct``). Needs root
and writable cgroups.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from reamer.backends.local.inference import load_schedule_args
from reamer.backends.local.session import local_services, sigterm_as_interrupt, unavailable
from reamer.config.local import LocalScenario, load_local
from reamer.models.inference import simulate_replica
from reamer.models.profiles import Profiles, load_profiles
from reamer.reports.local import phases
from reamer.reports.results import document, run_entry, write_json
from reamer.runtime import RoundRecord, simulate
from reamer.runtime.local import LocalRun, run_scenario
from reamer.workloads.real.loadgen import schedule_of

console = Console(stderr=True)
MAX_DRIFT = 0.15  # validity rules: calibrations before and after at most this far apart (per-sample time) ...
MAX_STEAL_PCT = 0.1  # ... and at most this share of any CPU's time stolen during the attempt


class StealMonitor:
    """Samples the kernel's per-CPU steal time (``/proc/stat``: time the hypervisor ran something
    else while this VM wanted the CPU) in a thread, so each load window's share of stolen CPU
    time can be set beside its p99: a VM's neighbours are noise neither model predicts."""

    def __init__(self, period_s: float = 0.5, stat: Path = Path("/proc/stat")):
        import threading
        import time

        self.stat, self.period_s = stat, period_s
        self.samples: list[tuple[float, dict[int, tuple[int, int]]]] = []  # (t, cpu → (steal, total) ticks)
        self.now = time.monotonic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="steal-monitor")

    def _read(self) -> dict[int, tuple[int, int]]:
        out = {}
        for line in self.stat.read_text().splitlines():
            f = line.split()
            if f and f[0].startswith("cpu") and f[0][3:].isdigit():
                ticks = [int(x) for x in f[1:]]
                out[int(f[0][3:])] = (ticks[7] if len(ticks) > 7 else 0, sum(ticks[:8]))
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((self.now(), self._read()))
            self._stop.wait(self.period_s)

    def __enter__(self) -> StealMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def steal_pct(self, t0: float, t1: float) -> dict[int, float]:
        """Per CPU: stolen share (%) of the time between the samples nearest ``t0`` and ``t1``."""
        if len(self.samples) < 2:
            return {}
        a = min(self.samples, key=lambda x: abs(x[0] - t0))[1]
        b = min(self.samples, key=lambda x: abs(x[0] - t1))[1]
        return {c: round(100.0 * (b[c][0] - a[c][0]) / max(1, b[c][1] - a[c][1]), 2) for c in a if c in b}


def sim_training(sc: LocalScenario, prof: Profiles, restart_s: float) -> list[RoundRecord]:
    """The simulated rounds of ``sc``'s training with a reshape costing ``restart_s``: those
    with a measurement, as the real side has them (speed 0 = paused for a restart)."""
    rounds: list[RoundRecord] = []

    def keep(r: RoundRecord) -> None:
        if r.speeds:
            rounds.append(dataclasses.replace(r, speeds={j: v for j, v in r.speeds.items() if v > 0}))

    simulate(sc.as_simulation(restart_s), jobs=sc.training_jobs(), profiles=prof, on_round=keep)
    return rounds


def with_service(prof: Profiles, model: str, entries: list[dict], max_batch: int) -> Profiles:
    """The profile with ``model``'s inference entry from ``entries`` (measured before and after
    the real run: the VM's speed drifts, together they bracket the run): the mean of the
    model's service-time fit, and the serving path fitted once to all their load
    measurements (``calibration.serving.fit_path``; averaging two fits' ``request_ms`` and
    ``delay_ms`` would not give a fit: the two trade off)."""
    from reamer.calibration.serving import fit_path
    from reamer.models.profiles import InferenceEntry, inference_profile

    model_keys = ("a_ms", "b_ms", "parallel_fraction")
    entry = {**entries[0], **{k: statistics.fmean(e[k] for e in entries) for k in model_keys}}
    measured = [x for e in entries for x in e["serving"]["loads"]]
    loads = [(x["rate_per_s"], x["p50_ms"] / 1e3, x["p99_ms"] / 1e3) for x in measured]
    replay = all("load_args" in x for x in measured)  # calibrations from before the field: a seeded sample
    fit = fit_path(entry, loads, max_batch,
                   schedules=[np.asarray(schedule_of(x["load_args"])) for x in measured] if replay else None)
    entry.update(request_ms=fit["request_ms"], delay_ms=fit["delay_ms"])
    console.print(f"  serving path over both calibrations: request {fit['request_ms']} ms, delay {fit['delay_ms']} ms "
                  f"({fit['rms_err_pct']}% RMS on the p99s)")
    measured = {**prof.inference, model: inference_profile(model, InferenceEntry.model_validate(entry))}
    return dataclasses.replace(prof, inference=measured)


def calibrate_service(model: str) -> dict:
    """``model``'s inference entry measured now: ONNX Runtime fit at 1 and 2 cores, then the
    serving path through the real server."""
    import tempfile

    from reamer.calibration import inference, serving
    from reamer.calibration.worker import open_cgroups

    ex, reason = open_cgroups()
    if ex is None:
        raise SystemExit(f"sim_vs_real: {reason}")
    try:
        with tempfile.TemporaryDirectory(prefix="reamer-svr-") as tmp:
            console.print(f"calibrating {model} (service time, serving path) …")
            apparatus = os.sched_getaffinity(0)
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))  # the model's fit runs in this process: on every CPU
            try:
                entry = inference.measure(model, [1, 2] if (os.cpu_count() or 1) >= 2 else [1], True, Path(tmp),
                                          lambda: None)
            finally:
                os.sched_setaffinity(0, apparatus)
            entry.update(serving.measure(ex, model, entry, os.cpu_count() or 1, 200, Path(tmp), lambda: None,
                                         load_s=45.0))  # p99 from ~1,700 and ~3,500 requests
    finally:
        ex.sweep()
    console.print(f"  {model}: a {entry['a_ms']} ms, b {entry['b_ms']} ms, f {entry['parallel_fraction']}, "
                  f"request {entry['request_ms']} ms, delay {entry['delay_ms']} ms")
    return entry


def server_side(replicas: dict[str, dict[str, float]], load_report: dict, entries: list[dict],
                rate: float | None) -> dict[str, float]:
    """What the replica measured itself (its ``/metrics`` at the end of the run), to tell a
    miss's causes apart: ``real_server_run_ms_per_batch`` (ONNX Runtime time per batch) over
    what the calibrations' fit gives at the run's mean batch (``real_model_time_ratio``; the
    server's request threads share its core, so this is > 1 in the calibrations' own loads
    too) and over the calibrations' in-server time at the run's rate
    (``real_server_run_time_ratio``: > 1 = the model ran slower in the run than when
    calibrated: the machine's speed, or training next to it), and the mean latency inside the
    server (queue, batch, run) beside the client's (the rest is the path: HTTP, the load
    generator)."""
    from reamer.workloads.real.serving_metrics import served_stats

    if len(replicas) != 1:
        return {}
    st = served_stats(*replicas.values())
    if st["batches"] <= 0:
        return {}
    nbar = st["batch_mean"]
    out = {"real_server_run_ms_per_batch": st["run_ms_per_batch"], "real_server_batch_mean": nbar,
           "real_server_latency_ms": st["latency_ms"]}
    mean = load_report.get("latency_ms", {}).get("mean")
    if mean is not None:
        out["real_client_latency_ms"] = float(mean)
    if entries:
        pred = statistics.fmean(e["a_ms"] + e["b_ms"] * nbar for e in entries)
        out["calib_run_ms_per_batch"] = pred
        out["real_model_time_ratio"] = out["real_server_run_ms_per_batch"] / pred
    inside = []  # the calibrations' own in-server time per batch, at the run's rate (linear in rate between loads)
    for e in entries:
        pts = sorted((x["rate_per_s"], x["server_run_ms_per_batch"]) for x in e["serving"]["loads"]
                     if "server_run_ms_per_batch" in x)
        if pts and rate is not None:
            inside.append(float(np.interp(rate, [p[0] for p in pts], [p[1] for p in pts])))
    if inside:
        out["calib_server_run_ms_per_batch"] = statistics.fmean(inside)
        out["real_server_run_time_ratio"] = out["real_server_run_ms_per_batch"] / out["calib_server_run_ms_per_batch"]
    return out


def pct_err(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return 100.0 * abs(sim - real) / real


@dataclass
class Trial:
    """One real run between two calibrations of the served model (the one after it is the
    next trial's one before), and whether it was a valid comparison."""

    attempt: int
    real: LocalRun
    before: dict | None
    after: dict | None
    stolen: float  # most CPU steal on any CPU from the start of ``before`` to the end of ``after`` (%)
    why: list[str]

    @property
    def drift(self) -> float | None:
        """The two calibrations' per-sample times apart (share of their mean)."""
        if self.before is None or self.after is None:
            return None
        b0, b1 = self.before["b_ms"], self.after["b_ms"]
        return abs(b1 - b0) / statistics.fmean([b0, b1])


def compare(sc: LocalScenario, prof: Profiles, a: argparse.Namespace, host: str, t: Trial,
            steal: StealMonitor) -> dict:
    """One trial, simulated with its own calibrations and restart time, beside what it measured:
    metrics (as in the output's top level), labels, per-window series and both sides' phases."""
    svc = sc.services[0] if sc.services else None
    if t.before is not None:
        prof = with_service(prof, svc.model, [t.before, t.after], a.max_batch)
    real = t.real
    restart = statistics.fmean(real.result.restarts_s) if real.result.restarts_s else 0.0
    console.print(f"simulated run {t.attempt} (restart_s = {restart:.1f} s, measured) …")
    sim_rounds = sim_training(sc, prof, restart)

    job = sc.jobs[0].id
    rp, sp = phases(real.result.rounds, job), phases(sim_rounds, job)
    m: dict[str, float] = {"restart_s": restart}
    for side, ph in (("real", rp), ("sim", sp)):
        for i, p in enumerate(ph[:2]):
            tag = "" if i == 0 else "_after"
            m[f"{side}_speed{tag}_per_s"] = p["speed"] if p["speed"] is not None else float("nan")
            m[f"{side}_ps{tag}"] = p["ps"]
        m[f"{side}_ps_added"] = float(any(p["ps"] > ph[0]["ps"] for p in ph)) if ph else 0.0
    e0 = pct_err(sp[0]["speed"] if sp else None, rp[0]["speed"] if rp else None)
    if e0 is not None:
        m["speed_error_pct"] = e0
    if len(rp) > 1 and len(sp) > 1 and rp[1]["ps"] == sp[1]["ps"]:
        e1 = pct_err(sp[1]["speed"], rp[1]["speed"])
        if e1 is not None:
            m["speed_error_after_pct"] = e1
    bm = rp and sp and rp[0]["bottleneck"] == sp[0]["bottleneck"]
    m["bottleneck_match"] = 1.0 if bm else 0.0
    labels = {"real_bottleneck": rp[0]["bottleneck"] if rp else None, "sim_bottleneck": sp[0]["bottleneck"] if sp else None}

    series: dict[str, list] = {}
    if svc is not None:
        rep = real.load_reports.get(svc.id, {})
        real_p99 = rep.get("latency_ms", {}).get("p99")
        sim_node = f"{host}-0000"  # build_nodes names a pool's nodes POOL-0000, ...
        node_cpu = [r.node_cpu.get(sim_node, 0.0) for r in sim_rounds] or [0.0]
        node = next(h for h in sc.hosts if h.name == host)
        coef = prof.interference.inference if prof.interference is not None else 0.0
        slow = 1.0 + coef * statistics.fmean(node_cpu) / node.cores
        # the very arrival times the real load generator sent (same options, same seed): the p99 of
        # ~8,000 requests moves by 4-16 % between Poisson samples (docs/results.md)
        arr = np.asarray(schedule_of(load_schedule_args(next(x for x in local_services(sc) if x.id == svc.id), sc.seed)))
        lat = simulate_replica(arr, prof.inference[svc.model], a.replica_cores, a.max_batch, a.max_wait_ms / 1e3, slow)
        sim_p99 = float(np.percentile(lat, 99)) * 1e3
        win = np.floor(np.asarray(arr) / svc.window_s).astype(int)  # by arrival window (real: by completion)
        sim_w = [float(np.percentile(lat[win == k], 99)) * 1e3 if np.any(win == k) else None
                 for k in range(len(svc.rates))]
        wins = real.services.get(svc.id, [])
        real_w = [w.get("p99_ms") for w in wins]
        steal_w = [steal.steal_pct(w["received_s"] - svc.window_s, w["received_s"]) for w in wins if "received_s" in w]
        series.update(real_window_p99_ms=real_w, sim_window_p99_ms=sim_w, real_window_steal_pct=steal_w)
        console.print(f"  CPU steal per window (%): {steal_w}")
        console.print(f"  p99 per window (ms), real: {real_w}")
        console.print(f"  p99 per window (ms), sim:  {[None if v is None else round(v, 1) for v in sim_w]}")
        series["real_training_cpu"] = [[round(r.t, 1), {k: round(v, 3) for k, v in r.node_cpu.items()}]
                                       for r in real.result.rounds]
        series["sim_training_cpu"] = [[round(r.t, 1), {k: round(v, 3) for k, v in r.node_cpu.items()}] for r in sim_rounds]
        if t.before is not None:
            for tag, e in (("before", t.before), ("after", t.after)):
                m[f"calib_{tag}_b_ms"], m[f"calib_{tag}_request_ms"] = e["b_ms"], e["request_ms"]
            m["calib_drift_pct"] = 100.0 * t.drift
        m.update({"real_p99_ms": real_p99 if real_p99 is not None else float("nan"), "sim_p99_ms": sim_p99,
                  "sim_inference_slowdown_ratio": slow, "real_requests": float(rep.get("ok", 0)),
                  "real_errors": float(sum(rep.get("errors", {}).values())),
                  "real_late_dispatches": float(rep.get("late_dispatches", 0))})
        e = pct_err(sim_p99, real_p99)
        if e is not None:
            m["p99_error_pct"] = e
        m.update(server_side(real.replica_metrics, rep, [t.before, t.after] if t.before is not None else [],
                             statistics.fmean(svc.rates)))
    m["cpu_steal_pct"] = t.stolen
    console.print(f"  trial {t.attempt}: speed {m.get('real_speed_per_s', float('nan')):.1f} real / "
                  f"{m.get('sim_speed_per_s', float('nan')):.1f} sim; p99 {m.get('real_p99_ms', float('nan')):.1f} real / "
                  f"{m.get('sim_p99_ms', float('nan')):.1f} sim", highlight=False)
    return {"metrics": m, "labels": labels, "series": series, "real_phases": rp, "sim_phases": sp}


MEANS = ("real_speed_per_s", "sim_speed_per_s", "real_speed_after_per_s", "sim_speed_after_per_s",
         "real_p99_ms", "sim_p99_ms")  # averaged over the trials the verdict uses


def verdict(done: list[dict]) -> dict[str, float]:
    """The top-level metrics over ``done`` (the valid trials): each real and simulated value is
    the mean over the trials, and each error compares the two means; the bottleneck matches
    only when it matched in every trial."""
    m: dict[str, float] = {}
    for k in MEANS:
        vals = [d["metrics"][k] for d in done if k in d["metrics"] and d["metrics"][k] == d["metrics"][k]]
        if len(vals) == len(done) and vals:
            m[k] = statistics.fmean(vals)
    for err, real, sim in (("speed_error_pct", "real_speed_per_s", "sim_speed_per_s"),
                           ("speed_error_after_pct", "real_speed_after_per_s", "sim_speed_after_per_s"),
                           ("p99_error_pct", "real_p99_ms", "sim_p99_ms")):
        if all(err in d["metrics"] for d in done) and real in m and sim in m:
            m[err] = pct_err(m[sim], m[real])
    m["bottleneck_match"] = 1.0 if all(d["metrics"]["bottleneck_match"] == 1.0 for d in done) else 0.0
    for k in ("speed_error_pct", "p99_error_pct"):  # the spread a single trial would have shown
        vals = [d["metrics"][k] for d in done if k in d["metrics"]]
        if vals:
            m[f"max_trial_{k}"] = max(vals)
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--scenario", type=Path, default=None, help="local scenario YAML (default: the embedded one)")
    ap.add_argument("--profiles", type=Path, default=None, help="calibrated profile (default: the shipped one)")
    ap.add_argument("--replica-cores", type=float, default=1.0)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-wait-ms", type=float, default=0.0)
    ap.add_argument("--replica-cpus", default=None, help="pin the replica to these CPUs, e.g. 1 (default: its node's)")
    ap.add_argument("--exclusive-replica-cpus", action="store_true",
                    help="the training containers on the replica's host keep off --replica-cpus (default: they share "
                         "all the host's CPUs, and a worker's compute bursts on the replica's CPU take half of it)")
    ap.add_argument("--apparatus-cpus", default=None,
                    help="pin this controller and the load generator to these CPUs, e.g. 0")
    ap.add_argument("--max-drift", type=float, default=MAX_DRIFT,
                    help="a trial whose calibrations before and after differ by more than this share (per-sample time) "
                         "is not a valid comparison")
    ap.add_argument("--max-steal-pct", type=float, default=MAX_STEAL_PCT,
                    help="a trial during which the hypervisor took more than this share of any CPU's time "
                         "(/proc/stat steal) is not a valid comparison: p99 is the slowest 1%% of requests, and about "
                         "this share of all requests arrive into a stall, so it must stay well below 1%% (a tenth of it: "
                         "one 10 s window with 6%% steal had a p99 of 122 ms and set the run's to 56 ms against a "
                         "simulated 34 ms, while the run's steal averaged 0.4%%)")
    ap.add_argument("--trials", type=int, default=3,
                    help="valid trials to average (the same replica alone at the same load ranged 33.7-42.6 ms "
                         "between 45 s windows on this VM: one run cannot resolve 15%%)")
    ap.add_argument("--tries", type=int, default=None,
                    help="real runs at most (default: twice --trials); with fewer valid trials the verdict uses those, "
                         "with none every run")
    ap.add_argument("--no-calibrate", action="store_true",
                    help="use the profile's service time as is (default: measure the served model's service time "
                         "and serving path before the first run and after every run: this VM's speed drifts by tens "
                         "of percent)")
    ap.add_argument("--rate", type=float, default=None,
                    help="requests/s in every window instead of the scenario's trace (same number of windows)")
    a = ap.parse_args()
    if a.trials < 1:
        print(f"sim_vs_real: --trials: expected >= 1, got {a.trials}", file=sys.stderr)
        return 2
    tries = a.tries if a.tries is not None else 2 * a.trials
    if tries < a.trials:
        print(f"sim_vs_real: --tries: expected >= --trials ({a.trials}), got {tries}", file=sys.stderr)
        return 2
    reason = unavailable()
    if reason is not None:
        print(f"sim_vs_real: skipped: {reason}", file=sys.stderr)
        return 2
    sc = load_local(a.scenario)
    if a.rate is not None and sc.services:
        s0 = sc.services[0]
        sc = sc.model_copy(update={"services": [s0.model_copy(update={"rates": [a.rate] * len(s0.rates)}),
                                                *sc.services[1:]]})
    prof = load_profiles(a.profiles)
    svc = sc.services[0] if sc.services else None
    if svc is not None and svc.model not in prof.inference:
        print(f"sim_vs_real: {a.profiles or 'shipped profile'}: no inference profile for {svc.model} "
              "(run: reamer calibrate)", file=sys.stderr)
        return 2
    host = max(sc.hosts, key=lambda h: h.cores).name
    fixed = [(svc.id, host, a.replica_cores, a.max_batch, a.max_wait_ms / 1e3)] if svc else None
    cpus = lambda v: [int(x) for x in v.split(",")] if v else None  # noqa: E731
    if a.exclusive_replica_cpus:
        if not a.replica_cpus:
            print("sim_vs_real: --exclusive-replica-cpus needs --replica-cpus", file=sys.stderr)
            return 2
        own = set(cpus(a.replica_cpus))
        hosts = [h.model_copy(update={"cpus": [c for c in (h.cpus or range(os.cpu_count() or 1)) if c not in own]})
                 if h.name == host else h for h in sc.hosts]
        sc = sc.model_copy(update={"hosts": hosts})
    if a.apparatus_cpus:  # the calibrations' load generator runs where the run's does
        os.sched_setaffinity(0, set(cpus(a.apparatus_cpus)))
    calibrate = svc is not None and not a.no_calibrate
    trials: list[Trial] = []
    failed: list[dict] = []  # runs that could not be compared (no calibration after them)
    with StealMonitor() as steal:
        before, t_before = None, steal.now()
        for attempt in range(1, tries + 1):
            if calibrate and before is None:
                t_before = steal.now()
                before = calibrate_service(svc.model)
            console.print(f"real run {attempt} (valid so far: {sum(not t.why for t in trials)} of {a.trials}) …")
            real = run_scenario(sc, prof, fixed_replicas=fixed, replica_cpus=cpus(a.replica_cpus),
                                apparatus_cpus=cpus(a.apparatus_cpus),
                                on_round=lambda r: console.print(f"  t={r.t:5.1f} {r.speeds} {r.bottlenecks} "
                                                                 f"{r.shapes}", highlight=False))
            after = None
            t_run_end = t_after = steal.now()
            if calibrate:
                try:
                    after = calibrate_service(svc.model)
                except RuntimeError as e:  # measurements that contradict each other: the machine changed speed
                    console.print(f"calibration after run {attempt} failed ({e}): not a valid comparison")
                    failed.append({"attempt": attempt, "why_not": f"calibration after the run failed: {e}"})
                    before = None  # the next run calibrates anew
                    continue
                t_after = steal.now()
            stolen = max(steal.steal_pct(t_before, t_after).values(), default=0.0)
            t = Trial(attempt, real, before, after, stolen, [])
            if t.drift is not None and t.drift > a.max_drift:
                t.why.append(f"the machine's speed drifted {100 * t.drift:.0f}% (calibrations before and after)")
            if stolen > a.max_steal_pct:
                t.why.append(f"the hypervisor took {stolen:.2f}% of a CPU's time (steal)")
            trials.append(t)
            console.print(f"run {attempt}: {'valid' if not t.why else 'not a valid comparison: ' + '; '.join(t.why)}")
            before, t_before = after, t_run_end  # this run's calibration after is the next one's before
            if sum(not t.why for t in trials) >= a.trials:
                break
        if not trials:
            print("sim_vs_real: every calibration after a run failed: no trial to compare", file=sys.stderr)
            return 1
        results = [compare(sc, prof, a, host, t, steal) for t in trials]

    valid = [r for t, r in zip(trials, results, strict=True) if not t.why]
    used = valid or results  # no valid trial: every run, and the output says so (trials_valid 0)
    m = verdict(used)
    m.update(trials_valid=float(len(valid)), trials_run=float(len(trials)), trials_used=float(len(used)))
    labels = {k: "/".join(sorted({str(r["labels"][k]) for r in used})) for k in ("real_bottleneck", "sim_bottleneck")}
    ratios = {k: m[k] for k in ("speed_error_pct", "speed_error_after_pct", "p99_error_pct", "bottleneck_match")
              if k in m}
    entry = run_entry(sc.name, sc.seed, f"{sc.policy.training} real vs sim", m,
                      {"replica_cores": a.replica_cores, "max_batch": a.max_batch, "replica_cpus": a.replica_cpus,
                       "apparatus_cpus": a.apparatus_cpus, "exclusive_replica_cpus": a.exclusive_replica_cpus,
                       "max_steal_pct": a.max_steal_pct, "max_drift": a.max_drift, "max_wait_ms": a.max_wait_ms,
                       "trials": a.trials, "tries": tries, "host": host, **labels})
    entry["trials"] = [{"attempt": t.attempt, "valid": not t.why, "why_not": "; ".join(t.why), **r,
                        "calibrations": {"before": t.before, "after": t.after}}  # the served model's, as measured
                       for t, r in zip(trials, results, strict=True)] + failed
    doc = document("sim_vs_real", [entry], ratios)
    write_json(a.json, doc)
    print(json.dumps({"metrics": m, **labels,
                      "trials": [{"attempt": t.attempt, "valid": not t.why, **{k: r["metrics"].get(k) for k in (
                          "real_speed_per_s", "sim_speed_per_s", "real_p99_ms", "sim_p99_ms", "p99_error_pct")}}
                                 for t, r in zip(trials, results, strict=True)]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    with sigterm_as_interrupt():  # SIGTERM, like Ctrl-C, still removes the run's cgroups and namespaces
        sys.exit(main())
