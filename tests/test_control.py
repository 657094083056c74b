"""The control rounds: the order of observe → decide → actuate, and the joint round's rule
that inference moves before training takes its CPU."""

from __future__ import annotations

from reamer.control import control_round, joint_round


class Log(list):
    pass


def _fakes(log: Log):
    class Training:
        def observe(self, now):
            log.append("train.observe")
            return "snap"

        def actuate(self, d, now):
            log.append(f"train.actuate {d}")

    class Policy:
        name, interval_s = "p", 1.0

        def decide(self, snap):
            log.append(f"train.decide {snap}")
            return ["grow"]

    class Inference:
        def expect(self, d):
            log.append(f"inf.expect {list(d)}")

        def observe(self, now):
            log.append("inf.observe")
            return "hsnap"

        def actuate(self, d, now):
            log.append(f"inf.actuate {d}")

    class HPolicy:
        name, interval_s = "h", 1.0

        def decide(self, snap):
            log.append(f"inf.decide {snap}")
            return ["migrate"]

    return Training(), Policy(), Inference(), HPolicy()


def test_control_round_order_and_round_keeps_the_snapshot():
    log = Log()
    t, p, _, _ = _fakes(log)
    r = control_round(t, p, 5.0)
    assert log == ["train.observe", "train.decide snap", "train.actuate ('grow',)"]
    assert (r.now, r.decisions, r.snapshot) == (5.0, ("grow",), "snap")


def test_joint_round_inference_yields_before_training_grows():
    log = Log()
    t, p, i, h = _fakes(log)
    tr, hr = joint_round(t, p, i, h, 1.0)
    assert log == ["train.observe", "train.decide snap", "inf.expect ['grow']", "inf.observe", "inf.decide hsnap",
                   "inf.actuate ('migrate',)", "train.actuate ('grow',)"]
    assert tr.decisions == ("grow",) and hr.decisions == ("migrate",) and hr.snapshot == "hsnap"
