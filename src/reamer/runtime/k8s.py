"""Reamer's Kubernetes components as loops of the same control round:

* the **controller** runs :func:`reamer.control.control_round` over
  :class:`~reamer.backends.k8s.training.K8sTraining` with a training policy (NEARCHUS);
* the **scheduler** runs :func:`reamer.control.harvest_round` over
  :class:`~reamer.backends.k8s.inference.K8sInference` with a harvesting policy (Cloud Reamer);
* the **agent** measures its node and publishes its NodeSlack.

The joint round's order (inference moves before training takes its cores) holds across the
two processes through the cluster: the controller records a job's new shape in its status
before touching pods and creates a grown pod only once the node has room; the scheduler reads
that status as the training side of every node and moves inference first.

Each component serves ``/metrics`` (Prometheus), ``/healthz`` (the loop ran within 3
intervals) and ``/readyz`` (its caches are synced) on ``--metrics-port``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
)

from reamer.backends.k8s.inference import K8sInference
from reamer.backends.k8s.training import K8sTraining
from reamer.control import HarvestPolicy, Policy, Round, control_round, harvest_round, joint_round
from reamer.policies.diagnosis import Thresholds
from reamer.runtime.rounds import RoundHook, record, thresholds_of

log = logging.getLogger(__name__)


@dataclass
class Health:
    """What ``/healthz`` and ``/readyz`` answer: the last round's time and the caches' sync."""

    interval_s: float
    clock: Callable[[], float] = time.monotonic
    last_round: float | None = None
    ready: Callable[[], bool] = lambda: True
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def alive(self) -> bool:
        return self.last_round is None or self.clock() - self.last_round <= 3 * self.interval_s + 5


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:  # access logs stay out of the component's log
        return None


def serve_health(health: Health, host: str = "127.0.0.1", port: int = 0) -> tuple[WSGIServer, int]:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` in a daemon thread; returns the port."""
    metrics = make_wsgi_app(health.registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok = health.alive() if path == "/healthz" else health.ready()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"failing\n"]
        return metrics(environ, start_response)

    srv = make_server(host, port, app, handler_class=_Quiet)
    threading.Thread(target=srv.serve_forever, name="health", daemon=True).start()
    return srv, srv.server_port


class RoundMetrics:
    """Prometheus series every component exports."""

    def __init__(self, registry: CollectorRegistry, component: str) -> None:
        self.rounds = Counter("reamer_rounds_total", "Control rounds run.", ["component"], registry=registry)
        self.errors = Counter("reamer_round_errors_total", "Rounds that failed (API errors).", ["component"],
                              registry=registry)
        self.decisions = Counter("reamer_decisions_total", "Decisions by kind.", ["component", "kind"],
                                 registry=registry)
        self.duration = Histogram("reamer_round_seconds", "Round duration.", ["component"], registry=registry)
        self.actions = Gauge("reamer_backend_actions", "Backend action counters (binds, resizes, conflicts …).",
                             ["component", "action"], registry=registry)
        self.component = component

    def observe(self, seconds: float, decisions: tuple, counts: dict[str, int]) -> None:
        self.rounds.labels(self.component).inc()
        self.duration.labels(self.component).observe(seconds)
        for d in decisions:
            self.decisions.labels(self.component, type(d).__name__).inc()
        for k, v in counts.items():
            self.actions.labels(self.component, k).set(v)


def loop(step: Callable[[], Round | None], *, interval_s: float, stop: threading.Event, health: Health,
         metrics: RoundMetrics, counts: Callable[[], dict[str, int]], max_rounds: int | None = None) -> int:
    """Run ``step`` every ``interval_s`` until ``stop``; an API error fails the round, not the
    component. Returns the rounds run."""
    n = 0
    while not stop.is_set() and (max_rounds is None or n < max_rounds):
        t0 = time.monotonic()
        try:
            rnd = step()
            metrics.observe(time.monotonic() - t0, rnd.decisions if rnd is not None else (), counts())
        except Exception:
            metrics.errors.labels(metrics.component).inc()
            log.exception("%s round failed; retried next interval", metrics.component)
        health.last_round = health.clock()
        n += 1
        stop.wait(max(0.0, interval_s - (time.monotonic() - t0)))
    return n


def _publish(training: Round | None, harvest: Round | None, th: Thresholds, on_round: RoundHook | None) -> None:
    """Log each decision with what the round measured, and hand the round's record on."""
    rec = record(training, harvest, th)
    for d, why in zip(rec.decisions, rec.reasons, strict=True):
        log.info("decided %s (%s)", d, why or "-")
    if on_round is not None:
        on_round(rec)


def controller_step(backend: K8sTraining, policy: Policy, clock: Callable[[], float],
                    on_round: RoundHook | None = None) -> Callable[[], Round]:
    """One controller round: NEARCHUS's control round, then each job's diagnosis in its status;
    its record goes to ``on_round`` (the dashboard's round stream)."""
    th = thresholds_of(policy)

    def step() -> Round:
        rnd = control_round(backend, policy, clock())
        _publish(rnd, None, th, on_round)
        backend.report(rnd.decisions, th, rnd.now)
        return rnd

    return step


def scheduler_step(backend: K8sInference, policy: HarvestPolicy, clock: Callable[[], float],
                   on_round: RoundHook | None = None) -> Callable[[], Round]:
    """One scheduler round: Cloud Reamer's harvest round (place, guard, bind)."""
    th = thresholds_of(policy)

    def step() -> Round:
        rnd = harvest_round(backend, policy, clock())
        _publish(None, rnd, th, on_round)
        return rnd

    return step


def joint_step(backend: K8sTraining, policy: Policy, harvest: K8sInference, harvest_policy: HarvestPolicy,
               clock: Callable[[], float], on_round: RoundHook | None = None) -> Callable[[], Round]:
    """One process for both (small clusters): :func:`reamer.control.joint_round` — training
    decides, inference moves first, then training records its shape and converges."""
    th = thresholds_of(policy)

    def step() -> Round:
        rnd, hrnd = joint_round(backend, policy, harvest, harvest_policy, clock())
        _publish(rnd, hrnd, th, on_round)
        backend.report(rnd.decisions, th, rnd.now)
        return Round(rnd.now, (*rnd.decisions, *(hrnd.decisions if hrnd is not None else ())), rnd.snapshot)

    return step


def crash_at(points: list[str]) -> Callable[[str], None]:
    """A fault hook for restart tests: SIGKILL this process the ``N``-th time ``POINT`` is
    reached (``POINT`` or ``POINT:N``; N defaults to 1)."""
    want: dict[str, int] = {}
    for p in points:
        name, _, n = p.partition(":")
        want[name] = int(n or 1)
    seen: dict[str, int] = {}

    def hit(point: str) -> None:
        if point in want:
            seen[point] = seen.get(point, 0) + 1
            if seen[point] >= want[point]:
                log.warning("fault injection: killed at %s", point)
                logging.shutdown()
                os.kill(os.getpid(), signal.SIGKILL)

    return hit
