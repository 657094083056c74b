"""``reamer``: simulate scenarios, run the demo. Bad input → one line on stderr, exit 2,
no output file written."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from reamer.cli.k8s import app as k8s_app
from reamer.config.scenario import Scenario, load_embedded, load_scenario
from reamer.errors import InputError
from reamer.logs import configure
from reamer.models.profiles import Profiles, load_profiles
from reamer.policies import policy_names
from reamer.reports.html import write_report
from reamer.reports.results import document, run_entry, write_json
from reamer.runtime import RunResult, simulate
from reamer.runtime.policies import training_policy

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Reamer: adaptive training allocation + inference on spare CPU, for ML clusters.")
app.add_typer(k8s_app, name="k8s")
console = Console(stderr=True)


def _out() -> Console:
    """Stdout console; wide enough for the summary table when piped."""
    return Console() if sys.stdout.isatty() else Console(width=160)

TABLE_KEYS = [("jobs", "jobs", "{:.0f}"), ("mean_jct_s", "mean JCT (h)", "h"), ("p95_jct_s", "p95 JCT (h)", "h"),
              ("mean_queue_s", "mean queue (min)", "m"), ("makespan_s", "makespan (h)", "h"),
              ("cpu_util_pct", "CPU used %", "{:.1f}"), ("gpu_util_pct", "GPU used %", "{:.1f}"),
              ("reconfigurations", "reconfigs", "{:.0f}"), ("wall_s", "wall (s)", "{:.1f}")]


COLO_KEYS = [("slo_attainment_pct", "SLO met % (service-min)"), ("training_slowdown_pct", "training slowdown %"),
             ("harvested_share_pct", "harvested %"), ("dedicated_node_hours", "pool node-h"),
             ("migrations", "migrations"), ("evictions", "evictions"), ("gpu_node_cpu_util_pct", "GPU-node CPU %")]


LOG_LEVELS = ("debug", "info", "warning", "error")


@app.callback()
def main(log_level: Annotated[str, typer.Option(help=f"Diagnostics on stderr from this level: {', '.join(LOG_LEVELS)}")]
         = "warning") -> None:
    if log_level.lower() not in LOG_LEVELS:
        _fail(InputError("--log-level", "value", f"one of {', '.join(LOG_LEVELS)}", log_level))
    configure(log_level.lower())


def _fail(err: InputError) -> None:
    console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@contextmanager
def _errors():
    try:
        yield
    except InputError as e:
        _fail(e)


def run_policies(sc: Scenario, policies: list[str], profiles: Profiles, quiet: bool = False,
                 track: int = 0) -> list[RunResult]:
    """Run each policy on the same scenario and seed, with a progress bar."""
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=quiet or not sys.stderr.isatty(), transient=True) as bar:
        for name in policies:
            task = bar.add_task(f"{sc.name}/{name}", total=None)
            res = simulate(sc, name, progress=lambda done, total, t=task: bar.update(t, completed=done, total=total),
                           track=track, profiles=profiles)
            results.append(res)
    return results


def _table(results: list[RunResult], title: str) -> Table:
    t = Table(title=title)
    t.add_column("policy")
    for _, label, _ in TABLE_KEYS:
        t.add_column(label, justify="right")
    for r in results:
        cells = []
        for key, _, fmt in TABLE_KEYS:
            v = r.metrics.get(key, float("nan"))
            cells.append(f"{v / 3600:.2f}" if fmt == "h" else f"{v / 60:.1f}" if fmt == "m" else fmt.format(v))
        t.add_row(r.policy, *cells)
    return t


@app.command("simulate")
def simulate_command(
    scenario: Annotated[Path | None, typer.Argument(help="Scenario YAML (default: the embedded one)")] = None,
    policy: Annotated[list[str] | None, typer.Option(
        "--policy", "-p", help="Training policy; repeat to compare (default: the scenario's policy.training)")] = None,
    seed: Annotated[int | None, typer.Option(help="Override the scenario's seed")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results (DESIGN.md §4 shape)")] = None,
    report: Annotated[Path | None, typer.Option(help="Write an interactive HTML report")] = None,
    profiles: Annotated[Path | None, typer.Option(envvar="REAMER_PROFILES",
                                                  help="Calibrated profile JSON (reamer calibrate; default: the shipped one)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Simulate a scenario under one or more policies (same seed, side by side)."""
    with _errors():
        sc = load_scenario(scenario)
        if seed is not None:
            sc = sc.model_copy(update={"seed": seed})
        names = policy or [sc.policy.training]
        for name in names:  # validate names and options before any work
            if name not in policy_names():
                raise InputError("--policy", "value", f"one of {', '.join(policy_names())} (training policies)", name)
            training_policy(sc.policy, sc.source, name)
        prof = load_profiles(profiles)
        results = run_policies(sc, names, prof, quiet, track=6 if report else 0)
    if not quiet:
        _out().print(_table(results, f"{sc.name} (seed {sc.seed})"))
    if json_out:
        write_json(json_out, document("simulate", [run_entry(r.scenario, r.seed, r.policy, r.metrics) for r in results]))
    if report:
        write_report(report, f"Reamer: {sc.name}, seed {sc.seed}", results)
        console.print(f"report: {report}")


