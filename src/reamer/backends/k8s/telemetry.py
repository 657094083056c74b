"""Reading what the agents published (NodeSlack objects) as the policies' telemetry.

The contract (docs/kubernetes.md): each node's agent reports, per pod, CPU used and
throttled (cgroup), network throughput (the pod's network namespace) and the pod's own
``reamer_*`` Prometheus metrics scraped from ``reamer.io/metrics-port`` — counters as
``NAME`` (value) and ``NAME:rate`` (per second over the window), histograms as
``NAME:p99`` (over the window), gauges as ``NAME``. Training code meets it by exporting
``reamer_train_samples_total`` from every worker: the samples that process has trained since
it started (a plain counter). A job's speed is the sum of its workers' rates; its progress is
banked by the controller in the TrainingJob's ``status.samplesDone`` from the counters
themselves (``status.counters`` keeps each worker pod's last value), so a window missed by
either side, or a restart of either, loses nothing. Inference servers export
``reamer_infer_requests_total`` and the ``reamer_infer_request_latency_seconds`` histogram.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from reamer.backends.k8s.cluster import ClusterObjects
from reamer.domain import ContainerTelemetry, JobTelemetry, Role
from reamer.domain.cluster import Container

SAMPLES = "reamer_train_samples_total"
REQUESTS = "reamer_infer_requests_total"
LATENCY = "reamer_infer_request_latency_seconds"


@dataclass(frozen=True, slots=True)
class PodReport:
    node: str
    reported_at: float
    window_s: float
    entry: dict

    @property
    def since(self) -> float:
        return self.reported_at - self.window_s

    def metric(self, name: str) -> float | None:
        v = (self.entry.get("metrics") or {}).get(name)
        return None if v is None else float(v)


def pod_reports(objs: ClusterObjects) -> dict[str, PodReport]:
    """``namespace/name`` → the latest report of that pod."""
    out: dict[str, PodReport] = {}
    for node, s in objs.slacks.items():
        st = s.get("status") or {}
        if "reportedAt" not in st:
            continue
        for e in st.get("pods") or []:
            k = f"{e['namespace']}/{e['name']}"
            r = PodReport(node, float(st["reportedAt"]), float(st.get("windowSeconds", 0.0)), e)
            if k not in out or out[k].reported_at < r.reported_at:
                out[k] = r
    return out


def job_telemetry(containers: list[Container], pod_of: dict[str, str], namespace: str,
                  reports: dict[str, PodReport], after: float,
                  pod_uids: Mapping[str, str]) -> tuple[JobTelemetry | None, dict[str, float]]:
    """A job's telemetry from the reports newer than ``after`` (each report is one sample for
    the policy), and the latest ``reamer_train_samples_total`` of each of its workers' pods
    (what the controller banks progress from). ``pod_uids`` (pod name → uid of this job's pods):
    a report of another pod of the same name (an earlier job's, under the same job name) is
    not this job's."""
    tel: dict[str, ContainerTelemetry] = {}
    speed: float | None = None
    counters: dict[str, float] = {}
    since = None
    for c in containers:
        pod = pod_of.get(c.id, "")
        r = reports.get(f"{namespace}/{pod}")
        if r is None:
            continue
        if r.entry.get("uid") and r.entry["uid"] != pod_uids.get(pod):
            continue
        total = r.metric(SAMPLES)
        if c.role is Role.WORKER and total is not None:
            counters[pod] = total
        if r.reported_at <= after:
            continue
        e = r.entry
        tel[c.id] = ContainerTelemetry(cpu_used=float(e.get("cpuUsed", 0.0)), cpu_limit=c.res.cpu,
                                       throttled_ratio=float(e.get("throttledRatio", 0.0)),
                                       net_gbps=float(e.get("netGbps", 0.0)),
                                       net_capacity_gbps=float(e.get("netCapacityGbps", 0.0)),
                                       mem_used_mib=float(e.get("memoryUsedMiB", 0.0)))
        rate = r.metric(SAMPLES + ":rate")
        if c.role is Role.WORKER and rate is not None:
            speed = (speed or 0.0) + rate
        since = r.since if since is None else max(since, r.since)
    if speed is None or since is None:
        return None, counters
    return JobTelemetry(since, speed, tel), counters


def banked(done: float, before: Mapping[str, float], now: Mapping[str, float]) -> float:
    """``done`` plus what the workers' counters added since ``before`` (a counter below its last
    value is a restarted process: all of it is new)."""
    for pod, v in now.items():
        v0 = float(before.get(pod, 0.0))
        done += v - v0 if v >= v0 else v
    return done


def newest_report(containers: list[Container], pod_of: dict[str, str], namespace: str,
                  reports: dict[str, PodReport]) -> float:
    ts = [reports[k].reported_at for c in containers if (k := f"{namespace}/{pod_of.get(c.id, '')}") in reports]
    return max(ts, default=0.0)


@dataclass(frozen=True, slots=True)
class ServiceWindow:
    """A service's last window as its replicas measured it."""

    at: float
    rate_per_s: float
    p99_s: float | None  # the largest replica p99 (a conservative merge); None when nothing was served


def service_window(pod_names: list[str], namespace: str, reports: dict[str, PodReport],
                   ready: Collection[str]) -> ServiceWindow | None:
    """The service's window from its replicas' reports. A Ready replica whose report has no
    request rate (its first scrape after a restart of the agent or the server, a scrape that
    failed before) is not a replica serving nothing: the rate is the measured ones' scaled to
    every replica serving (a Service spreads requests evenly over the Ready ones); a replica not
    Ready and without a rate serves nothing. No replica with a rate is no window (None), not a
    window of no load. A report older than two of the newest report's windows (its node's
    agent stopped) has no rate, and its p99 is not this window's."""
    rs = {n: reports[k] for n in pod_names if (k := f"{namespace}/{n}") in reports}
    if not rs:
        return None
    newest = max(rs.values(), key=lambda r: r.reported_at)
    current = {n: r for n, r in rs.items() if r.reported_at >= newest.reported_at - 2 * max(newest.window_s, 1.0)}
    rated = {n: x for n, r in current.items() if (x := r.metric(REQUESTS + ":rate")) is not None}
    if not rated:
        return None
    serving = set(rated) | {n for n in pod_names if n in ready}
    rate = sum(rated.values()) * len(serving) / len(rated)
    p99s = [p for r in current.values() if (p := r.metric(LATENCY + ":p99")) is not None]
    return ServiceWindow(newest.reported_at, rate, max(p99s) if p99s else None)
