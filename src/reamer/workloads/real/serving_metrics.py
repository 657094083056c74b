"""The inference server's Prometheus metrics (``prometheus-client``, one registry per server)
and the readers the backends and benchmarks use on a running server's ``/metrics``.

Names (what :mod:`reamer.backends.k8s.telemetry` and the benchmarks read):

- ``reamer_infer_requests_total{code}``: ``POST /infer`` answers by HTTP status code;
- ``reamer_infer_shed_total{reason}``: requests answered 503 without being computed —
  ``queue_full`` (the bounded queue had no room), ``deadline`` (the expected completion was
  past the request's deadline: never queued), ``expired`` (its deadline passed while it
  waited, or would before its batch is done: dropped when the batcher would have taken it), ``stopping`` (the server shut down);
- ``reamer_infer_samples_total``; histograms ``reamer_infer_request_latency_seconds`` (admission
  to answer ready: queue + batch + run, successful requests), ``reamer_infer_batch_size`` and
  ``reamer_infer_run_seconds`` (``session.run`` per batch);
- gauges ``reamer_infer_queue_depth`` (requests waiting), ``reamer_infer_queue_samples``,
  ``reamer_infer_expected_wait_seconds`` (of a one-sample request arriving now),
  ``reamer_infer_batch_service_seconds`` (the measured service time of a full batch),
  ``reamer_infer_admission_margin_seconds`` (added to every expected wait) and the
  configuration: ``reamer_infer_threads``, ``reamer_infer_max_batch``,
  ``reamer_infer_max_wait_seconds``, ``reamer_infer_deadline_seconds`` (the default deadline),
  ``reamer_infer_max_queue_samples``, ``reamer_infer_max_body_bytes``.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
SHED_REASONS = ("queue_full", "deadline", "expired", "stopping")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """Every metric of one server, in its own :class:`CollectorRegistry` (thread-safe: the
    batcher thread and the event loop both update it)."""

    def __init__(self, *, threads: int, max_batch: int, max_wait_s: float, deadline_s: float,
                 max_queue_samples: int, max_body_bytes: int) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("reamer_infer_requests", "Inference requests (POST /infer) by HTTP status code.",
                                ["code"], registry=r)
        self.requests.labels(code="200")  # present from the start: a rate of 0 is a rate
        self.shed = Counter("reamer_infer_shed", "Requests answered 503 without being computed, by reason.",
                            ["reason"], registry=r)
        for reason in SHED_REASONS:
            self.shed.labels(reason=reason)
        self.samples = Counter("reamer_infer_samples", "Samples inferred.", registry=r)
        self.latency = Histogram("reamer_infer_request_latency_seconds",
                                 "Time from admission to response ready (queue + batch + run), successful requests.",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.batch = Histogram("reamer_infer_batch_size", "Samples per executed batch.", buckets=BATCH_BUCKETS,
                               registry=r)
        self.run_s = Histogram("reamer_infer_run_seconds", "ONNX Runtime session.run time per batch.",
                               buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("reamer_infer_queue_depth", "Requests waiting for the batcher.", registry=r)
        self.queue_samples = Gauge("reamer_infer_queue_samples", "Samples waiting for the batcher.", registry=r)
        self.expected_wait = Gauge("reamer_infer_expected_wait_seconds",
                                   "Expected time to answer a one-sample request arriving now.", registry=r)
        self.margin = Gauge("reamer_infer_admission_margin_seconds",
                            "Admission margin: 99.5th percentile of how much later than predicted requests were answered.",
                            registry=r)
        self.batch_service = Gauge("reamer_infer_batch_service_seconds",
                                   "Measured (EWMA) service time of a batch of max_batch samples.", registry=r)
        for name, help_text, value in (
            ("reamer_infer_threads", "ONNX Runtime intra-op threads.", threads),
            ("reamer_infer_max_batch", "Dynamic batching: most samples per batch.", max_batch),
            ("reamer_infer_max_wait_seconds", "Dynamic batching: longest wait for a batch to fill.", max_wait_s),
            ("reamer_infer_deadline_seconds", "Deadline of a request without X-Deadline-Ms.", deadline_s),
            ("reamer_infer_max_queue_samples", "Admission: most samples queued.", max_queue_samples),
            ("reamer_infer_max_body_bytes", "Largest request body accepted.", max_body_bytes),
        ):
            Gauge(name, help_text, registry=r).set(value)

    def watch(self, expected_wait_s: Callable[[], float], batch_service_s: Callable[[], float]) -> None:
        """Gauges read at scrape time from the batcher."""
        self.expected_wait.set_function(expected_wait_s)
        self.batch_service.set_function(batch_service_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# --------------------------------------------------------------------------- readers
def parse_metrics(text: str) -> dict[str, float]:
    """``{"name{label="v",...}": value}`` for every sample of a Prometheus text exposition
    (parsed by ``prometheus_client.parser``)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out


def fetch_metrics(port: int, host: str = "127.0.0.1", timeout_s: float = 10.0) -> dict[str, float]:
    """A running server's ``/metrics``, parsed (:func:`parse_metrics`)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as r:
        return parse_metrics(r.read().decode())


def served_stats(after: dict[str, float], before: dict[str, float] | None = None) -> dict[str, float]:
    """What the server measured itself between two :func:`fetch_metrics` (or since its start):
    ONNX Runtime ms per batch and per sample, mean batch, mean latency inside the server (ms)."""
    d = {k: after.get(f"reamer_infer_{k}", 0.0) - (before or {}).get(f"reamer_infer_{k}", 0.0)
         for k in ("run_seconds_sum", "run_seconds_count", "samples_total", "request_latency_seconds_sum",
                   "request_latency_seconds_count")}
    batches = max(1.0, d["run_seconds_count"])
    return {"run_ms_per_batch": 1e3 * d["run_seconds_sum"] / batches,
            "run_ms_per_sample": 1e3 * d["run_seconds_sum"] / max(1.0, d["samples_total"]),
            "batch_mean": d["samples_total"] / batches, "batches": d["run_seconds_count"],
            "latency_ms": 1e3 * d["request_latency_seconds_sum"] / max(1.0, d["request_latency_seconds_count"])}
