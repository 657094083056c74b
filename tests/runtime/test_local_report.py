"""A real run's summary judges every window with traffic: errors or no success is a miss."""

from __future__ import annotations

from types import SimpleNamespace

from reamer.reports.local import summarize


def test_windows_with_errors_or_no_success_count_as_missed():
    windows = [{"ok": 10, "errors": 0, "p99_ms": 50.0}, {"ok": 0, "errors": 5, "p99_ms": None},
               {"ok": 9, "errors": 1, "p99_ms": 40.0}, {"ok": 0, "errors": 0, "p99_ms": None}]
    run = SimpleNamespace(result=SimpleNamespace(wall_s=10.0, unfinished=0, jct_s={}, restarts_s=[], actuation_errors=[],
                                                 failures=[], failed_jobs={}, replica_failures=[]),
                          services={"vgg": windows},
                          load_reports={"vgg": {"errors": {"ConnectionRefusedError": 6}, "latency_ms": {"p99": None}}})
    m = summarize(run, {"vgg": 250.0})
    assert m["slo_attainment_pct:vgg"] == 100.0 / 3  # 3 windows had traffic, 1 met the SLO
    assert m["windows_missed:vgg"] == 2.0
    assert m["errors:vgg"] == 6.0 and "p99_ms:vgg" not in m  # no success at all: errors still reported
