from hypothesis import given
from hypothesis import strategies as st

from reamer.models.training import Calibration, Side, effective_cores, step
from reamer.models.profiles import shipped_profiles
from reamer.models.zoo import ZOO

CAL = shipped_profiles().calibration


def test_shipped_calibration_has_a_source():
    assert CAL.source and CAL.core_gflops > 0 and 0 < CAL.parallel_fraction <= 1


@given(st.floats(0.1, 64), st.floats(0.1, 64), st.integers(1, 64))
def test_effective_cores_monotone_for_a_thread_count(a, b, threads):
    lo, hi = sorted((a, b))
    assert effective_cores(lo, threads, CAL) <= effective_cores(hi, threads, CAL) + 1e-9


@given(st.integers(1, 63))
def test_aware_sizing_monotone_over_whole_cores(c):
    # (between whole cores, rounding a quota of n + 0.5 up to n + 1 threads can cost a
    # little: the measured oversubscription penalty; see launcher.threads_for)
    assert effective_cores(c, None, CAL) <= effective_cores(c + 1, None, CAL) + 1e-9


def test_oversubscription_penalty():
    aware = effective_cores(1.0, None, CAL)
    default = effective_cores(1.0, 32, CAL)
    assert default < aware
    cal = Calibration(30, 0.9, 0.0, 0.5)
    assert effective_cores(1.0, 32, cal) == effective_cores(1.0, None, cal)


def test_more_ps_relieves_a_network_bound_job():
    m = ZOO["vgg16"]  # 553 MB of parameters: network-heavy
    workers = [Side(8, 1.0)] * 4
    one = step(m, CAL, 32, workers, [Side(4, 1.0)])
    two = step(m, CAL, 32, workers, [Side(4, 1.0)] * 2)
    assert one.bottleneck == "network"
    assert two.speed > one.speed


def test_more_cores_speed_up_a_compute_bound_job():
    m = ZOO["resnet50"]
    a = step(m, CAL, 32, [Side(1, 10)] * 2, [Side(1, 10)])
    b = step(m, CAL, 32, [Side(4, 10)] * 2, [Side(1, 10)])
    assert a.bottleneck == "compute" and b.speed > a.speed


def test_gpu_worker_limited_by_input_pipeline():
    m = ZOO["resnet50"]
    starved = step(m, CAL, 32, [Side(0.5, 10, gpu=1.0)], [Side(1, 10)])
    fed = step(m, CAL, 32, [Side(8, 10, gpu=1.0)], [Side(1, 10)])
    assert starved.speed < fed.speed <= m.gpu_samples_per_s
    assert 0 < fed.gpu_used <= 1.0


def test_no_worker_means_no_speed():
    assert step(ZOO["resnet50"], CAL, 32, [], [Side(1, 10)]).speed == 0


def test_input_scale_is_the_model_with_that_input_cost():
    """A drifting data-loading need (``input_scale``) steps exactly as a model whose input cost
    per sample is scaled, and the plan of a job's cores finishes to the same step as ``step``."""
    from dataclasses import replace

    from reamer.models.training import plan_step

    m = ZOO["resnet50"]
    workers, ps = [Side(3.0, 25.0, gpu=1.0), Side(2.0, 10.0, gpu=0.5)], [Side(1.5, 40.0)]
    for k in (0.4, 1.0, 2.7):
        scaled = replace(m, input_core_s_per_sample=m.input_core_s_per_sample * k)
        assert step(m, CAL, 32, workers, ps, input_scale=k) == step(scaled, CAL, 32, workers, ps)
    plan = plan_step(m, CAL, 32, [(w.cores, w.gpu, w.threads) for w in workers], [(p.cores, p.threads) for p in ps])
    assert plan.at(10.0, 40.0, 2.7) == step(m, CAL, 32, workers, ps, input_scale=2.7)
    assert plan.at(10.0, 5.0).t_net > plan.at(10.0, 40.0).t_net  # the links are the plan's caller's