@app.command()
def demo(
    report: Annotated[Path, typer.Option(help="Where to write the HTML report")] = Path("out/demo-report.html"),
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
    mode: Annotated[str, typer.Option(envvar="REAMER_DEMO_MODE",
                                      help="auto: real run when root and cgroups allow it, then the simulations; "
                                           "real: real run only; sim: simulations only")] = "auto",
    profiles: Annotated[Path | None, typer.Option(envvar="REAMER_PROFILES",
                                                  help="Calibrated profile (default: the shipped one)")] = None,
) -> None:
    """A short real run (NEARCHUS re-allocates a PS job while Reamer serves inference on the
    spare CPU), then every policy side by side in simulation."""
    real_metrics: dict[str, float] = {}
    real_failures: list[dict] = []
    with _errors():
        if mode not in ("auto", "real", "sim"):
            raise InputError("--mode", "value", "one of auto, real, sim", mode)
        if mode != "sim":
            from reamer.backends.local.session import unavailable

            from reamer.config.local import load_local

            local, prof = load_local(None), load_profiles(profiles)
            missing = [s.model for s in local.services if s.model not in prof.inference]
            reason = unavailable() or (f"the profile has no service-time profile for {missing[0]} (run: reamer "
                                       "calibrate)" if missing else None)
            if reason is None:
                from reamer.cli.local import run_real

                real_metrics, real_failures = run_real(local, prof, console, _out(),
                                                       report.with_name(f"{report.stem}-real{report.suffix}"))
            elif mode == "real":
                raise InputError("reamer demo --mode real", "machine", "root, writable cgroups, iproute2", reason)
            else:
                console.print(f"no real run: {reason}; simulation only", highlight=False)
        if mode == "real":
            if json_out:
                write_json(json_out, document("demo", [{**run_entry("local", 0, "nearchus+reamer", real_metrics),
                                                        "failures": real_failures}]))
            return
        sc = load_scenario(None)
        prof = load_profiles(profiles)
        results = run_policies(sc, policy_names(), prof, track=6)
    _out().print(_table(results, f"Reamer demo: {sc.name} scenario (simulated, seed {sc.seed})"))
    colo = load_embedded("colocation")
    colo_results = [simulate(colo, "static", harvest=h, profiles=prof) for h in policy_names("harvest")]
    rows = [{"policy": r.policy, **{label: r.metrics[key] for key, label in COLO_KEYS}} for r in colo_results]
    t = Table(title=f"Reamer demo: inference on the spare CPU of GPU training nodes ({colo.name}, simulated)")
    for col in rows[0]:
        t.add_column(col, justify="left" if col == "policy" else "right")
    for row in rows:
        t.add_row(*(v if isinstance(v, str) else f"{v:.2f}" for v in row.values()))
    _out().print(t)
    if json_out:
        entries = [run_entry(r.scenario, r.seed, r.policy, r.metrics) for r in (*results, *colo_results)]
        if real_metrics:
            entries.insert(0, {**run_entry("local", 0, "nearchus+reamer", real_metrics), "failures": real_failures})
        write_json(json_out, document("demo", entries))
    write_report(report, f"Reamer demo: {sc.name}", results)
    colo_report = report.with_name(f"{report.stem}-colocation{report.suffix}")
    write_report(colo_report, f"Reamer demo: {colo.name}", colo_results, table=rows)
    _out().print(f"HTML reports: {report.resolve()}, {colo_report.resolve()}")


