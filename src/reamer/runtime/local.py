"""A real run: the wall-clock loop over the local backends. Every ``interval_s`` one round
runs — :func:`reamer.control.joint_round` when inference is harvested (inference moves
before training takes its cores), else :func:`reamer.control.control_round` — until every
job is done (and the load has played out) or ``max_s``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reamer.backends.local.cluster import LocalCluster
from reamer.backends.local.session import CGROUP_ROOT, open_session
from reamer.config.local import LocalScenario
from reamer.control import HarvestPolicy, JointHarvestBackend, Policy, control_round, joint_round
from reamer.domain import JobState
from reamer.domain.inference import PlaceReplica
from reamer.models.profiles import Profiles
from reamer.runtime.policies import harvest_policy, training_policy
from reamer.runtime.rounds import RoundHook, RoundRecord, record, thresholds_of

log = logging.getLogger(__name__)


@dataclass
class LocalResult:
    rounds: list[RoundRecord] = field(default_factory=list)
    jct_s: dict[str, float] = field(default_factory=dict)
    restarts_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    unfinished: int = 0
    actuation_errors: list[tuple[float, str, str]] = field(default_factory=list)  # logged, reconciled, not fatal
    failures: list[tuple[float, str, str, int]] = field(default_factory=list)  # (t, job, what died, steps lost)
    failed_jobs: dict[str, str] = field(default_factory=dict)  # job -> why it was given up
    replica_failures: list[tuple[float, str, str]] = field(default_factory=list)  # (t, replica, why)


@dataclass
class LocalRun:
    result: LocalResult
    services: dict[str, list[dict]] = field(default_factory=dict)  # service → loadgen window reports
    load_reports: dict[str, dict] = field(default_factory=dict)  # service → loadgen final report
    replica_metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # replica → its /metrics at the end
    events: list[tuple[float, str, str]] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)  # leftovers of an earlier run removed at start
    recovered: list[str] = field(default_factory=list)  # what became of an unfinished run in the state folder


def run_local(
    cluster: LocalCluster,
    policy: Policy,
    *,
    interval_s: float,
    max_s: float,
    on_round: RoundHook | None = None,
    sleep: Callable[[float], None] = time.sleep,
    harvest: tuple[JointHarvestBackend, HarvestPolicy] | None = None,
    done: Callable[[], bool] | None = None,
) -> LocalResult:
    """Drive ``cluster`` with ``policy`` and, with ``harvest``, inference with its policy in
    the same round. Stops when every job is done (or ``done()`` says so) or after ``max_s``."""
    res = LocalResult()
    th = thresholds_of(policy)
    start = cluster.now()
    next_t = start
    while True:
        now = cluster.now()
        if harvest is None:
            rnd, h = control_round(cluster, policy, now), None
        else:
            rnd, h = joint_round(cluster, policy, harvest[0], harvest[1], now)
        rec = record(rnd, h, th)
        res.rounds.append(rec)
        for d in rec.decisions:
            log.info("decided %s", d, extra={"t": round(now, 3)})
        if on_round is not None:
            on_round(rec)
        if (done() if done is not None else cluster.finished) or now - start >= max_s:
            break
        next_t = max(next_t + interval_s, cluster.now())  # a slow round (a restart) skips ticks
        sleep(max(0.0, next_t - cluster.now()))
    for jid, j in cluster.state.jobs.items():
        if j.state is JobState.DONE and j.finished_s is not None and jid not in cluster.failed_jobs:
            res.jct_s[jid] = j.finished_s - j.spec.arrival_s
    res.restarts_s = list(cluster.restarts_s)
    res.actuation_errors = list(cluster.actuation_errors)
    res.failures, res.failed_jobs = list(cluster.failures), dict(cluster.failed_jobs)
    res.unfinished = len(cluster.pending) + sum(1 for j in cluster.state.jobs.values() if j.state is not JobState.DONE)
    res.wall_s = cluster.now() - start
    return res


def run_scenario(
    sc: LocalScenario,
    profiles: Profiles,
    *,
    on_round: RoundHook | None = None,
    state_dir: Path | None = None,
    fresh: bool = False,
    keep_state: bool = False,
    cgroup_root: Path = CGROUP_ROOT,
    fixed_replicas: list[tuple[str, str, float, int, float]] | None = None,
    replica_cpus: list[int] | None = None,
    apparatus_cpus: list[int] | None = None,
) -> LocalRun:
    """Run ``sc`` for real with its policies. ``fixed_replicas`` ``(service, node, cores,
    max_batch, max_wait_s)`` places replicas once at the start and runs no harvesting policy
    (sim-vs-real runs). ``replica_cpus`` pins every inference replica (default: its node's
    CPUs); ``apparatus_cpus`` pins this controller and the load generators, the measuring
    apparatus, away from what is measured. ``state_dir`` makes the run crash-safe: an
    unfinished run recorded there is resumed from its checkpoints (``fresh``: discarded), and
    the folder stays unless every job finished and not ``keep_state``
    (:mod:`reamer.backends.local.session`)."""
    policy = training_policy(sc.policy, sc.source)
    hpolicy = None
    if sc.services and fixed_replicas is None and sc.policy.harvest is not None:
        hpolicy = harvest_policy(sc.policy, sc.source, profiles.inference, sc.policy.interval_s)
    with open_session(sc, profiles, state_dir=state_dir, fresh=fresh, keep_state=keep_state,
                      cgroup_root=cgroup_root, replica_cpus=replica_cpus, apparatus_cpus=apparatus_cpus) as session:
        cluster, inference = session.cluster, session.inference
        harvest = None
        if inference is not None:
            if fixed_replicas is not None:
                inference.actuate([PlaceReplica(*r) for r in fixed_replicas], 0.0)
            elif hpolicy is not None:
                harvest = (inference, hpolicy)
            inference.start_load()

        def done() -> bool:
            return cluster.finished and (inference is None or inference.load_done)

        result = run_local(cluster, policy, interval_s=sc.policy.interval_s, max_s=sc.max_s, on_round=on_round,
                           harvest=harvest, done=done)
        session.finished = result.unfinished == 0 and not result.failed_jobs
        run = LocalRun(result, swept=session.swept, events=session.events(), recovered=session.recovered)
        if inference is not None:
            result.actuation_errors += inference.actuation_errors
            result.replica_failures = list(inference.replica_failures)
            run.replica_metrics = inference.replica_metrics()
            run.services, run.load_reports = inference.load_results()
        return run
