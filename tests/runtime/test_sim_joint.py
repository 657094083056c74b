"""The joint loop in the simulator: at the start of an SLO window, and between windows in a
round where training is about to take cores a replica holds, training and inference decide
in one :func:`reamer.control.joint_round`, and inference moves before training takes the
cores it decided to take — exactly as in a real run. A hand-built case: one GPU node, one
compute-bound job whose worker grows from 4 to 12 or 14 cores (with its PS and the replica,
more than the node's 16), one replica on the node's slack."""

from __future__ import annotations

import pytest

from reamer.backends.sim import SimCluster, SimInference
from reamer.config.scenario import parse_scenario
from reamer.domain import Resize, Resources, Role, TrainingJob
from reamer.policies import make_policy
from reamer.policies.static import Static
from reamer.runtime import simulate

SC = parse_scenario({
    "name": "joint", "seed": 1, "horizon_s": 300,
    "cluster": {"node_pools": [{"name": "g", "count": 1, "cores": 16, "mem_gib": 64, "gpus": 1,
                                "gpu_model": "V100M32"}]},
    "policy": {"interval_s": 30, "telemetry_noise_pct": 0},
    "inference": {"services": [{"id": "svc", "model": "resnet50", "slo_p99_ms": 300, "peak_rate_per_s": 20,
                                "rate": {"kind": "diurnal", "trough_frac": 1.0, "noise": 0.0}}],
                  "pool": {"count": 1, "cores": 16, "mem_gib": 64}, "training_need": "limits"},
}, "test")
JOBS = [TrainingJob("j", "resnet50", 0.0, 1e9, 1, 1, Resources(1, 4096), Resources(4, 8192))]


class GrowAt:
    """``static`` placement, and at ``at`` the job's worker grows to ``cores`` (as NEARCHUS
    upscales a compute-bound job), in the round of that instant."""

    name = "grow-at"
    interval_s = 30.0

    def __init__(self, at: float, cores: float) -> None:
        self.at, self.cores, self.static, self.done = at, cores, Static(), False

    def decide(self, snap):
        out = list(self.static.decide(snap))
        if not self.done and snap.now >= self.at and snap.running:
            w = snap.running[0].of_role(Role.WORKER)[0]
            out.append(Resize(w.id, Resources(self.cores, w.res.mem_mib)))
            self.done = True
        return out


def _run(at: float, monkeypatch, sc=SC, cores: float = 14.0) -> tuple[dict, list, list]:
    log: list[tuple[float, str, tuple]] = []
    for cls, side in ((SimCluster, "training"), (SimInference, "inference")):
        real = cls.actuate

        def actuate(self, decisions, now, real=real, side=side):
            if decisions:
                log.append((now, side, tuple(type(d).__name__ for d in decisions)))
            return real(self, decisions, now)

        monkeypatch.setattr(cls, "actuate", actuate)
    rounds: list = []
    r = simulate(sc, GrowAt(at, cores), jobs=JOBS, harvest="reamer", on_round=rounds.append)
    return r.metrics, log, rounds


def test_inference_moves_in_the_same_round_before_training_takes_its_cores(monkeypatch):
    m, log, rounds = _run(120.0, monkeypatch)  # 120 s: an SLO window starts, a joint round
    at = [e for e in log if e[0] == 120.0]
    assert at == [(120.0, "inference", ("MigrateReplica",)), (120.0, "training", ("Resize",))]
    joint = next(r for r in rounds if r.t == 120.0)
    assert joint.inference["svc"]["replicas"] == [("g-0000", 4.0)]  # where it was when training decided
    assert any(d.startswith("MigrateReplica") and "inference-0000" in d for d in joint.decisions)
    assert m["migrations"] == 1 and m["evictions"] == 0
    assert m["training_slowdown_pct"] == 0.0  # training never waited for the cores it took
    assert m["slo_attainment_pct"] == 100.0


def test_a_growth_between_windows_moves_inference_first_in_that_round(monkeypatch):
    """Training grows at 90 s, between SLO windows, onto the replica's cores: that round
    harvests too, on the window's measurements and the growth, and the replica moves before
    training takes the cores, as at a window. The other rounds between windows harvest
    nothing."""
    m, log, _ = _run(90.0, monkeypatch)
    at = [e for e in log if e[0] == 90.0]
    assert at == [(90.0, "inference", ("MigrateReplica",)), (90.0, "training", ("Resize",))]
    assert m["training_slowdown_pct"] == 0.0
    assert m["harvest_rounds"] == m["service_windows"] + 1  # (one service) each window's round, and 90 s


def test_a_growth_between_windows_that_leaves_the_replica_its_cores_harvests_nothing(monkeypatch):
    """The worker grows from 4 to 6 cores at 90 s: with its PS and the replica's 4 cores that is
    11 of the 14 the node leaves, so inference has no reason to move and that round is
    training's alone."""
    m, log, _ = _run(90.0, monkeypatch, cores=6.0)
    assert [e for e in log if e[0] == 90.0] == [(90.0, "training", ("Resize",))]
    assert m["harvest_rounds"] == m["service_windows"]  # (one service) the windows' rounds only


def test_the_joint_round_counts_the_growth_in_what_the_harvest_policy_sees():
    """The policy's view of the node in the joint round already holds the cores training decided
    to take (its limits and need grow by 8), so its guard moves the replica."""
    seen = []

    class Spy:
        name, interval_s = "spy", 60.0

        def __init__(self):
            self.inner = make_policy("reamer", kind="harvest", interval_s=60.0)

        def decide(self, snap):
            seen.append((snap.now, snap.usage["g-0000"].training_limit))
            return self.inner.decide(snap)

    simulate(SC, GrowAt(120.0, 12.0), jobs=JOBS, harvest=Spy())
    limits = dict(seen)
    assert limits[60.0] == pytest.approx(5.0) and limits[120.0] == pytest.approx(13.0)


def test_without_coordination_the_growth_at_a_window_finds_the_replica_still_there(monkeypatch):
    """``coordination: none``: at 120 s the harvest round decides on what it measured before the
    growth, so the replica stays and training runs contended until the next window."""
    alone = SC.model_copy(update={"inference": SC.inference.model_copy(update={"coordination": "none"})})
    m, log, _ = _run(120.0, monkeypatch, alone)
    at = [e for e in log if e[0] == 120.0]
    assert at == [(120.0, "training", ("Resize",))]
    assert (180.0, "inference", ("MigrateReplica",)) in log
    assert m["training_slowdown_pct"] > 0.1
