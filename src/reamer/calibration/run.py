"""Run the calibration parts and assemble the profile document (``docs/calibration.md``).

:func:`calibrate` measures the requested ``parts`` on this machine and returns a validated
profile: what it measured replaces the matching sections (and, for ``models`` / ``inference``,
the matching model entries) of a base profile (default: the shipped one), whose other
entries are carried over with their own ``source``. Quota- and pinning-based measurements
need writable cgroups (root); without them they are skipped with a one-line reason and the
base profile's values are kept (the ``source`` says so).
"""

from __future__ import annotations

import copy
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from reamer.calibration import inference, interference, oversub, serving, training
from reamer.calibration.machine import LoadMeter, machine_info
from reamer.calibration.worker import open_cgroups
from reamer.errors import InputError
from reamer.models.profiles import FORMAT, parse_profiles, read_profile_json

log = logging.getLogger(__name__)
PARTS = ("training", "models", "inference", "interference")
BACKGROUND_WARN = 0.1  # cores of other processes' CPU use that contaminate a measurement


@dataclass(frozen=True)
class Settings:
    """Run lengths of one calibration (``quick``: about a minute on 2 cores)."""

    ref_rounds: int
    ref_steps: int
    ps_repeats: int
    quota_window_s: float
    quota_rounds: int
    model_seconds: float
    model_rounds: int
    inter_window_s: float
    inter_rounds: int
    retry_s: float  # longest retry of a sample disturbed by other processes (models, inference)

    @classmethod
    def of(cls, quick: bool) -> Settings:
        if quick:
            return cls(4, 3, 10, 0.5, 1, 0.6, 2, 0.6, 2, 0.0)
        return cls(24, 5, 30, 1.5, 8, 6.0, 6, 3.0, 6, 20.0)


def real_models() -> list[str]:
    from reamer.workloads.real.nets import MODELS

    return list(MODELS)


def check_parts(parts: Sequence[str], inference_models: Sequence[str]) -> None:
    from reamer.calibration.archs import MODELS as ARCHS

    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise InputError("--parts", "value", f"a comma-separated subset of {', '.join(PARTS)}", ",".join(parts))
    known = [*real_models(), *ARCHS]
    bad = [m for m in inference_models if m not in known]
    if bad:
        raise InputError("--inference-models", "value", f"model names from {', '.join(known)}", ",".join(bad))


def total_steps(parts: Sequence[str], inference_models: Sequence[str], quick: bool, cgroups: bool, nproc: int) -> int:
    s = Settings.of(quick)
    n = 0
    if "training" in parts:
        n += s.ref_rounds + 1 + (oversub.steps(s.quota_rounds) if cgroups else 0)
    if "models" in parts:
        n += s.model_rounds * len(real_models())
    if "inference" in parts:
        n += inference.steps(list(inference_models), quick)
        if cgroups:
            n += sum(1 for m in inference_models if m in real_models())
    if "interference" in parts and cgroups and nproc >= 2:
        n += interference.steps(s.inter_rounds)
    return n


