"""``reamer k8s``: the Kubernetes components (controller, scheduler, agent) and the CRDs.
The Kubernetes client, yaml and the backends are imported inside the commands (``reamer
--help`` stays fast)."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from reamer.cli.common import HarvestPolicy, TrainingPolicy, fail, policy_parser
from reamer.errors import InputError

app = typer.Typer(no_args_is_help=True, help="Run Reamer on a Kubernetes cluster (docs/kubernetes.md).")
log = logging.getLogger(__name__)

Kubeconfig = Annotated[str | None, typer.Option(help="kubeconfig file (default: in-cluster, then ~/.kube/config)")]
Namespace = Annotated[str, typer.Option("--namespace", "-n", help="namespace of the TrainingJobs / InferenceServices")]
Interval = Annotated[float, typer.Option(min=0.1, help="seconds between control rounds")]
MetricsPort = Annotated[int | None, typer.Option(min=0, max=65535, help="serve /metrics /healthz /readyz on this port "
                                                                        "(0: any free)")]
MetricsHost = Annotated[str, typer.Option(help="address for --metrics-port (loopback unless told)")]
DashboardPort = Annotated[int | None, typer.Option(min=0, max=65535, help="serve the live dashboard on this port "
                                                                          "(0: any free; bound to --metrics-host)")]
CrashAt = Annotated[list[str] | None, typer.Option(hidden=True, help="fault injection for restart tests: POINT[:N]")]


def crds() -> list[dict]:
    """The CustomResourceDefinitions Reamer serves (packaged with it)."""
    from importlib import resources

    import yaml

    d = resources.files("reamer.data") / "crds"
    return [yaml.safe_load(f.read_text()) for f in sorted(d.iterdir(), key=lambda f: f.name) if f.name.endswith(".yaml")]


def _connect(kubeconfig: str | None):
    from reamer.backends.k8s.kube import Kube

    if kubeconfig and os.pathsep not in kubeconfig and not Path(kubeconfig).expanduser().exists():
        raise InputError(kubeconfig, "file", "an existing kubeconfig file")  # (a list a:b is the client's to merge)
    try:
        return Kube.connect(kubeconfig)
    except Exception as e:  # a broken kubeconfig: one line, exit 2
        why = " ".join(str(e).split())  # the client's message, on one line
        raise InputError(kubeconfig or "kubeconfig", "file", "a readable kubeconfig", why) from None


def _serve(component: str, interval_s: float, port: int | None, host: str, ready, stream=None):
    from reamer.runtime.k8s import Health, RoundMetrics, serve_health
    from reamer.runtime.prom import RoundCollector

    health = Health(interval_s, ready=ready)
    metrics = RoundMetrics(health.registry, component)
    if stream is not None:  # the rounds' series (the agent runs no control round)
        health.registry.register(RoundCollector(stream, decisions=False))  # RoundMetrics counts them
    if port is not None:
        _, bound = serve_health(health, host, port)
        print(json.dumps({"component": component, "metrics_port": bound}), flush=True)
    return health, metrics


def _stream(component: str, port: int | None, host: str, meta: dict):
    """The component's round stream (its /metrics reads it), served on the dashboard when
    ``port`` is given."""
    from reamer.runtime.rounds import RoundStream

    stream = RoundStream({"backend": "kubernetes", "component": component, **meta},
                         keep=10_000 if port is not None else 100)
    if port is not None:
        from reamer.dashboard import serve

        try:
            dash = serve(stream, host, port)
        except OSError as e:
            raise InputError("--dashboard-port", "value", f"a free port on {host}", str(e)) from None
        print(json.dumps({"component": component, "dashboard_port": dash.port}), flush=True)
    return stream


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    return stop


def _fail(err: InputError) -> None:
    fail(err)  # one line, exit 2


@app.command("install-crds")
def install_crds(kubeconfig: Kubeconfig = None,
                 json_out: Annotated[bool, typer.Option("--json", help="print what was done as JSON")] = False) -> None:
    """Create or update Reamer's CustomResourceDefinitions and wait until they are served."""
    from reamer.backends.k8s.kube import ApiError

    try:
        kube = _connect(kubeconfig)
    except InputError as e:
        _fail(e)
    done = {}
    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for crd in crds():
        name = crd["metadata"]["name"]
        try:
            kube.create(base, crd)
            done[name] = "created"
        except ApiError as e:
            if e.status != 409:
                raise
            cur = kube.get(f"{base}/{name}")
            crd["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            kube.replace(f"{base}/{name}", crd)
            done[name] = "updated"
    deadline = time.monotonic() + 30
    for name in done:
        while not any(c.get("type") == "Established" and c.get("status") == "True"
                      for c in (kube.get(f"{base}/{name}").get("status") or {}).get("conditions") or []):
            if time.monotonic() > deadline:
                _fail(InputError(name, "status", "Established within 30 s", "not established"))
            time.sleep(0.2)
    print(json.dumps(done) if json_out else "\n".join(f"{k}: {v}" for k, v in done.items()))


Stale = Annotated[float, typer.Option(min=0.0, help="seconds after which a node's NodeSlack is no evidence of slack")]
MaxMoves = Annotated[int, typer.Option(min=1, help="migrations + evictions per round")]
Rounds = Annotated[int | None, typer.Option(min=1, help="stop after this many rounds")]


def _harvester(kube, inf, namespace: str, policy: str, stale: float, max_moves: int, interval: float, fault,
               source: str):
    """The scheduler's backend and its harvesting policy (``source``: the option that named it)."""
    from reamer.backends.k8s.inference import K8sInference
    from reamer.models.profiles import shipped_profiles
    from reamer.policies import REGISTRY, make_policy

    prof = shipped_profiles()
    entry = REGISTRY.get(policy)
    opts = {"stale_s": stale} if entry is not None and "stale_s" in entry.config.model_fields else None
    pol = make_policy(policy, opts, kind="harvest", interval_s=interval, profiles=prof.inference,
                      source=source, field="value")
    return K8sInference(kube, inf, namespace, prof.models, list(prof.inference), stale_s=stale,
                        max_moves_per_round=max_moves, fault=fault), pol


@app.command()
def controller(kubeconfig: Kubeconfig = None, namespace: Namespace = "default", interval: Interval = 10.0,
               policy: Annotated[TrainingPolicy, typer.Option(parser=policy_parser("training", "--harvest"),
                                                              help="training policy")] = "nearchus",
               harvest: Annotated[HarvestPolicy | None, typer.Option(
                   parser=policy_parser("harvest", "--policy"),
                   help="also run this harvesting policy in the same process (joint rounds; no separate "
                        "scheduler)")] = None,
               yield_timeout: Annotated[float, typer.Option(min=0.0, help="seconds a grown pod waits for inference to "
                                                                 "leave its node before evicting it")] = 60.0,
               stale: Stale = 30.0, max_moves: MaxMoves = 5,
               metrics_port: MetricsPort = None, metrics_host: MetricsHost = "127.0.0.1",
               dashboard_port: DashboardPort = None,
               rounds: Rounds = None, crash_at: CrashAt = None) -> None:
    """Reconcile TrainingJobs with a training policy (NEARCHUS): pods, resizes, PS/worker changes."""
    from reamer.backends.k8s.cluster import Informers
    from reamer.backends.k8s.training import K8sTraining, no_fault
    from reamer.models.profiles import shipped_profiles
    from reamer.policies import make_policy
    from reamer.runtime import k8s as rt

    fault = rt.crash_at(crash_at) if crash_at else no_fault
    try:
        pol = make_policy(policy, None, interval_s=interval, source="--policy", field="value")
        kube = _connect(kubeconfig)
        if harvest is not None:
            inf = Informers(kube, namespace)
            hb, hpol = _harvester(kube, inf, namespace, harvest, stale, max_moves, interval, fault, "--harvest")
        else:
            inf = Informers(kube, namespace, kinds=("nodes", "pods", "jobs", "slacks"))
        stream = _stream("controller", dashboard_port, metrics_host,
                         {"scenario": namespace, "policy": policy, "harvest": harvest})
    except InputError as e:
        _fail(e)
    on_round = stream.publish
    inf.start()
    backend = K8sTraining(kube, inf, namespace, shipped_profiles().models, yield_timeout_s=yield_timeout, fault=fault)
    if harvest is not None:
        step = rt.joint_step(backend, pol, hb, hpol, time.time, on_round)
        counts = lambda: {**backend.counts, **{f"inference_{k}": v for k, v in hb.counts.items()}}  # noqa: E731
    else:
        step, counts = rt.controller_step(backend, pol, time.time, on_round), lambda: backend.counts
    health, metrics = _serve("controller", interval, metrics_port, metrics_host,
                             lambda: all(r.synced.is_set() for r in inf.reflectors.values()), stream)
    log.info("controller: namespace %s, policy %s%s, every %.1f s", namespace, policy,
             f" + {harvest} (joint rounds)" if harvest else "", interval)
    rt.loop(step, interval_s=interval, stop=_stop_on_signals(), health=health, metrics=metrics, counts=counts,
            max_rounds=rounds)
    inf.stop()


@app.command()
def scheduler(kubeconfig: Kubeconfig = None, namespace: Namespace = "default", interval: Interval = 10.0,
              policy: Annotated[HarvestPolicy, typer.Option(parser=policy_parser("harvest", "reamer k8s controller "
                                                                                    "--policy"),
                                                             help="harvesting policy")] = "reamer",
              stale: Stale = 30.0, max_moves: MaxMoves = 5,
              metrics_port: MetricsPort = None, metrics_host: MetricsHost = "127.0.0.1",
              dashboard_port: DashboardPort = None,
              rounds: Rounds = None, crash_at: CrashAt = None) -> None:
    """Place and guard InferenceService pods (schedulerName: reamer) on the published slack."""
    from reamer.backends.k8s.cluster import Informers
    from reamer.backends.k8s.training import no_fault
    from reamer.runtime import k8s as rt

    try:
        kube = _connect(kubeconfig)
        inf = Informers(kube, namespace)
        backend, pol = _harvester(kube, inf, namespace, policy, stale, max_moves, interval,
                                  rt.crash_at(crash_at) if crash_at else no_fault, "--policy")
        stream = _stream("scheduler", dashboard_port, metrics_host, {"scenario": namespace, "harvest": policy})
    except InputError as e:
        _fail(e)
    inf.start()
    health, metrics = _serve("scheduler", interval, metrics_port, metrics_host,
                             lambda: all(r.synced.is_set() for r in inf.reflectors.values()), stream)
    rt.loop(rt.scheduler_step(backend, pol, time.time, stream.publish), interval_s=interval, stop=_stop_on_signals(),
            health=health, metrics=metrics, counts=lambda: backend.counts, max_rounds=rounds)
    inf.stop()


@app.command()
def agent(node: Annotated[str, typer.Option(help="this node's name (the DaemonSet passes spec.nodeName)")],
          kubeconfig: Kubeconfig = None, interval: Interval = 5.0,
          cgroup_root: Annotated[Path, typer.Option(help="the node's cgroup mount")] = Path("/sys/fs/cgroup"),
          proc_root: Annotated[Path, typer.Option(help="the node's /proc")] = Path("/proc"),
          kubelet_cgroup_root: Annotated[str, typer.Option(
              help="the kubelet's --cgroup-root (cgroupRoot), the cgroup its kubepods tree is under; auto: / or "
                   "a top-level cgroup holding one (kind's /kubelet)")] = "auto",
          system_reserved: Annotated[float, typer.Option(min=0.0, help="cores kept for the system")] = 1.0,
          metrics_port: MetricsPort = None, metrics_host: MetricsHost = "127.0.0.1",
          rounds: Rounds = None) -> None:
    """Measure this node's pods (cgroups, network, their metrics) and publish its NodeSlack."""
    from reamer.backends.k8s.agent import Agent
    from reamer.backends.local.cgroups import CgroupError
    from reamer.runtime import k8s as rt

    try:
        kube = _connect(kubeconfig)
        ag = Agent(kube, node, cgroup_root=cgroup_root, proc_root=proc_root,
                   kubelet_cgroup_root=None if kubelet_cgroup_root == "auto" else kubelet_cgroup_root,
                   system_reserved=system_reserved)
    except InputError as e:
        _fail(e)
    except CgroupError as e:
        _fail(InputError("--cgroup-root", "value", "a mounted cgroup tree", str(e)))
    health, metrics = _serve("agent", interval, metrics_port, metrics_host, lambda: True)

    def step() -> None:
        ag.round()

    rt.loop(step, interval_s=interval, stop=_stop_on_signals(), health=health, metrics=metrics, counts=dict,
            max_rounds=rounds)
