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

from reamer.backends.sim import RunResult, simulate
from reamer.config.scenario import Scenario, load_embedded, load_scenario
from reamer.errors import InputError
from reamer.models.training import Calibration, load_calibration
from reamer.policies import make_policy, policy_names
from reamer.policies.harvest_baselines import HARVEST_POLICIES
from reamer.reports.html import write_report
from reamer.reports.results import document, run_entry, write_json

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Reamer: adaptive training allocation + inference on spare CPU, for ML clusters.")
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


def _fail(err: InputError) -> None:
    console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@contextmanager
def _errors():
    try:
        yield
    except InputError as e:
        _fail(e)


def _calibration(profiles: Path | None) -> Calibration:
    if profiles is None:
        return load_calibration()
    try:
        return load_calibration(str(profiles))
    except FileNotFoundError:
        raise InputError(str(profiles), "file", "an existing profiles JSON file") from None
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(str(profiles), "contents", f"a calibration JSON object ({e})") from None


def run_policies(sc: Scenario, policies: list[str], cal: Calibration, quiet: bool = False,
                 track: int = 0) -> list[RunResult]:
    """Run each policy on the same scenario and seed, with a progress bar."""
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=quiet or not sys.stderr.isatty(), transient=True) as bar:
        for name in policies:
            task = bar.add_task(f"{sc.name}/{name}", total=None)
            res = simulate(sc, name, cal, lambda done, total, t=task: bar.update(t, completed=done, total=total),
                           track=track)
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
    policy: Annotated[list[str], typer.Option("--policy", "-p", help="Policy name; repeat to compare")] = ["static"],
    seed: Annotated[int | None, typer.Option(help="Override the scenario's seed")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results (DESIGN.md §4 shape)")] = None,
    report: Annotated[Path | None, typer.Option(help="Write an interactive HTML report")] = None,
    profiles: Annotated[Path | None, typer.Option(envvar="REAMER_PROFILES", help="Calibration JSON")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Simulate a scenario under one or more policies (same seed, side by side)."""
    with _errors():
        sc = load_scenario(scenario)
        if seed is not None:
            sc = sc.model_copy(update={"seed": seed})
        for name in policy:  # validate names and options before any work
            make_policy(name, sc.policy.options.get(name), source="--policy" if name not in policy_names() else sc.source)
        cal = _calibration(profiles)
        results = run_policies(sc, policy, cal, quiet, track=6 if report else 0)
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
) -> None:
    """Every registered policy side by side on the embedded default scenario."""
    with _errors():
        sc = load_scenario(None)
        results = run_policies(sc, policy_names(), load_calibration(), track=6)
    _out().print(_table(results, f"Reamer demo: {sc.name} scenario (simulated, seed {sc.seed})"))
    colo = load_embedded("colocation")
    colo_results = [simulate(colo, "static", harvest=h) for h in HARVEST_POLICIES]
    rows = [{"policy": r.policy, **{label: r.metrics[key] for key, label in COLO_KEYS}} for r in colo_results]
    t = Table(title=f"Reamer demo: inference on the spare CPU of GPU training nodes ({colo.name}, simulated)")
    for col in rows[0]:
        t.add_column(col, justify="left" if col == "policy" else "right")
    for row in rows:
        t.add_row(*(v if isinstance(v, str) else f"{v:.2f}" for v in row.values()))
    _out().print(t)
    if json_out:
        write_json(json_out, document("demo", [run_entry(r.scenario, r.seed, r.policy, r.metrics)
                                               for r in (*results, *colo_results)]))
    write_report(report, f"Reamer demo: {sc.name}", results)
    colo_report = report.with_name(f"{report.stem}-colocation{report.suffix}")
    write_report(colo_report, f"Reamer demo: {colo.name}", colo_results, table=rows)
    _out().print(f"HTML reports: {report.resolve()}, {colo_report.resolve()}")


if __name__ == "__main__":  # pragma: no cover
    app()
