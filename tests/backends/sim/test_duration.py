"""Fixed-duration training jobs (``TrainingJob.duration_s``): a pod that ends at its lifetime."""

import math

import numpy as np
import pytest

from reamer.runtime import simulate
from reamer.backends.sim.cluster import SimCluster
from reamer.config.scenario import load_scenario
from reamer.domain import Node, Resources, Role, StartJob, TrainingJob
from reamer.domain.decisions import Placement, Resize
from reamer.models.profiles import shipped_profiles

CAL = shipped_profiles().calibration
START = (Placement(Role.PS, "n0", Resources(1, 512)), Placement(Role.WORKER, "n1", Resources(2, 512)))


def _cluster(duration_s=None, samples=1e5):
    events = []
    c = SimCluster([Node("n0", 8, 8192), Node("n1", 8, 8192)], CAL, np.random.default_rng(0),
                   lambda jid, t, v: events.append((jid, t, v)))
    c.arrive(TrainingJob("j", "resnet50", 0.0, samples, 1, 1, Resources(1, 512), Resources(2, 512),
                         duration_s=duration_s), 0.0)
    return c, events


def _last_valid(c, events):
    jid, t, v = events[-1]
    assert v == c.jobs[jid].version
    return jid, t, v


@pytest.mark.parametrize("start", [0.0, 50.0])
def test_ends_at_first_start_plus_duration_whatever_the_speed(start):
    c, events = _cluster(duration_s=300.0)
    c.actuate([StartJob("j", START)], start)
    assert _last_valid(c, events)[1] == start + 300.0
    # a resize (speed change) and contention re-time it, but not its end
    c.actuate([Resize(c.state.jobs["j"].containers["j/worker1"].id, Resources(1, 512))], start + 100.0)
    c.set_contention({"n1": 0.5}, start + 150.0)
    jid, t, v = _last_valid(c, events)
    assert t == start + 300.0
    assert not c.complete(jid, v - 1, t)  # earlier events are stale
    assert c.complete(jid, v, t)
    j = c.state.jobs["j"]
    assert j.state.value == "done" and j.finished_s == start + 300.0


def test_work_is_what_its_speed_allowed_not_capped_by_samples():
    c, events = _cluster(duration_s=200.0, samples=1.0)  # nominal size far below what it can do
    c.actuate([StartJob("j", START)], 0.0)
    speed = c.jobs["j"].step.speed
    assert speed > 0
    jid, t, v = _last_valid(c, events)
    assert c.complete(jid, v, t)
    assert c.jobs["j"].done == pytest.approx(speed * 200.0)


def test_contention_costs_samples_not_time():
    full, ev_full = _cluster(duration_s=400.0)
    full.actuate([StartJob("j", START)], 0.0)
    half, ev_half = _cluster(duration_s=400.0)
    half.actuate([StartJob("j", START)], 0.0)
    half.track_share = full.track_share = True
    half.set_contention({"n1": 0.5}, 0.0)
    for c, ev in ((full, ev_full), (half, ev_half)):
        jid, t, v = _last_valid(c, ev)
        assert t == 400.0
        assert c.complete(jid, v, t)
    assert half.jobs["j"].done == pytest.approx(0.5 * full.jobs["j"].done)
    assert half.totals.speed_share_s / half.totals.job_s == pytest.approx(0.5)  # slowdown 50 %


def test_without_duration_completion_follows_samples():
    c, events = _cluster(duration_s=None, samples=1e4)
    c.actuate([StartJob("j", START)], 0.0)
    speed = c.jobs["j"].step.speed
    jid, t, v = _last_valid(c, events)
    assert t == pytest.approx(1e4 / speed)
    assert c.complete(jid, v, t)
    assert c.jobs["j"].done == 1e4


@pytest.mark.parametrize("bad", [0.0, -5.0, math.nan, math.inf])
def test_bad_duration_is_a_one_line_error(bad):
    with pytest.raises(ValueError, match=r"^job j: duration_s must be a finite number > 0") as e:
        TrainingJob("j", "resnet50", 0.0, 1e4, 1, 1, Resources(1, 512), Resources(2, 512), duration_s=bad)
    assert "\n" not in str(e.value)


def test_simulate_runs_fixed_duration_jobs_for_their_duration():
    sc = load_scenario(None)
    res = Resources(2, 1024)
    jobs = [TrainingJob(f"d{k}", "resnet50", 60.0 * k, 1e3, 1, 1, Resources(1, 512), res, duration_s=500.0 + k)
            for k in range(6)]
    r = simulate(sc, "static", jobs=jobs)
    assert r.unfinished == 0 and len(r.jobs) == 6
    for j in r.jobs:
        k = int(j.id[1:])
        assert j.end_s - j.start_s == pytest.approx(500.0 + k)
        assert j.samples > 1e3  # did what its speed allowed, beyond its nominal size
    again = simulate(sc, "static", jobs=jobs)
    assert again.jobs == r.jobs
