"""The calibrated profile: one JSON file with every measured constant of the performance models.

``reamer calibrate`` (:mod:`reamer.calibration`) measures it on a machine; the package ships
the one measured on the reference machine (``reamer/data/profiles.json``); ``reamer simulate
--profiles FILE`` (or ``REAMER_PROFILES``) replaces it. The format is documented in
``docs/calibration.md``; in short::

    {"format": "reamer-profile/1",
     "machine": {"cpu", "nproc", "torch", "onnxruntime", "python", "date"},
     "training": {"core_gflops", "parallel_fraction", "oversub_penalty", "ps_update_ns_per_byte", "source",
                  "max_cores"},
     "models": {NAME: {"params_m", "fwd_gflops", "core_s_per_sample", "parallel_fraction", "batch",
                       "measured": [[cores, samples_per_s], ...], "source"}},
     "inference": {NAME: {"a_ms", "b_ms", "parallel_fraction", "measured": [[cores, batch, ms], ...], ...}},
     "interference": {"training_interference", "inference_interference", "source"}}

:func:`load_profiles` validates it (one-line :class:`~reamer.errors.InputError` naming the file
and the field) and returns :class:`Profiles`: the :class:`Calibration`, the training models
(measured ones merged over the zoo), the inference profiles and the interference coefficients.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import Field

from reamer.config.base import Fraction, NonNeg, Pos, Strict, validate
from reamer.errors import InputError, read_user_text
from reamer.models.inference import InferenceProfile
from reamer.models.training import Calibration, ModelProfile
from reamer.models.zoo import ZOO

FORMAT = "reamer-profile/1"
SHIPPED = "reamer/data/profiles.json"

Diagnostics = dict[str, float | int | str | bool | None]
# how request_ms / delay_ms were measured: scalars, and the loaded runs the fit used (with the
# load generator's schedule options, ``load_args``, to replay their arrivals)
ServingDiagnostics = dict[str, float | int | str | bool | None | list[dict[str, float | int | list[str]]]]


class MachineInfo(Strict):
    cpu: str
    nproc: Annotated[int, Field(ge=1)]
    torch: str | None = None
    onnxruntime: str | None = None
    python: str | None = None
    kernel: str | None = None
    date: str  # ISO date of the run


class TrainingSection(Strict):
    core_gflops: Pos
    parallel_fraction: Fraction
    oversub_penalty: NonNeg
    ps_update_ns_per_byte: Pos
    source: Annotated[str, Field(min_length=1)]
    max_cores: Pos | None = None  # the most cores parallel_fraction was measured at
    diagnostics: Diagnostics = Field(default_factory=dict)


class ModelEntry(Strict):
    params_m: Pos  # counted
    fwd_gflops: Pos  # counted (torch.utils.flop_counter)
    core_s_per_sample: Pos  # measured fwd+bwd at one core / one thread
    parallel_fraction: Fraction | None = None  # fitted to ``measured``
    batch: Annotated[int, Field(ge=1)]
    measured: list[tuple[Pos, Pos]] = Field(default_factory=list)  # [cores, samples_per_s]
    source: Annotated[str, Field(min_length=1)]


class InferenceEntry(Strict):
    a_ms: NonNeg
    b_ms: Pos
    parallel_fraction: Fraction
    measured: list[tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)], Pos]] = Field(default_factory=list)
    contended: list[tuple[int, int, float]] = Field(default_factory=list)
    fit_rms_err_pct: NonNeg | None = None
    params_m: NonNeg = 0.0
    input: str = ""
    request_ms: NonNeg = 0.0  # server CPU per request besides the model (measured through the server)
    delay_ms: NonNeg = 0.0  # fixed latency per request outside the server's CPU (client stack, loopback)
    serving: ServingDiagnostics = Field(default_factory=dict)
    source: str = ""


class InterferenceSection(Strict):
    training_interference: NonNeg  # training speed ÷ (1 + this × inference cores / node cores)
    inference_interference: NonNeg  # replica latency × (1 + this × training use / node cores)
    source: Annotated[str, Field(min_length=1)]
    diagnostics: Diagnostics = Field(default_factory=dict)


class ProfileFile(Strict):
    format: Literal["reamer-profile/1"]
    machine: MachineInfo
    training: TrainingSection
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    inference: dict[str, InferenceEntry] = Field(default_factory=dict)
    interference: InterferenceSection | None = None


@dataclass(frozen=True, slots=True)
class Interference:
    """Co-location coefficients, in the form the simulator uses (backends/sim/inference.py)."""

    training: float  # training_interference
    inference: float  # inference_interference
    source: str = ""


@dataclass(frozen=True, slots=True)
class Profiles:
    """Everything a simulation takes from the calibrated profile."""

    source: str  # the file it was read from
    machine: MachineInfo
    calibration: Calibration
    measured_models: Mapping[str, ModelProfile]  # the models the profile measured
    inference: Mapping[str, InferenceProfile]
    interference: Interference | None
    doc: ProfileFile = field(repr=False)

    @property
    def models(self) -> Mapping[str, ModelProfile]:
        """Training models for the simulator: the zoo with the measured models merged over it."""
        return MappingProxyType({**ZOO, **self.measured_models})


def with_parallel_fraction(prof: Profiles, f: float) -> Profiles:
    """``prof`` with one Amdahl fraction ``f`` for every training model and the PS (a what-if:
    no measured range, so no run notes an extrapolation)."""
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"parallel fraction {f} is not in [0, 1]")
    models = {n: replace(m, parallel_fraction=f, max_cores=None) for n, m in prof.models.items()}
    return replace(prof, source=f"{prof.source} at parallel fraction {f:g} (what-if)",
                   calibration=replace(prof.calibration, parallel_fraction=f, max_cores=None),
                   measured_models=MappingProxyType(models))


def model_profile(name: str, m: ModelEntry) -> ModelProfile:
    """A measured model as the speed model sees it (a zoo model keeps its GPU figures)."""
    base = ZOO.get(name)
    return ModelProfile(
        name, m.params_m, m.fwd_gflops, m.batch,
        gpu_samples_per_s=base.gpu_samples_per_s if base else 0.0,
        input_core_s_per_sample=base.input_core_s_per_sample if base else ModelProfile.input_core_s_per_sample,
        source=m.source, measured_core_s_per_sample=m.core_s_per_sample, parallel_fraction=m.parallel_fraction,
        max_cores=max((c for c, _ in m.measured), default=None) if m.parallel_fraction is not None else None,
    )  # fmt: skip


def inference_profile(name: str, m: InferenceEntry) -> InferenceProfile:
    return InferenceProfile(name, m.a_ms / 1e3, m.b_ms / 1e3, m.parallel_fraction,
                            tuple((c, b, ms / 1e3) for c, b, ms in m.measured), m.input, m.params_m,
                            m.request_ms / 1e3, m.delay_ms / 1e3)  # fmt: skip


def parse_profiles(data: Any, source: str) -> Profiles:
    """Validate a decoded profile document; bad content → one-line InputError naming the field."""
    doc = validate(ProfileFile, data, source)
    t = doc.training
    cal = Calibration(t.core_gflops, t.parallel_fraction, t.oversub_penalty, t.ps_update_ns_per_byte, t.source,
                      t.max_cores)
    inter = doc.interference
    return Profiles(
        source=source,
        machine=doc.machine,
        calibration=cal,
        measured_models=MappingProxyType({n: model_profile(n, m) for n, m in doc.models.items()}),
        inference=MappingProxyType({n: inference_profile(n, m) for n, m in doc.inference.items()}),
        interference=Interference(inter.training_interference, inter.inference_interference, inter.source)
        if inter is not None else None,
        doc=doc,
    )  # fmt: skip


def read_profile_json(path: str | Path | None) -> tuple[Any, str]:
    """(decoded JSON, source name) of ``path`` or of the shipped profile."""
    if path is None:
        return json.loads(resources.files("reamer.data").joinpath("profiles.json").read_text()), SHIPPED
    source = str(path)
    text = read_user_text(path, "a readable profile JSON file")
    try:
        return json.loads(text), source
    except json.JSONDecodeError as e:
        raise InputError(source, f"line {e.lineno}", f"valid JSON ({e.msg})") from None


def load_profiles(path: str | Path | None = None) -> Profiles:
    """The shipped profile (``path=None``) or the one in ``path``, validated: the one loader
    of the profile format."""
    if path is None:
        return shipped_profiles()
    data, source = read_profile_json(path)
    return parse_profiles(data, source)


@lru_cache(maxsize=1)
def shipped_profiles() -> Profiles:
    """The profile measured on the reference machine (``reamer/data/profiles.json``), read once."""
    return parse_profiles(*read_profile_json(None))
