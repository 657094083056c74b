"""A service's window from its replicas' reports (``reamer.backends.k8s.telemetry``): pure,
the reports are NodeSlack entries as the agent publishes them."""

from __future__ import annotations

import pytest

from reamer.backends.k8s.telemetry import LATENCY, REQUESTS, PodReport, service_window


def _reports(*metrics: dict | None) -> dict[str, PodReport]:
    return {f"ns/r{i}": PodReport("n1", 100.0 + i, 5.0, {"name": f"r{i}", **({"metrics": m} if m is not None else {})})
            for i, m in enumerate(metrics)}


def _rate(x: float, p99: float | None = None) -> dict:
    return {REQUESTS: 1000.0, REQUESTS + ":rate": x, **({LATENCY + ":p99": p99} if p99 is not None else {})}


def test_every_replica_measured_sums_and_keeps_the_largest_p99():
    w = service_window(["r0", "r1", "gone"], "ns", _reports(_rate(10, 0.05), _rate(0, 0.2)), {"r0", "r1"})
    assert (w.at, w.rate_per_s, w.p99_s) == (101.0, 10.0, 0.2)  # an idle replica is a real 0


@pytest.mark.parametrize("missing", [None, {REQUESTS: 5.0}], ids=["no-metrics", "first-scrape"])
def test_a_replica_without_a_rate_is_not_a_replica_serving_nothing(missing):
    # a restarted agent or server, a scrape that failed: the window is the others', scaled to all
    reports = _reports(_rate(10), _rate(20), missing)
    assert service_window(["r0", "r1", "r2"], "ns", reports, {"r0", "r1", "r2"}).rate_per_s == pytest.approx(45.0)
    # a replica still starting (not Ready) gets no requests from its Service: it serves nothing
    assert service_window(["r0", "r1", "r2"], "ns", reports, {"r0", "r1"}).rate_per_s == pytest.approx(30.0)
    # one Ready before its agent's first report of it serves its share too
    assert service_window(["r0", "r1", "new"], "ns", reports, {"r0", "r1", "new"}).rate_per_s == pytest.approx(45.0)
    # no replica with a rate: no window, not a window of no load
    assert service_window(["r0"], "ns", _reports(missing), {"r0"}) is None
    assert service_window(["x"], "ns", _reports(_rate(1)), {"x"}) is None


def test_a_report_of_an_agent_that_stopped_is_not_this_windows():
    reports = _reports(_rate(10, 0.05), _rate(30, 0.9))
    r1 = reports["ns/r1"]
    reports["ns/r1"] = PodReport(r1.node, 100.0 - 60.0, r1.window_s, r1.entry)  # its agent stopped a minute ago
    w = service_window(["r0", "r1"], "ns", reports, {"r0", "r1"})
    assert (w.at, w.rate_per_s, w.p99_s) == (100.0, 20.0, 0.05)
