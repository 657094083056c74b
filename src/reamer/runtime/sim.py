"""The simulated run: the event loop advances the clock over the simulator's backends; each
batch of events at one instant (and each control interval) runs one control round —
:func:`reamer.control.control_round`, or, with inference harvested,
:func:`reamer.control.joint_round` (at the start of each SLO window, and between windows
whenever training is about to take cores a replica holds): training decides, inference moves
first, then training takes its cores, exactly as a real run's every round
(``inference.coordination: none``: the two loops on their own, each deciding on the state it
measured — the harvest round, then training's — so the harvester learns of a growth only at
its next window).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from reamer.backends.sim.cluster import SimCluster
from reamer.backends.sim.engine import Ev, EventQueue
from reamer.backends.sim.inference import SimInference
from reamer.config.scenario import Scenario
from reamer.control import HarvestPolicy, Policy, Round, control_round, harvest_round, joint_round
from reamer.domain import JobState, Node, Resources, TrainingJob
from reamer.models.profiles import Interference, Profiles, shipped_profiles
from reamer.models.training import Calibration
from reamer.runtime.policies import harvest_policy, training_policy
from reamer.runtime.rounds import RoundHook, record, thresholds_of
from reamer.workloads import build_jobs, build_nodes
from reamer.workloads.need import need_scale

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    model: str
    arrival_s: float
    start_s: float
    end_s: float
    queue_s: float
    samples: float
    reconfigs: int

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s

    @property
    def speed(self) -> float:
        """Mean training speed while running (samples/s)."""
        run = self.jct_s - self.queue_s
        return self.samples / run if run > 0 else math.inf


@dataclass
class RunResult:
    scenario: str
    policy: str
    seed: int
    jobs: list[JobRecord]
    unfinished: int
    metrics: dict[str, float]
    series: dict[str, list[float]] = field(default_factory=dict)
    timelines: dict[str, list[tuple[float, int, int, float]]] = field(default_factory=dict)
    inference_series: dict[str, list[float]] = field(default_factory=dict)  # per SLO window ("slo_ms:*": one value)
    # model (or "PS") -> (cores the parallel fraction used for its workers (its PS containers) was
    # measured up to, the most cores one of them got)
    extrapolated: dict[str, tuple[float, float]] = field(default_factory=dict)
    samples_trained: float = 0.0  # by every job, finished or not, until the run's end (its horizon)


COMPACT_AT = 4096  # queued events beyond twice the live ones before the superseded are dropped (bounds memory)
SERIES_KEYS = ("t", "queue", "running", "cpu_used_pct", "gpu_used_pct", "cpu_alloc_pct", "gpu_alloc_pct")


def _warn_oversized(jobs: Sequence[TrainingJob], nodes: Sequence[Node]) -> None:
    """Log the jobs whose PS or worker request fits no node it may use: they wait until a
    policy shrinks them (``static`` never does), as a pod that fits no node stays Pending."""
    shapes: dict[frozenset[str] | None, set[tuple[float, float, float]]] = {
        None: {(n.cores, n.mem_mib, n.gpus) for n in nodes}}
    fits: dict[tuple[Resources, frozenset[str] | None], bool] = {}
    bad = []
    for j in jobs:
        for res, allowed in ((j.ps_res, j.ps_nodes), (j.worker_res, j.worker_nodes)):
            ok = fits.get((res, allowed))
            if ok is None:
                if allowed not in shapes:
                    shapes[allowed] = {(n.cores, n.mem_mib, n.gpus) for n in nodes if n.name in allowed}
                ok = fits[res, allowed] = any(res.cpu <= c + 1e-9 and res.mem_mib <= m + 1e-9 and res.gpu <= g + 1e-9
                                              for c, m, g in shapes[allowed])  # the placement's tolerance
            if not ok:
                bad.append((j.id, res))
                break
    if bad:
        jid, res = bad[0]
        log.warning("%d of %d jobs request a container that fits no node they may use (first: %s, %g cores, "
                    "%g MiB, %g GPUs); they start only under a policy that shrinks them", len(bad), len(jobs), jid,
                    res.cpu, res.mem_mib, res.gpu)


def simulate(
    sc: Scenario,
    policy: str | Policy | None = None,
    cal: Calibration | None = None,
    progress: Callable[[int, int], None] | None = None,
    jobs: list[TrainingJob] | None = None,
    track: int = 0,
    harvest: str | HarvestPolicy | None = None,
    profiles: Profiles | None = None,
    on_round: RoundHook | None = None,
) -> RunResult:
    """Run one scenario under one training policy (default: its ``policy.training``).
    Deterministic for ``sc.seed``.

    With an ``inference:`` section, inference services are harvested from the GPU training
    nodes by ``harvest`` (a harvesting policy name or object; default: the scenario's
    ``policy.harvest``), in a joint round at the start of every SLO window
    (:mod:`reamer.backends.sim.inference`); the run's metrics gain the co-location keys and
    its policy name becomes ``TRAINING+HARVEST`` (e.g. ``static+reamer``).

    ``progress(done, total)`` is called as jobs finish; ``track`` keeps allocation timelines
    (time, PS, workers, cores) of that many jobs (the first to arrive) for the report;
    ``on_round`` receives a :class:`~reamer.runtime.rounds.RoundRecord` of every round.

    ``profiles`` (default: the shipped calibrated profile, :func:`reamer.models.profiles.load_profiles`)
    gives the machine constants (unless ``cal`` is passed), the training models (measured ones
    merged over the zoo), the inference service-time profiles and the interference coefficients
    (used where the scenario's ``inference:`` section does not set them).
    """
    wall0 = time.perf_counter()
    prof = profiles if profiles is not None else shipped_profiles()
    cal = cal or prof.calibration
    sc = _with_interference(sc, prof.interference)
    ss = np.random.SeedSequence(sc.seed)
    rng_workload, rng_noise, _ = (np.random.default_rng(s) for s in ss.spawn(3))
    nodes = build_nodes(sc)
    if jobs is None:
        jobs = build_jobs(sc, nodes, cal, rng_workload, prof.models)
    _warn_oversized(jobs, nodes)
    if policy is None or isinstance(policy, str):
        policy = training_policy(sc.policy, sc.source, policy)
    th = thresholds_of(policy)

    q = EventQueue()
    cluster = SimCluster(nodes, cal, rng_noise, lambda jid, t, v: q.push(t, Ev.COMPLETION, (jid, v)),
                         sc.policy.telemetry_noise_pct, policy.interval_s, sc.cluster.restart_s, prof.models)
    for spec in jobs:
        q.push(spec.arrival_s, Ev.ARRIVAL, spec)
    inf: SimInference | None = None
    hpolicy: HarvestPolicy | None = None
    if sc.inference is not None:
        inf = SimInference(sc, cluster, np.random.default_rng(ss.spawn(1)[0]), profiles=prof.inference,
                           need_scale=need_scale(sc.inference.need_scale, jobs, prof.models))
        hpolicy = harvest if harvest is not None and not isinstance(harvest, str) else harvest_policy(
            sc.policy, sc.source, prof.inference, sc.inference.interval_s, harvest)
        q.push(0.0, Ev.HARVEST)
    elif harvest is not None:
        raise ValueError("a harvesting policy needs a scenario with an inference: section")
    harvest_rounds = 0
    if policy.interval_s:
        q.push(policy.interval_s, Ev.TICK)
    pending = len(jobs)
    finished = 0
    rounds = 0
    series: dict[str, list[float]] = {k: [] for k in SERIES_KEYS}
    tracked = {s.id for s in jobs[:track]}
    timelines: dict[str, list[tuple[float, int, int, float]]] = {j: [] for j in tracked}
    horizon = sc.horizon_s or math.inf

    def live(kind: Ev, payload: object) -> bool:
        return kind is not Ev.COMPLETION or cluster.due(*payload)

    while q:
        # (a re-timing queues the job's new completion and leaves the old one: once the queue
        # holds more superseded events than live ones, they go)
        if len(q) > COMPACT_AT + 2 * (pending + len(cluster.state.running)):
            q.compact(live, horizon)
        now = q.peek_time()
        if now > horizon:
            break
        run_round = tick = window = False
        while q and q.peek_time() == now:
            _, kind, payload = q.pop()
            if kind is Ev.ARRIVAL:
                cluster.arrive(payload, now)
                pending -= 1
                run_round = True
            elif kind is Ev.COMPLETION:
                if cluster.complete(payload[0], payload[1], now):
                    finished += 1
                    run_round = True
                    if progress:
                        progress(finished, len(jobs))
            elif kind is Ev.HARVEST:
                window = True
            else:
                tick = run_round = True
        if not (run_round or window):
            continue
        hrnd: Round | None = None
        if inf is not None and hpolicy is not None and inf.sec.coordination == "joint":
            # inference moves before training takes cores: at each window, and between windows
            # whenever training is about to take cores a replica holds (a job's start)
            rnd, hrnd = joint_round(cluster, policy, inf, hpolicy, now, harvest_if=None if window else inf.crowded_by)
            harvest_rounds += hrnd is not None
        elif window and inf is not None and hpolicy is not None:  # each loop on its own, on what it measured
            hrnd = harvest_round(inf, hpolicy, now)  # before training's decisions of this instant
            rnd = control_round(cluster, policy, now)
            harvest_rounds += 1
        else:
            rnd = control_round(cluster, policy, now)
        rounds += 1
        if on_round is not None:
            on_round(record(rnd, hrnd, th))
        _record(series, cluster, now)
        for jid in tracked:
            _timeline(timelines[jid], cluster, jid, now)
        if tick:
            idle = not cluster.state.running and not pending
            if not (idle and (not cluster.state.queue or not rnd.decisions)):
                q.push(now + policy.interval_s, Ev.TICK)
        if inf is not None:
            inf.update_contention(now)  # training changed: re-check over-committed nodes
            if window and hrnd is not None:
                inf.vary_need(now)  # training's need for the coming window (metrics lag by one)
                inf.update_contention(now)
                inf.serve(now)
                if inf.window(now) + 1 < inf.windows:
                    q.push(now + inf.interval_s, Ev.HARVEST)

    if inf is not None:  # co-location runs last their SLO windows (or the horizon)
        cluster.integrate(min(horizon, inf.windows * inf.interval_s))
    cluster.integrate(max((j.finished_s or 0.0) for j in cluster.state.jobs.values()) if cluster.jobs else 0.0)
    records = [
        JobRecord(j.rec.spec.id, j.rec.spec.model, j.rec.spec.arrival_s, j.rec.started_s, j.rec.finished_s,
                  j.rec.queue_s, j.rec.spec.samples if j.rec.spec.duration_s is None else j.done, j.rec.reconfigs)
        for j in cluster.jobs.values()
        if j.rec.state is JobState.DONE
    ]
    unfinished = len(jobs) - len(records)
    metrics = _metrics(records, cluster, q.popped, rounds, unfinished)
    name = policy.name
    inf_series: dict[str, list[float]] = {}
    if inf is not None and hpolicy is not None:
        metrics.update(inf.metrics())
        metrics["harvest_rounds"] = harvest_rounds
        name = f"{policy.name}+{hpolicy.name}"
        inf_series = inf.series
    trained = cluster.samples_trained(horizon if math.isfinite(horizon) else cluster.totals.t)
    metrics["wall_s"] = time.perf_counter() - wall0
    log.info("simulated %s under %s", sc.name, name, extra={"seed": sc.seed, "jobs": len(records),
                                                           "unfinished": unfinished, "wall_s": round(metrics["wall_s"], 3)})
    return RunResult(sc.name, name, sc.seed, records, unfinished, metrics, series, timelines, inf_series,
                     dict(cluster.extrapolated), trained)


def _with_interference(sc: Scenario, inter: Interference | None) -> Scenario:
    """The profile's interference coefficients where the scenario's inference section leaves them unset."""
    sec = sc.inference
    if sec is None or inter is None:
        return sc
    update = {k: v for k, v in (("training_interference", inter.training), ("inference_interference", inter.inference))
              if k not in sec.model_fields_set}  # fmt: skip
    return sc.model_copy(update={"inference": sec.model_copy(update=update)}) if update else sc


def _record(series: dict[str, list[float]], c: SimCluster, now: float) -> None:
    series["t"].append(now)
    series["queue"].append(len(c.state.queue))
    series["running"].append(len(c.state.running))
    series["cpu_used_pct"].append(100.0 * c.cpu_used / c.cap_cpu)
    series["gpu_used_pct"].append(100.0 * c.gpu_used / c.cap_gpu if c.cap_gpu else 0.0)
    series["cpu_alloc_pct"].append(100.0 * c.state.cpu_alloc / c.cap_cpu)
    series["gpu_alloc_pct"].append(100.0 * c.state.gpu_alloc / c.cap_gpu if c.cap_gpu else 0.0)


def _timeline(tl: list, c: SimCluster, jid: str, now: float) -> None:
    j = c.state.jobs.get(jid)
    if j is None:
        return
    ps = sum(1 for x in j.containers.values() if x.role.value == "ps")
    workers = len(j.containers) - ps
    cores = sum(x.res.cpu for x in j.containers.values())
    point = (now, ps, workers, cores)
    if not tl or tl[-1][1:] != point[1:]:
        tl.append(point)


def _metrics(records: list[JobRecord], c: SimCluster, events: int, rounds: int, unfinished: int) -> dict[str, float]:
    jct = np.array([r.jct_s for r in records]) if records else np.array([math.nan])
    queue = np.array([r.queue_s for r in records]) if records else np.array([math.nan])
    speed = np.array([r.speed for r in records]) if records else np.array([math.nan])
    start = min((r.arrival_s for r in records), default=0.0)
    end = max((r.end_s for r in records), default=0.0)
    span = max(c.totals.t, 1e-9)
    return {
        "jobs": len(records),
        "unfinished": unfinished,
        "mean_jct_s": float(jct.mean()),
        "p50_jct_s": float(np.percentile(jct, 50)),
        "p95_jct_s": float(np.percentile(jct, 95)),
        "mean_queue_s": float(queue.mean()),
        "mean_speed_samples_per_s": float(speed.mean()),
        "makespan_s": end - start,
        "cpu_util_pct": 100.0 * c.totals.cpu_used_s / (c.cap_cpu * span),
        "gpu_util_pct": 100.0 * c.totals.gpu_used_s / (c.cap_gpu * span) if c.cap_gpu else 0.0,
        "cpu_alloc_pct": 100.0 * c.totals.cpu_alloc_s / (c.cap_cpu * span),
        "gpu_alloc_pct": 100.0 * c.totals.gpu_alloc_s / (c.cap_gpu * span) if c.cap_gpu else 0.0,
        "reconfigurations": float(sum(r.reconfigs for r in records)),
        "events": events,
        "rounds": rounds,
        "retimings": c.retimings,
        "job_intervals": c.job_intervals,
    }