def calibrate(
    quick: bool = False,
    parts: Sequence[str] = PARTS,
    inference_models: Sequence[str] | None = None,
    base: str | Path | None = None,
    on_start: Callable[[int], None] = lambda total: None,
    tick: Callable[[str], None] = lambda desc: None,
) -> dict:
    """Measure ``parts`` and return the profile document (validated; not written anywhere)."""
    inference_models = list(inference_models) if inference_models is not None else real_models()
    check_parts(parts, inference_models)
    base_doc, base_source = read_profile_json(base)
    parse_profiles(base_doc, base_source)  # a broken base fails before any measurement
    doc = copy.deepcopy(base_doc)
    s = Settings.of(quick)
    m = machine_info()
    nproc = m["nproc"]
    ex, reason = open_cgroups()
    try:
        on_start(total_steps(parts, inference_models, quick, ex is not None, nproc))
        tag = f"reamer calibrate{' --quick' if quick else ''} on {m['cpu']}, {nproc} cores, {m['date']}"
        carried = [p for p in PARTS if p not in parts and doc.get(p)]
        if carried and base_doc.get("machine", {}).get("cpu") != m["cpu"]:
            log.warning(f"{', '.join(carried)} carried over from {base_source}, measured on another CPU")
        doc["format"] = FORMAT
        doc["machine"] = m

        t_part = [time.perf_counter()]

        def step(desc: str) -> Callable[[], None]:
            return lambda: tick(desc)

        def done(part: str) -> None:
            now = time.perf_counter()
            log.info(f"{part}: {now - t_part[0]:.0f} s")
            t_part[0] = now

        if "training" in parts:
            meter = LoadMeter()
            ref = training.measure_reference(s.ref_rounds, s.ref_steps, step("training: core speed, 1 vs 2 threads"))
            ps = training.measure_ps(s.ps_repeats)
            tick("training: PS update")
            diag = {k: round(v, 6) for k, v in ref.items() if k not in ("core_gflops", "parallel_fraction", "max_cores")}
            source = f"{tag}, torch {m['torch']}"
            if ex is not None:
                over = oversub.measure(ex, s.quota_window_s, s.quota_rounds, step("training: CPU quotas"))
                k = over.pop("oversub_penalty")
                diag.update({f"oversub_{n}": round(v, 6) for n, v in over.items()})
            else:
                k = doc["training"]["oversub_penalty"]
                source += f"; oversub_penalty from {base_source} (not measured: {reason})"
                log.warning(f"skipped the CPU-quota measurement: {reason}")
            diag["background_load_cores"] = round(meter.cores(), 3)
            doc["training"] = {"core_gflops": round(ref["core_gflops"], 4),
                               "parallel_fraction": round(ref["parallel_fraction"], 4), "max_cores": ref["max_cores"],
                               "oversub_penalty": round(k, 4), "ps_update_ns_per_byte": round(ps, 5),
                               "source": source, "diagnostics": diag}  # fmt: skip
            _warn("training", diag["background_load_cores"])
            done("training")

        if "models" in parts:
            meter = LoadMeter()
            found = training.measure_models(real_models(), nproc, s.model_seconds, s.model_rounds,
                                            step("models: samples/s vs cores"), s.retry_s)  # fmt: skip
            _warn("models", meter.cores())
            source = f"{tag}, torch {m['torch']}; params and FLOPs counted"
            doc["models"] = {**doc.get("models", {}), **{n: {**e, "source": source} for n, e in found.items()}}
            done("models")

        if "inference" in parts:
            meter = LoadMeter()
            cores_list = training.core_counts(min(nproc, 2))
            source = f"{tag}, onnxruntime {m['onnxruntime']}"
            entries = {}
            with tempfile.TemporaryDirectory(prefix="reamer-calib-onnx-") as tmp:
                for name in inference_models:
                    entries[name] = {**inference.measure(name, cores_list, quick, Path(tmp), step(f"inference: {name}"),
                                                       s.retry_s),
                                     "source": source}  # fmt: skip
                    if entries[name]["contended"]:
                        log.warning(f"inference {name}: {len(entries[name]['contended'])} points disturbed by other processes")
                    if ex is not None and name in real_models():  # the serving path, through the real server
                        entries[name].update(serving.measure(ex, name, entries[name], nproc, 60 if quick else 300,
                                                             Path(tmp), step(f"serving: {name}"),
                                                             load_s=5.0 if quick else 20.0))
                    elif name in real_models():
                        log.warning(f"skipped the serving-path measurement of {name}: {reason}")
            _warn("inference", meter.cores())
            doc["inference"] = {**doc.get("inference", {}), **entries}
            done("inference")

        if "interference" in parts:
            why = reason if ex is None else (f"needs 2 CPUs, have {nproc}" if nproc < 2 else "")
            if why:
                log.warning(f"skipped the interference measurement: {why}")
                if doc.get("interference"):
                    doc["interference"]["source"] += f"; not re-measured by {tag} ({why})"
            else:
                meter = LoadMeter()
                found = interference.measure(ex, nproc, s.inter_window_s, s.inter_rounds, step("interference"))
                found["diagnostics"]["background_load_cores"] = round(meter.cores(), 3)
                _warn("interference", found["diagnostics"]["background_load_cores"])
                doc["interference"] = {**found, "source": f"{tag}, torch {m['torch']}, onnxruntime {m['onnxruntime']}"}
                done("interference")
        parse_profiles(doc, "the measured profile")  # never hand out a profile the loader rejects
        return doc
    finally:
        if ex is not None:
            ex.sweep()  # its prefix directories too: nothing of calibration's is left behind


def _warn(part: str, load: float) -> None:
    if load > BACKGROUND_WARN:
        log.warning(f"other processes used {load:.2f} cores during the {part} measurement; its numbers are contaminated")


def dumps(doc: dict) -> str:
    """The profile as JSON: one line per section field and per model entry (diff-friendly)."""
    import json

    items = []
    for k, v in doc.items():
        if isinstance(v, dict) and v:
            inner = ",\n".join(f"    {json.dumps(n)}: {json.dumps(e)}" for n, e in v.items())
            items.append(f"  {json.dumps(k)}: {{\n{inner}\n  }}")
        else:
            items.append(f"  {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(items) + "\n}\n"
