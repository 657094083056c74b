"""A real run's summary judges every window with traffic: errors or no success is a miss."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from reamer.reports.local import placements, summarize, worst_change


def test_windows_with_errors_or_no_success_count_as_missed():
    windows = [{"ok": 10, "errors": 0, "p99_ms": 50.0}, {"ok": 0, "errors": 5, "p99_ms": None},
               {"ok": 9, "errors": 1, "p99_ms": 40.0}, {"ok": 0, "errors": 0, "p99_ms": None}]
    run = SimpleNamespace(result=SimpleNamespace(wall_s=10.0, unfinished=0, jct_s={}, restarts_s=[], actuation_errors=[],
                                                 failures=[], failed_jobs={}, replica_failures=[], rounds=[]),
                          services={"vgg": windows},
                          load_reports={"vgg": {"errors": {"ConnectionRefusedError": 6}, "latency_ms": {"p99": None}}})
    m = summarize(run, {"vgg": 250.0})
    assert m["slo_attainment_pct:vgg"] == 100.0 / 3  # 3 windows had traffic, 1 met the SLO
    assert m["windows_missed:vgg"] == 2.0
    assert m["errors:vgg"] == 6.0 and "p99_ms:vgg" not in m  # no success at all: errors still reported


def _round(t, speeds, shapes, decisions=()):
    return SimpleNamespace(t=t, speeds=speeds, shapes=shapes, decisions=list(decisions))


def test_speed_around_a_replica_move_compares_the_rounds_before_and_after_it():
    one = (1, 1, 2.0)
    rounds = [_round(3, {"j": 50.0}, {"j": one}), _round(6, {"j": 54.0}, {"j": one}),
              _round(9, {"j": 52.0}, {"j": one}, ["PlaceReplica service=vgg, node=trainer", "Resize container=x"]),
              _round(12, {"j": 39.0}, {"j": one}), _round(15, {"j": 41.0}, {"j": one}),
              _round(18, {"j": 120.0}, {"j": (2, 1, 3.0)}, ["MigrateReplica replica=r1, node=ps-b"]),
              _round(21, {"j": 119.0}, {"j": (2, 1, 3.0)})]
    got = placements(rounds, around=2)
    assert [p["t_s"] for p in got] == [9, 18] and got[0]["moves"] == ["PlaceReplica"]
    first = got[0]["jobs"]["j"]
    assert (first["before"], first["after"]) == (52.0, 40.0) and not first["reshaped"]
    assert first["change_pct"] == 100.0 * (40.0 / 52.0 - 1.0)
    same = [54.0, 52.0, 39.0, 41.0]  # its shape's speeds, the first one left out
    assert first["noise_pct"] == pytest.approx(100 * statistics.stdev(same) / statistics.fmean(same))
    assert got[1]["jobs"]["j"]["reshaped"]  # the job got a PS in between: not the replica's doing
    assert worst_change(got) == first["change_pct"]
    assert worst_change(placements(rounds[:3], around=2)) is None  # nothing measured after the move


def test_a_round_line_shows_where_the_replicas_are():
    import io

    from rich.console import Console

    from reamer.cli.local import print_round
    from reamer.runtime.rounds import RoundRecord

    buf = io.StringIO()
    rec = RoundRecord(t=3.0, speeds={}, bottlenecks={}, shapes={}, decisions=[],
                      inference={"vgg": {"p99_ms": 80.0, "replicas": [("trainer", 0.5), ("ps-b", 1.0)]}})
    print_round(Console(file=buf, width=200), rec)
    assert "[trainer:0.5 ps-b:1]" in buf.getvalue()
