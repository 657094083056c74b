"""Training speed model for synchronous parameter-server data-parallel jobs (docs/design.md#training-speed-model).

Per step, with w workers and p PS shards:

* worker compute  ``T_comp = b·F / E(c_w, threads)``  (CPU workers); GPU workers compute
  ``b / gpu_rate`` while a CPU input pipeline prepares the next batch in the background
  (``T_pipe = b·d / E(c_w)``, prefetch as in tf.data / DataLoader workers): the step stalls
  only when ``T_pipe`` exceeds the rest of the step, so speed ≤ ``min(GPU rate, E/d)``;
* network         ``T_net = max(2S/B_worker, 2·w·S/(p·B_ps))``;
* PS update       ``T_ps = w·(S/p)·u / E(c_ps)``;
* step time       ``T = T_comp + T_net + T_ps``; speed ``w·b/T`` samples/s.

``E`` is Amdahl-effective cores with a penalty when the framework runs more threads
than the CPU quota allows. Every constant lives in :class:`Calibration` or in the
model zoo, each with its source; none is tuned here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class Calibration:
    """Machine constants, measured by ``reamer calibrate`` (:mod:`reamer.models.profiles` loads them)."""

    core_gflops: float  # achieved training GFLOP/s of one core (fwd+bwd, fp32)
    parallel_fraction: float  # Amdahl parallel fraction of a training step
    oversub_penalty: float  # slowdown per unit of threads/quota above 1
    ps_update_ns_per_byte: float  # PS: core-ns to apply one byte of gradient (read+add+write)
    source: str = ""
    max_cores: float | None = None  # the most cores ``parallel_fraction`` was measured at (None: not recorded)


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """A trainable model: published size/FLOPs plus per-sample CPU input cost on GPU jobs."""

    name: str
    params_m: float  # parameters, millions (published)
    fwd_gflops: float  # forward GFLOPs per sample (published)
    batch: int = 32  # default per-worker batch
    gpu_samples_per_s: float = 0.0  # training throughput of one full GPU (published benchmark)
    input_core_s_per_sample: float = 0.002  # CPU input pipeline cost per sample (decode+augment)
    source: str = ""
    # measured by ``reamer calibrate`` (reamer.models.profiles): training core-seconds per sample
    # on one core (wins over the FLOPs estimate) and this model's own Amdahl fraction (None:
    # the machine's ``Calibration.parallel_fraction``)
    measured_core_s_per_sample: float | None = None
    parallel_fraction: float | None = None
    max_cores: float | None = None  # the most cores its own fraction was measured at (None: not recorded)

    @property
    def param_bytes(self) -> float:
        return self.params_m * 1e6 * 4.0  # fp32

    def core_s_per_sample(self, cal: Calibration) -> float:
        """Training core-seconds per sample on one core: measured when the profile has it,
        else fwd+bwd ≈ 3× forward FLOPs at the calibrated core speed."""
        if self.measured_core_s_per_sample is not None:
            return self.measured_core_s_per_sample
        return 3.0 * self.fwd_gflops / cal.core_gflops


def fraction_of(model: ModelProfile, cal: Calibration) -> tuple[float, float | None]:
    """The Amdahl fraction the speed model uses for ``model``'s workers and the most cores it
    holds for: the model's own curve when its profile has one, else the machine's."""
    if model.parallel_fraction is not None:
        return model.parallel_fraction, model.max_cores
    return cal.parallel_fraction, cal.max_cores


def effective_cores(cores: float, threads: int | None, cal: Calibration) -> float:
    """Amdahl-effective cores of a CPU quota of ``cores`` running ``threads`` threads.

    ``threads=None`` means container-aware sizing as the local launcher does it: the quota
    rounded half up, at least one thread. Below one core the quota is a time share.
    """
    return _effective(cores, threads, cal.parallel_fraction, cal.oversub_penalty)


def _effective(cores: float, threads: int | None, f: float, oversub_penalty: float) -> float:
    """:func:`effective_cores` at parallel fraction ``f``."""
    if cores <= 0:
        return 0.0
    if threads is None:
        threads = max(1, math.floor(cores + 0.5))
    n = min(cores, float(threads))
    e = n if n <= 1.0 else 1.0 / ((1.0 - f) + f / n)
    over = threads / cores - 1.0
    if over > 0:
        e /= 1.0 + oversub_penalty * over
    return e


@dataclass(frozen=True, slots=True)
class Side:
    """One container of a job as the model sees it: cores, GPU share, bandwidth, threads."""

    cores: float
    bw_gbps: float
    gpu: float = 0.0
    threads: int | None = None


class Step(NamedTuple):
    """One step's time breakdown and what it keeps busy (immutable; a named tuple, not a
    dataclass: the simulator makes one per job re-timing)."""

    t_comp: float
    t_net: float
    t_ps: float
    speed: float  # samples/s
    worker_busy: float  # share of the step workers' CPUs compute
    ps_busy: float  # share of the step PS CPUs update
    net_busy: float  # share of the step spent on the network
    gpu_busy: float  # share of the step GPUs compute
    t_pipe: float = 0.0  # GPU workers: input-pipeline time per batch (overlaps the step)
    cpu_used: float = 0.0  # cores the job's containers keep busy, on average
    gpu_used: float = 0.0  # GPUs the job keeps busy, on average

    @property
    def t(self) -> float:
        return self.t_comp + self.t_net + self.t_ps

    @property
    def bottleneck(self) -> str:
        """The largest term: ``compute``, ``network`` or ``ps``."""
        parts = {"compute": self.t_comp, "network": self.t_net, "ps": self.t_ps}
        return max(parts, key=parts.__getitem__)


ZERO_STEP = Step(math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def step(
    model: ModelProfile,
    cal: Calibration,
    batch: int,
    workers: list[Side],
    ps: list[Side],
    input_scale: float = 1.0,
) -> Step:
    """Step-time breakdown of a synchronous PS job (slowest worker / PS link decides).
    ``input_scale`` multiplies the model's input-pipeline cost per sample."""
    if not workers or not ps:
        return ZERO_STEP
    plan = plan_step(model, cal, batch, [(w.cores, w.gpu, w.threads) for w in workers],
                     [(p.cores, p.threads) for p in ps])
    return plan.at(min(w.bw_gbps for w in workers), min(p.bw_gbps for p in ps), input_scale)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What a step is made of apart from its links and its input pipeline's cost per sample:
    :meth:`at` finishes it for the slowest worker and PS links and one such cost (a job whose
    links' shares or data-loading need move keeps the plan of its cores)."""

    pipe_s: float  # the model's input-pipeline core-seconds per sample
    batch: int
    workers: int
    bits: float  # one copy of the parameters, in bits
    shards: int  # PS containers
    terms: tuple[tuple[float, float, float], ...]  # per worker (GPU: its effective cores, busy cores; CPU: 0, 0, its core-s)
    t_comp: float  # slowest CPU worker's compute
    gpu_t: float
    gpu_s: float
    t_ps: float
    ps_cores: float  # cores the PS containers keep busy while they update

    def at(self, worker_gbps: float, ps_gbps: float, input_scale: float = 1.0) -> Step:
        b_w, b_ps, bits = worker_gbps * 1e9, ps_gbps * 1e9, self.bits
        t_net = (max(2.0 * bits / b_w, 2.0 * self.workers * bits / (self.shards * b_ps)) if b_w > 0 and b_ps > 0
                 else math.inf)
        pipe = self.pipe_s if input_scale == 1.0 else self.pipe_s * input_scale
        batch, t_pipe, cpu_s = self.batch, 0.0, 0.0
        for e, busy_cores, core_s in self.terms:  # in worker order, as the core-seconds add up
            if e > 0:
                t_pipe = max(t_pipe, batch * pipe / e)
                cpu_s += batch * pipe * busy_cores / e
            else:
                cpu_s += core_s
        t_comp, gpu_t, t_ps = self.t_comp, self.gpu_t, self.t_ps
        if gpu_t > 0:  # the pipeline prefetches the next batch while the step runs: it stalls
            t_comp = max(t_comp, gpu_t + max(0.0, t_pipe - (gpu_t + t_net + t_ps)))  # only if slower
        t = t_comp + t_net + t_ps
        cpu_s += self.ps_cores * t_ps
        # t_comp, t_net, t_ps, speed, worker_busy, ps_busy, net_busy, gpu_busy, t_pipe, cpu_used, gpu_used
        return Step(t_comp, t_net, t_ps, self.workers * batch / t, t_comp / t, t_ps / t, t_net / t, gpu_t / t, t_pipe,
                    cpu_s / t, self.gpu_s / t)


class _Zero:
    """The plan of a job that cannot step (no worker or PS, or one without cores)."""

    @staticmethod
    def at(worker_gbps: float, ps_gbps: float, input_scale: float = 1.0) -> Step:
        return ZERO_STEP


_NO_STEP = _Zero()

def plan_step(model: ModelProfile, cal: Calibration, batch: int, workers: Sequence[tuple[float, float, int | None]],
              ps: Sequence[tuple[float, int | None]]) -> StepPlan | _Zero:
    """The plan of :func:`step` for workers given as (cores, GPUs, threads) and PS containers
    as (cores, threads)."""
    w, p = len(workers), len(ps)
    if w == 0 or p == 0:
        return _NO_STEP
    s_bytes = model.param_bytes
    f = model.core_s_per_sample(cal)
    t_comp = 0.0
    gpu_t = 0.0
    gpu_s = 0.0  # GPU-seconds all workers use per step
    terms = []
    pf = fraction_of(model, cal)[0]
    for cores, gpu, threads in workers:
        e = _effective(cores, threads, pf, cal.oversub_penalty)
        if e <= 0:
            return _NO_STEP
        busy_cores = min(cores, float(threads or cores))
        if gpu > 0 and model.gpu_samples_per_s > 0:
            gpu_rate = model.gpu_samples_per_s * gpu
            gpu_t = max(gpu_t, batch / gpu_rate)
            terms.append((e, busy_cores, 0.0))
            gpu_s += gpu * batch / gpu_rate
        else:
            t_i = batch * f / e
            t_comp = max(t_comp, t_i)
            terms.append((0.0, 0.0, busy_cores * t_i))
    e_ps = min(effective_cores(cores, threads, cal) for cores, threads in ps)
    if e_ps <= 0:
        return _NO_STEP
    t_ps = w * (s_bytes / p) * cal.ps_update_ns_per_byte * 1e-9 / e_ps
    ps_cores = sum(min(cores, float(threads or cores)) for cores, threads in ps)
    return StepPlan(model.input_core_s_per_sample, batch, w, 8.0 * s_bytes, p, tuple(terms), t_comp, gpu_t, gpu_s,
                    t_ps, ps_cores)
