"""The training-need generator reproduces the statistics it cites (docs/design.md#trainings-cpu-need):
the time variation of PAI's mini-batch times, and PAI's share of tasks using more CPU than
they request."""

from __future__ import annotations

import csv
import importlib.util
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from reamer.models.zoo import ZOO
from reamer.workloads.need import (
    PAI2020_SHARE_ABOVE_REQUEST,
    Ar1,
    NeedProcess,
    calibrate_scale,
    input_need,
    pai2020_variation,
    share_above,
)

REPO = Path(__file__).resolve().parents[2]
WINDOWS = 4000


def _series(proc: NeedProcess, n: int = WINDOWS) -> np.ndarray:
    return np.array([proc.step(["j"])["j"] for _ in range(n)])


def _cov(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


def test_a_process_has_mean_one_and_the_coefficient_of_variation_and_correlation_it_is_given():
    p = Ar1(0.3, 0.9)
    x = _series(NeedProcess(7, p), 40_000)
    assert abs(x.mean() - 1.0) < 0.02
    assert _cov(x) == pytest.approx(math.sqrt(math.exp(p.sd_log ** 2) - 1.0), rel=0.05)
    lx = np.log(x)
    assert np.corrcoef(lx[:-1], lx[1:])[0, 1] == pytest.approx(p.corr, abs=0.02)


def test_jobs_keep_their_own_process_and_are_forgotten_when_gone():
    proc = NeedProcess(1, pai2020_variation())
    proc.step(["a", "b"])
    pa = proc.state["a"][1]
    for _ in range(5):
        proc.step(["a", "b"])
    assert proc.state["a"][1] is pa
    proc.step(["b"])
    assert set(proc.state) == {"b"}


def test_a_job_draws_the_same_factors_whichever_jobs_run_beside_it():
    """Common random numbers: policies compared on one seed start and run jobs in different
    orders and beside different jobs; each job must still face the same need."""
    alone, crowded = NeedProcess(5, pai2020_variation()), NeedProcess(5, pai2020_variation())
    xa = [alone.step(["j"])["j"] for _ in range(50)]
    xb = [crowded.step(["x", f"y{k}", "j"] if k % 2 else ["j", "x"])["j"] for k in range(50)]
    assert xa == xb
    assert [NeedProcess(6, pai2020_variation()).step(["j"])["j"]] != xa[:1]


def test_pai2020_jobs_vary_over_time_as_the_trace_workers_do():
    """Tolerances (docs/design.md#trainings-cpu-need): the median, 90th percentile and mean of the per-job
    coefficient of variation within 10 % of the trace's 40 worker series. Each process runs
    20,000 windows: the sample CoV of a correlated series converges slowly."""
    pairs = pai2020_variation()
    gen = [_cov(_series(NeedProcess(3 + k, p), 20_000)) for k, p in enumerate(pairs)]
    trace = [s["cov"] for s in _fitted()]
    assert len(gen) == len(trace) == 40
    assert statistics.median(gen) == pytest.approx(statistics.median(trace), rel=0.10)
    assert np.percentile(gen, 90) == pytest.approx(np.percentile(trace, 90), rel=0.10)
    assert statistics.fmean(gen) == pytest.approx(statistics.fmean(trace), rel=0.10)


def _fitted() -> list[dict]:
    import json
    from importlib import resources

    return json.loads(resources.files("reamer.data").joinpath("need_variation.json").read_text())["series"]


def test_the_shipped_fit_is_the_fit_of_the_trace(shared_data):
    folder = shared_data / "pai2020_minibatch"
    if not (folder / "job_1_norm.csv").is_file():
        pytest.skip(f"PAI mini-batch times not found in {folder}")
    spec = importlib.util.spec_from_file_location("fit_need_variation", REPO / "tools" / "fit_need_variation.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    fresh = [(sid, tool.fit(x)) for sid, x in tool.series(folder)]
    shipped = _fitted()
    assert [sid for sid, _ in fresh] == [s["id"] for s in shipped]
    for (_, f), s in zip(fresh, shipped, strict=True):
        assert f["sd_log"] == pytest.approx(s["sd_log"], abs=1e-5) and f["corr"] == pytest.approx(s["corr"], abs=1e-5)


def test_the_calibrated_scale_gives_the_share_it_was_calibrated_to():
    req = np.array([1.0, 2.0, 4.0, 8.0, 1.0, 2.0, 4.0, 8.0])
    need = np.array([1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0])
    k = calibrate_scale(req, need, share=0.5)  # 4 of 8 above: 1 × k > 1, 3 × k > 1, 2 and 4 (k > 4/3)
    assert share_above(k, req, need) == 0.5 and 4 / 3 <= k <= 4 / 3 * 1.002
    with pytest.raises(ValueError):
        calibrate_scale(req, np.zeros(8))


def test_on_the_openb_gpu_pods_a_scale_gives_pai2020s_share_of_tasks_above_their_request(shared_data):
    """The level of training's need: one scale on every model's input cost (CPU per sample ×
    GPU rate, the zoo's), at which 15.51 % of openb's GPU pods × the models need more CPU than
    they requested (PAI's share; tolerance 1 point: pods of one request cross it together)."""
    with (shared_data / "openb_pod_list_default.csv").open() as f:
        req = [float(r["cpu_milli"]) / 1000 / (int(r["num_gpu"]) * float(r["gpu_milli"]) / 1000)
               for r in csv.DictReader(f) if int(r["num_gpu"] or 0) > 0]
    needs = np.array([input_need(m, 1.0) for m in ZOO.values() if m.gpu_samples_per_s > 0])
    pairs_req, pairs_need = np.repeat(req, needs.size), np.tile(needs, len(req))  # every pod × every model
    k = calibrate_scale(pairs_req, pairs_need)
    assert share_above(k, pairs_req, pairs_need) == pytest.approx(PAI2020_SHARE_ABOVE_REQUEST, abs=0.01)


def test_a_runs_scale_is_calibrated_on_its_own_gpu_jobs():
    from reamer.domain import Resources, TrainingJob
    from reamer.workloads.need import need_scale

    def job(i, cpu, model="resnet50", gpu=1.0):
        return TrainingJob(f"j{i}", model, 0.0, 1e6, 1, 1, Resources(1.0, 1024.0), Resources(cpu, 1024.0, gpu), 32)

    jobs = [job(i, c) for i, c in enumerate([2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0])] + [job(9, 1.0, gpu=0.0)]
    k = need_scale("pai2020", jobs, ZOO)  # 1 of 7 GPU jobs above its request is nearest 15.51 %
    need = input_need(ZOO["resnet50"], 1.0)
    assert k * need > 2.0 and k * need <= 4.0
    assert need_scale(1.5, jobs, ZOO) == 1.5
    assert need_scale("pai2020", [job(9, 1.0, gpu=0.0)], ZOO) == 1.0  # no GPU job: nothing to calibrate