@app.command("local")
def local_command(
    scenario: Annotated[Path | None, typer.Argument(help="Local scenario YAML (default: the embedded one)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the run's metrics")] = None,
    report: Annotated[Path, typer.Option(help="Where to write the HTML report")] = Path("out/local-report.html"),
    profiles: Annotated[Path | None, typer.Option(envvar="REAMER_PROFILES", help="Calibrated profile")] = None,
    state_dir: Annotated[Path | None, typer.Option(
        help="The run's durable state (record, checkpoints, logs); an unfinished run there is resumed "
             "[default: ~/.local/state/reamer/local/SCENARIO]")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Discard an unfinished run in the state folder")] = False,
    keep_state: Annotated[bool, typer.Option("--keep-state",
                                             help="Keep the state folder after a run that finished")] = False,
) -> None:
    """Run a local scenario for real: testbed hosts, cgroups, real PS training and inference.
    Crash-safe: after a crash, the same command resumes the jobs from their checkpoints."""
    from reamer.backends.local.session import default_state_dir, unavailable
    from reamer.cli.local import run_real
    from reamer.config.local import load_local

    with _errors():
        sc = load_local(scenario)
        prof = load_profiles(profiles)
        reason = unavailable()
        if reason is not None:
            raise InputError("reamer local", "machine", "root, writable cgroups, iproute2, torch, onnxruntime", reason)
        metrics, failed = run_real(sc, prof, console, _out(), report, state_dir=state_dir or default_state_dir(sc.name),
                                   fresh=fresh, keep_state=keep_state)
    if json_out:
        name = sc.policy.training + (f"+{sc.policy.harvest}" if sc.services and sc.policy.harvest else "")
        write_json(json_out, document("local", [{**run_entry(sc.name, sc.seed, name, metrics), "failures": failed}]))


@app.command()
def calibrate(
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the profile here (atomically)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Short runs (about a minute on 2 cores)")] = False,
    parts: Annotated[str, typer.Option(help="Comma-separated: training,models,inference,interference")] =
        "training,models,inference,interference",
    inference_models: Annotated[str | None, typer.Option(
        help="Comma-separated inference models (default: the real-workload models)")] = None,
    base: Annotated[Path | None, typer.Option(help="Profile whose unmeasured entries are kept (default: shipped)")] = None,
) -> None:
    """Measure this machine's performance-model constants into one profile (docs/calibration.md)."""
    from reamer.backends.local.session import sigterm_as_interrupt
    from reamer.calibration.run import calibrate as run_calibration
    from reamer.calibration.run import check_parts, dumps, real_models
    from reamer.reports.results import write_atomic

    names = [m.strip() for m in inference_models.split(",") if m.strip()] if inference_models is not None else None
    part_list = [p.strip() for p in parts.split(",") if p.strip()]
    with _errors():  # bad options or base profile: one line, before any measurement
        check_parts(part_list, names if names is not None else real_models())
        load_profiles(base)
    with _errors(), sigterm_as_interrupt(), Progress(  # SIGTERM, like Ctrl-C, still sweeps the cgroups
            TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, disable=not console.is_terminal) as bar:  # fmt: skip
        task = bar.add_task("calibrating", total=None)
        doc = run_calibration(
            quick=quick, parts=part_list, inference_models=names,
            base=base, on_start=lambda n: bar.update(task, total=n),
            tick=lambda desc: bar.update(task, advance=1, description=desc),
        )  # fmt: skip
    _out().print(_calibration_table(doc))
    if json_out:
        write_atomic(json_out, dumps(doc))
        console.print(f"wrote {json_out}")


def _calibration_table(doc: dict) -> Table:
    m = doc["machine"]
    t = Table(title=f"calibration: {m['cpu']}, {m['nproc']} cores, torch {m['torch']}, onnxruntime {m['onnxruntime']}")
    t.add_column("constant")
    t.add_column("value", justify="right")
    t.add_column("source")
    for k in ("core_gflops", "parallel_fraction", "oversub_penalty", "ps_update_ns_per_byte"):
        t.add_row(f"training.{k}", f"{doc['training'][k]:.4g}", doc["training"]["source"])
    for name, e in doc.get("models", {}).items():
        t.add_row(f"models.{name}.core_s_per_sample", f"{e['core_s_per_sample']:.4g}", e["source"])
    for name, e in doc.get("inference", {}).items():
        t.add_row(f"inference.{name} a/b ms, f", f"{e['a_ms']:.3g}/{e['b_ms']:.3g}, {e['parallel_fraction']:.2f}",
                  e.get("source", ""))
    if doc.get("interference"):
        i = doc["interference"]
        t.add_row("interference training/inference", f"{i['training_interference']:.3g}/{i['inference_interference']:.3g}",
                  i["source"])
    return t


if __name__ == "__main__":  # pragma: no cover
    app()
