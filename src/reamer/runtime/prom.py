"""Prometheus series of what the control rounds saw and did, read from the run's one
:class:`~reamer.runtime.rounds.RoundStream`: the numbers the dashboard draws, for Prometheus
and the Grafana dashboard in ``deploy/components/monitoring`` (docs/metrics.md).

:class:`RoundCollector` is a collector: each scrape reads the rounds published since the last
one, so a job, service or node that left the cluster leaves the series with it. The
Kubernetes components register it beside their loop metrics; the dashboard serves it on its
``/metrics`` for any run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from reamer.runtime.rounds import CPU_BANDS, RoundStream

Record = dict[str, Any]  # a RoundRecord as the stream holds it (to_json)


class RoundCollector:
    """Follows ``stream``; :meth:`collect` turns what its latest rounds measured into metric
    families."""

    def __init__(self, stream: RoundStream, decisions: bool = True) -> None:
        """``decisions``: also count the decisions as ``reamer_decisions_total{component, kind}``
        (the Kubernetes components count them in their loop already)."""
        self.stream = stream
        self.count_decisions = decisions
        self.component = str(stream.meta.get("component") or stream.meta.get("backend") or "reamer")
        self._next = 0
        self._lock = threading.Lock()
        self._training: Record | None = None  # the latest round with a training half
        self._harvest: Record | None = None  # the latest round with a harvest half
        self._nodes: dict[str, dict[str, float]] = {}
        self._speeds: dict[str, float] = {}  # the last measured speed of each job
        self._diagnosis: dict[str, str] = {}
        self._decisions: dict[str, int] = {}
        self._t: float | None = None

    def _observe(self, rec: Record) -> None:
        if "training" in rec["halves"]:
            self._training = rec
            shapes = rec["shapes"]
            self._speeds = {j: v for j, v in {**self._speeds, **rec["speeds"]}.items() if j in shapes}
            self._diagnosis = {j: v for j, v in {**self._diagnosis, **rec["bottlenecks"]}.items() if j in shapes}
        if "harvest" in rec["halves"]:
            self._harvest = rec
        # a co-located run's nodes come from the rounds that measured inference too
        if rec["nodes"] and ("harvest" in rec["halves"] or self._harvest is None):
            self._nodes = rec["nodes"]
        for d in rec["decisions"]:
            kind = d.split(" ", 1)[0]
            self._decisions[kind] = self._decisions.get(kind, 0) + 1
        self._t = rec["t"]

    def describe(self) -> list[Metric]:  # families are known only at collect time
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            while True:  # the stream answers in pages of its own size
                got, nxt, _ = self.stream.since(self._next)
                for rec in got:
                    self._observe(rec)
                if nxt == self._next:
                    break
                self._next = nxt
            tr, hv, nodes = self._training, self._harvest, self._nodes
            speeds, diagnosis, decisions, t = dict(self._speeds), dict(self._diagnosis), dict(self._decisions), self._t
        speed = GaugeMetricFamily("reamer_job_speed_samples_per_second", "Training speed measured over the job's "
                                  "last window.", labels=["job"])
        cores = GaugeMetricFamily("reamer_job_cpu_cores", "CPU cores allocated to a running training job.",
                                  labels=["job"])
        containers = GaugeMetricFamily("reamer_job_containers", "Containers of a running training job, by role.",
                                       labels=["job", "role"])
        diag = GaugeMetricFamily("reamer_job_diagnosis", "1 for the job's current diagnosis (its bottleneck).",
                                 labels=["job", "bottleneck"])
        for job, (ps, workers, c) in (tr["shapes"].items() if tr is not None else ()):
            cores.add_metric([job], c)
            containers.add_metric([job, "ps"], ps)
            containers.add_metric([job, "worker"], workers)
            if job in speeds:
                speed.add_metric([job], speeds[job])
            if job in diagnosis:
                diag.add_metric([job, diagnosis[job]], 1.0)
        node = GaugeMetricFamily("reamer_node_cpu_cores", "A node's cores by use: system, training_need, "
                                 "training_unused, inference (harvested), idle.", labels=["node", "use"])
        for name, row in nodes.items():
            for use in CPU_BANDS:
                node.add_metric([name, use], row.get(use, 0.0))
        p99 = GaugeMetricFamily("reamer_service_p99_seconds", "An inference service's p99 latency over its last "
                                "window.", labels=["service"])
        slo = GaugeMetricFamily("reamer_service_slo_seconds", "An inference service's p99 latency SLO.",
                                labels=["service"])
        met = GaugeMetricFamily("reamer_service_slo_met", "1 when the service's last window met its SLO, 0 when it "
                                "did not.", labels=["service"])
        errors = GaugeMetricFamily("reamer_service_error_ratio", "Share of the last window's requests that failed "
                                   "(where the backend measures it).", labels=["service"])
        replicas = GaugeMetricFamily("reamer_service_replicas", "Replicas of an inference service.", labels=["service"])
        scores = GaugeMetricFamily("reamer_service_cpu_cores", "CPU cores of an inference service's replicas.",
                                   labels=["service"])
        for sid, s in (hv["inference"].items() if hv is not None else ()):
            slo.add_metric([sid], s["slo_ms"] / 1e3)
            replicas.add_metric([sid], len(s["replicas"]))
            scores.add_metric([sid], sum(c for _, c in s["replicas"]))
            if s["p99_ms"] is not None:
                p99.add_metric([sid], s["p99_ms"] / 1e3)
                met.add_metric([sid], float(s["p99_ms"] <= s["slo_ms"]))
            if s.get("error_rate") is not None:
                errors.add_metric([sid], s["error_rate"])
        yield from (speed, cores, containers, diag, node, p99, slo, met, errors, replicas, scores)
        if self.count_decisions:
            made = CounterMetricFamily("reamer_decisions", "Decisions by kind.", labels=["component", "kind"])
            for kind, n in sorted(decisions.items()):
                made.add_metric([self.component, kind], n)
            yield made
        if t is not None:
            yield GaugeMetricFamily("reamer_last_round_time_seconds", "The run's clock at its latest round.", value=t)
