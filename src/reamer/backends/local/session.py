"""One real run of a local scenario: set up (after sweeping a crashed run's leftovers),
drive the policies, and remove everything it created — on success, on error and on Ctrl-C.
A ``kill -9`` of the controller leaves things behind; the next run's startup sweep removes
them (cgroups under ``CGROUP_PREFIX`` with the processes in them, namespaces of dead owners).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from reamer.backends.local.cgroups import CgroupError, CgroupExecutor
from reamer.backends.local.cluster import LocalCluster, LocalNode
from reamer.backends.local.inference import LocalInference, LocalService
from reamer.backends.local.netns import NetnsError, Testbed
from reamer.backends.local.netns import sweep as sweep_namespaces
from reamer.backends.local.run import LocalResult, RoundLog, run_local
from reamer.config.local import LocalScenario
from reamer.domain import Node, Resources, TrainingJob
from reamer.models.profiles import Profiles
from reamer.policies import make_policy
from reamer.policies.harvest_baselines import make_harvest_policy

CGROUP_PREFIX = "reamer-local"
NETNS_PREFIX = "rmrl"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def unavailable(root: Path = CGROUP_ROOT) -> str | None:
    """Why a real run cannot happen here (one line), or None when it can."""
    if os.geteuid() != 0:
        return "not root (cgroups and network namespaces need root)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    try:
        import onnxruntime  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        return f"the real workloads need torch and onnxruntime ({e.name} missing)"
    try:
        ex = CgroupExecutor(root, prefix=CGROUP_PREFIX + "-probe", controllers=("cpu", "cpuset"))
        ex.create("probe")
        ex.set_cpu("probe", 0.5)
        ex.sweep()
    except (CgroupError, OSError) as e:
        return f"cgroups are not writable ({e})"
    return None


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so the ``finally``
    clauses that remove cgroups, namespaces and processes run for both (SIGTERM's default
    ends the process without them). The previous handler is restored on exit. Main thread only."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def sweep_leftovers(cgroup_root: Path = CGROUP_ROOT) -> list[str]:
    """What a crashed (``kill -9``) run left: its cgroups (and the processes in them) and its
    namespaces (whose owner pid is dead). Every run does this first. Returns what it removed."""
    executor = CgroupExecutor(cgroup_root, prefix=CGROUP_PREFIX, controllers=("cpu", "cpuset"))
    return executor.sweep(kill=True) + sweep_namespaces(NETNS_PREFIX)


def local_nodes(sc: LocalScenario) -> list[LocalNode]:
    return [LocalNode(Node(h.name, h.cores, h.mem_gib * 1024, nic_gbps=h.nic_gbps, pool="local"), i,
                      tuple(h.cpus) if h.cpus is not None else None, h.link_mbit) for i, h in enumerate(sc.hosts)]


def training_jobs(sc: LocalScenario) -> list[TrainingJob]:
    return [TrainingJob(j.id, j.model, j.arrival_s, j.samples, j.ps, j.workers, Resources(j.ps_cores, 512),
                        Resources(j.worker_cores, 1024), batch=j.batch, max_ps=j.max_ps, max_workers=j.max_workers,
                        max_cores_per_container=max(h.cores for h in sc.hosts)) for j in sc.jobs]


def local_services(sc: LocalScenario) -> list[LocalService]:
    return [LocalService(s.id, s.model, s.slo_p99_ms / 1e3, tuple(s.rates), s.window_s) for s in sc.services]


@dataclass
class LocalRun:
    result: LocalResult
    services: dict[str, list[dict]] = field(default_factory=dict)  # service → loadgen window reports
    load_reports: dict[str, dict] = field(default_factory=dict)  # service → loadgen final report
    replica_metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # replica → its /metrics at the end
    events: list[tuple[float, str, str]] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)  # leftovers of an earlier run removed at start


def run_scenario(
    sc: LocalScenario,
    profiles: Profiles,
    *,
    on_round: Callable[[RoundLog], None] | None = None,
    workdir: Path | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    fixed_replicas: list[tuple[str, str, float, int, float]] | None = None,
    replica_cpus: list[int] | None = None,
    apparatus_cpus: list[int] | None = None,
) -> LocalRun:
    """Run ``sc`` for real. ``fixed_replicas`` ``(service, node, cores, max_batch, max_wait_s)``
    places replicas once at the start and runs no harvesting policy (sim-vs-real runs).
    ``replica_cpus`` pins every inference replica (default: its node's CPUs);
    ``apparatus_cpus`` pins this controller and the load generators, the
    measuring apparatus, away from what is measured."""
    if apparatus_cpus is not None:
        os.sched_setaffinity(0, set(apparatus_cpus))
    swept = sweep_leftovers(cgroup_root)
    executor = CgroupExecutor(cgroup_root, prefix=CGROUP_PREFIX, controllers=("cpu", "cpuset"))
    own_tmp = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="reamer-local-")) if own_tmp else Path(workdir)  # type: ignore[arg-type]
    testbed = Testbed(len(sc.hosts), prefix=NETNS_PREFIX)
    cluster = inference = None
    try:
        for i, h in enumerate(sc.hosts):
            if h.link_mbit is not None:
                testbed.set_bandwidth(i, h.link_mbit)
        cluster = LocalCluster(local_nodes(sc), training_jobs(sc), executor=executor, testbed=testbed, workdir=wd,
                               seed=sc.seed)
        policy = make_policy(sc.policy.training, sc.policy.options.get(sc.policy.training),
                             interval_s=sc.policy.interval_s, source=sc.source)
        harvest = None
        if sc.services:
            inference = LocalInference(cluster, local_services(sc), executor=executor, workdir=wd,
                                       profiles=dict(profiles.inference), system_reserve_cores=sc.system_reserve_cores,
                                       seed=sc.seed, replica_cpus=replica_cpus, load_cpus=apparatus_cpus)
            if fixed_replicas is not None:
                from reamer.domain.inference import PlaceReplica

                inference.actuate([PlaceReplica(*r) for r in fixed_replicas], 0.0)
            elif sc.policy.harvest is not None:
                hp = make_harvest_policy(sc.policy.harvest, sc.policy.options.get(sc.policy.harvest),
                                         interval_s=sc.policy.interval_s, profiles=dict(profiles.inference),
                                         source=sc.source)
                harvest = (inference, hp)
            inference.start_load()
        inf = inference

        def done() -> bool:
            return cluster.finished and (inf is None or inf.load_done)

        result = run_local(cluster, policy, interval_s=sc.policy.interval_s, max_s=sc.max_s, on_round=on_round,
                           harvest=harvest, done=done)
        run = LocalRun(result, swept=swept, events=sorted(cluster.events + (inference.events if inference else [])))
        if inference is not None:
            run.replica_metrics = inference.replica_metrics()
            for sid, s in inference.services.items():
                run.services[sid] = list(s.windows)
                if s.loadgen is not None:
                    s.loadgen.wait(30)
                    lines = s.loadgen.since(0)
                    # every window the load generator reported (a harvest loop reads them as they come;
                    # with fixed replicas nothing did), with when it arrived (the backend clock, time.monotonic by default)
                    run.services[sid] = [{**ln.obj, "received_s": round(ln.t, 3)} for ln in lines
                                         if ln.obj.get("event") == "window"]
                    final = [ln.obj for ln in lines if ln.obj.get("event") == "done"]
                    if final:
                        run.load_reports[sid] = final[-1]
        return run
    finally:
        for backend in (inference, cluster):
            if backend is not None:
                backend.close()
        try:
            testbed.close()
        except NetnsError:
            pass
        executor.sweep(kill=True)
        if own_tmp:
            shutil.rmtree(wd, ignore_errors=True)
