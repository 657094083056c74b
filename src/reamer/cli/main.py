"""``reamer``: simulate scenarios, run the demo, real local runs, calibration, Kubernetes.

Bad input → one line on stderr, exit 2, nothing run and no output file written; a run that
fails → one line, exit 1 (docs/cli.md lists the exit codes). ``--json -`` writes the JSON to
stdout and everything else to stderr. Heavy modules (the simulator, scipy, plotly, the
policies) are imported inside the commands: ``reamer --help`` stays fast."""

from __future__ import annotations

import enum
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from reamer.cli.common import (
    Group,
    HarvestPolicy,
    TrainingPolicy,
    check_output,
    choice_parser,
    emit_json,
    emit_text,
    fail,
    human,
    policy_parser,
    to_stdout,
)
from reamer.cli.k8s import app as k8s_app
from reamer.errors import InputError
from reamer.logs import configure

if TYPE_CHECKING:
    import socket

    from rich.table import Table

    from reamer.config.scenario import Scenario
    from reamer.models.profiles import Profiles
    from reamer.runtime import RunResult
    from reamer.runtime.rounds import RoundHook, RoundStream

app = typer.Typer(cls=Group, no_args_is_help=True,
                  help="Reamer: adaptive training allocation + inference on spare CPU, for ML clusters.")
app.add_typer(k8s_app, name="k8s")
console = Console(stderr=True)

# the training table: JCT and queue over the finished jobs, so the unfinished count beside them;
# allocation beside use (GPU columns only for a cluster with GPUs)
TABLE_KEYS = [("jobs", "finished", "{:.0f}"), ("unfinished", "unfinished", "{:.0f}"),
              ("mean_jct_s", "mean JCT (h)", "h"), ("p95_jct_s", "p95 JCT (h)", "h"),
              ("mean_queue_s", "mean queue (min)", "m"), ("makespan_s", "makespan (h)", "h"),
              ("cpu_alloc_pct", "CPU alloc %", "{:.1f}"), ("cpu_util_pct", "CPU used %", "{:.1f}"),
              ("gpu_alloc_pct", "GPU alloc %", "{:.1f}"), ("gpu_util_pct", "GPU used %", "{:.1f}"),
              ("reconfigurations", "reconfigs", "{:.0f}"), ("wall_s", "wall (s)", "{:.1f}")]
GPU_KEYS = ("gpu_alloc_pct", "gpu_util_pct")


COLO_KEYS = [("slo_attainment_pct", "SLO met % (service-min)"), ("training_slowdown_pct", "training slowdown %"),
             ("harvested_share_pct", "harvested %"), ("dedicated_node_hours", "pool node-h"),
             ("migrations", "migrations"), ("evictions", "evictions"), ("gpu_node_cpu_util_pct", "GPU-node CPU %")]

EMBEDDED = ("default", "colocation")  # the simulation scenarios shipped in reamer/data (load_embedded)


class Mode(str, enum.Enum):
    auto = "auto"
    real = "real"
    sim = "sim"


class LogLevel(str, enum.Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


parse_mode = choice_parser(lambda: [m.value for m in Mode])
parse_log_level = choice_parser(lambda: [m.value for m in LogLevel], case_sensitive=False)

JsonOut = Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here (docs/results-format.md); "
                                                             "- : to stdout (everything else then goes to stderr)")]
DashboardOpt = Annotated[bool, typer.Option("--dashboard", help="Serve a live dashboard of the run (docs/dashboard.md)")]
DashboardHost = Annotated[str, typer.Option(help="Address of --dashboard (loopback unless told)")]
DashboardPort = Annotated[int, typer.Option(min=0, max=65535, help="Port of --dashboard (0: a free one, printed)")]
ProfilesOpt = Annotated[Path | None, typer.Option(envvar="REAMER_PROFILES",
                                                  help="Calibrated profile JSON (reamer calibrate; default: the shipped one)")]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("reamer")
        except PackageNotFoundError:  # run from a source tree that was never installed
            from reamer import __version__ as v
        print(f"reamer {v}")
        raise typer.Exit()


@app.callback()
def main(log_level: Annotated[LogLevel, typer.Option(parser=parse_log_level, help="Diagnostics on stderr from this "
                                                                                     "level")] = LogLevel.warning,
         version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit")] = False) -> None:
    configure(LogLevel(log_level).value)


@contextmanager
def _errors():
    """Bad input inside the block: one line, exit 2. (Everything else that ends a command is
    one line too, with its exit code: :class:`reamer.cli.common.Group`.)"""
    try:
        yield
    except InputError as e:
        fail(e)


def _scenario(path: Path | None) -> Scenario:
    """A scenario file, or the name of a shipped one (``default``, ``colocation``)."""
    from reamer.config.scenario import load_embedded, load_scenario

    if path is not None and not path.exists() and str(path) in EMBEDDED:
        return load_embedded(str(path))
    return load_scenario(path)


def run_policies(sc: Scenario, policies: list[str] | list[tuple[str, str | None]], profiles: Profiles,
                 quiet: bool = False, track: int = 0, on_round: RoundHook | None = None) -> list[RunResult]:
    """Run each policy (a training policy, or a (training, harvest) pair) on the same scenario
    and seed, with a progress bar."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from reamer.runtime import simulate

    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=quiet or not sys.stderr.isatty(), transient=True) as bar:
        for item in policies:
            name, harvest = item if isinstance(item, tuple) else (item, None)
            task = bar.add_task(f"{sc.name}/{name}" + (f"+{harvest}" if harvest else ""), total=None)
            res = simulate(sc, name, progress=lambda done, total, t=task: bar.update(t, completed=done, total=total),
                           track=track, profiles=profiles, harvest=harvest, on_round=on_round)
            results.append(res)
    return results


def _table(results: list[RunResult], title: str) -> Table:
    from rich.table import Table

    gpus = any(r.metrics.get("gpu_alloc_pct", 0.0) > 0 for r in results)
    keys = [k for k in TABLE_KEYS if gpus or k[0] not in GPU_KEYS]
    t = Table(title=title)
    t.add_column("policy")
    for _, label, _ in keys:
        t.add_column(label, justify="right")
    for r in results:
        cells = []
        for key, _, fmt in keys:
            v = r.metrics.get(key, float("nan"))
            cells.append(f"{v / 3600:.2f}" if fmt == "h" else f"{v / 60:.1f}" if fmt == "m" else fmt.format(v))
        t.add_row(r.policy, *cells)
    seen: dict[str, tuple[float, float]] = {}
    for r in results:
        for model, (limit, top) in r.extrapolated.items():
            seen[model] = (limit, max(top, seen.get(model, (limit, 0.0))[1]))
    if seen:
        t.caption = ("The speed model extrapolated these models' parallel fractions past the cores they were "
                     "measured at (docs/calibration.md): "
                     + ", ".join(f"{m} ({lim:g} → {top:g} cores)" for m, (lim, top) in sorted(seen.items())))
    return t


def _colo_rows(results: list[RunResult]) -> list[dict]:
    return [{"policy": r.policy, **{label: r.metrics[key] for key, label in COLO_KEYS}} for r in results]


def _colo_table(rows: list[dict], title: str) -> Table:
    from rich.table import Table

    t = Table(title=title)
    for col in rows[0]:
        t.add_column(col, justify="left" if col == "policy" else "right")
    for row in rows:
        t.add_row(*(v if isinstance(v, str) else f"{v:.2f}" for v in row.values()))
    return t


def _entries(results: list[RunResult]) -> list[dict]:
    from reamer.reports.results import run_entry

    return [run_entry(r.scenario, r.seed, r.policy, r.metrics) for r in results]


def _document(bench: str, runs: list[dict]) -> dict:
    from reamer.reports.results import document

    return document(bench, runs)


@app.command("simulate")
def simulate_command(
    scenario: Annotated[Path | None, typer.Argument(
        help=f"Scenario YAML, or a shipped one: {', '.join(EMBEDDED)} (default: default)")] = None,
    policy: Annotated[list[TrainingPolicy] | None, typer.Option(
        "--policy", "-p", parser=policy_parser("training", "--harvest"),
        help="Training policy; repeat to compare (default: the scenario's policy.training)")] = None,
    harvest: Annotated[list[HarvestPolicy] | None, typer.Option(
        "--harvest", parser=policy_parser("harvest", "--policy"),
        help="Harvesting policy for the scenario's inference: services; repeat to compare, each with every "
             "--policy (default: the scenario's policy.harvest)")] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="Override the scenario's seed")] = None,
    json_out: JsonOut = None,
    report: Annotated[Path | None, typer.Option(help="Write an interactive HTML report")] = None,
    profiles: ProfilesOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No tables (the JSON and the report still)")] = False,
    dashboard: Annotated[bool, typer.Option("--dashboard", help="Replay the run on a live dashboard (one policy), "
                                            "until Ctrl-C (docs/dashboard.md)")] = False,
    dashboard_host: DashboardHost = "127.0.0.1",
    dashboard_port: DashboardPort = 0,
    replay_s: Annotated[float, typer.Option(min=1.0, help="--dashboard replays the whole run in this many "
                                                          "seconds")] = 60.0,
) -> None:
    """Simulate a scenario under one or more policies (same seed, side by side)."""
    from reamer.models.profiles import load_profiles
    from reamer.runtime.policies import harvest_policy, training_policy

    with _errors():  # every check before any work: options, files, policies, output paths
        check_output(json_out, "--json")
        check_output(report, "--report", stdout_ok=False)
        sc = _scenario(scenario)
        if seed is not None:
            sc = sc.model_copy(update={"seed": seed})
        names = [str(p) for p in policy] if policy else [sc.policy.training]
        for name in names:  # options of the scenario's policy.options.NAME
            training_policy(sc.policy, sc.source, name)
        prof = load_profiles(profiles)
        harvests: list[str | None] = [str(h) for h in harvest] if harvest else [None]
        if sc.inference is None and harvest:
            raise InputError("--harvest", "value", f"a scenario with an inference: section (e.g. reamer simulate "
                                                   f"colocation --harvest {harvests[0]})", sc.source)
        if sc.inference is not None:
            for h in harvests:
                harvest_policy(sc.policy, sc.source, prof.inference, sc.inference.interval_s, h)
        runs = [(n, h) for n in names for h in harvests]
        stream = sock = None
        if dashboard:
            if len(runs) != 1:
                raise InputError("--dashboard", "value", "one --policy (and one --harvest) to replay",
                                 f"{len(runs)} runs asked for")
            from reamer.dashboard import listen
            from reamer.runtime.rounds import RoundStream

            try:  # the port is taken now, so a busy one fails before the run and its outputs
                sock = listen(dashboard_host, dashboard_port)
            except OSError as e:
                raise InputError("--dashboard-port", "value", f"a free port on {dashboard_host}", str(e)) from None

            stream = RoundStream({"scenario": sc.name, "backend": "simulator", "policy": runs[0][0],
                                  "harvest": runs[0][1] or (sc.policy.harvest if sc.inference else None)})
        try:
            results = run_policies(sc, runs, prof, quiet, track=6 if report else 0,
                                   on_round=stream.publish if stream is not None else None)
        except BaseException:
            if sock is not None:
                sock.close()
            raise
    out = human(json_out)
    colo = sc.inference is not None
    if not quiet:
        out.print(_table(results, f"{sc.name} (seed {sc.seed})"))
        if colo:
            out.print(_colo_table(_colo_rows(results), f"{sc.name}: inference on the spare CPU (seed {sc.seed})"))
    if json_out:
        emit_json(json_out, _document("simulate", _entries(results)))
    if report:
        from reamer.reports.html import write_report

        write_report(report, f"Reamer: {sc.name}, seed {sc.seed}", results, **({"table": _colo_rows(results)}
                                                                                if colo else {}))
        console.print(f"report: {report}")
    if stream is not None and sock is not None:
        _replay(stream, sock, replay_s)


def _replay(stream: RoundStream, sock: socket.socket, replay_s: float) -> None:
    """Serve ``stream`` (a finished simulated run) on the dashboard, replayed over ``replay_s``
    seconds, until Ctrl-C."""
    import time

    from reamer.dashboard import serve

    got, _, _ = stream.since(0)
    span = got[-1]["t"] - got[0]["t"] if len(got) > 1 else 0.0
    stream.finish()
    stream.replay(max(span / replay_s, 1e-9))
    dash = serve(stream, sock=sock)
    console.print(f"dashboard: {dash.url} (replaying {len(got)} rounds, {span:,.0f} simulated s, in "
                  f"{replay_s:g} s; Ctrl-C to stop)", highlight=False)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        dash.close()


@app.command()
def demo(
    report: Annotated[Path, typer.Option(help="Where to write the HTML report")] = Path("out/demo-report.html"),
    json_out: JsonOut = None,
    mode: Annotated[Mode, typer.Option(envvar="REAMER_DEMO_MODE", parser=parse_mode,
                                       help="auto: real run when root and cgroups allow it, then the simulations; "
                                            "real: real run only; sim: simulations only")] = Mode.auto,
    profiles: ProfilesOpt = None,
) -> None:
    """A short real run (NEARCHUS re-allocates a PS job while Reamer serves inference on the
    spare CPU), then every policy side by side in simulation."""
    from reamer.config.scenario import load_embedded
    from reamer.models.profiles import load_profiles
    from reamer.policies import policy_names
    from reamer.reports.results import run_entry
    from reamer.runtime import simulate

    mode = Mode(mode)
    out = human(json_out)
    real_metrics: dict[str, float] = {}
    real_extra: dict[str, list[dict]] = {}
    real_report = report.with_name(f"{report.stem}-real{report.suffix}")
    colo_report = report.with_name(f"{report.stem}-colocation{report.suffix}")
    with _errors():
        check_output(json_out, "--json")
        for path in (report, real_report, colo_report):
            check_output(path, "--report", stdout_ok=False)
        if mode is not Mode.sim:
            from reamer.backends.local.session import unavailable
            from reamer.config.local import load_local

            local, prof = load_local(None), load_profiles(profiles)
            missing = [s.model for s in local.services if s.model not in prof.inference]
            reason = unavailable() or (f"the profile has no service-time profile for {missing[0]} (run: reamer "
                                       "calibrate)" if missing else None)
            if reason is None:
                from reamer.cli.local import run_real

                real_metrics, real_extra = run_real(local, prof, console, out, real_report)
            elif mode is Mode.real:
                raise InputError("reamer demo --mode real", "machine", "root, writable cgroups, iproute2", reason)
            else:
                console.print(f"no real run: {reason}; simulation only", highlight=False)
        if mode is Mode.real:
            if json_out:
                emit_json(json_out, _document("demo", [{**run_entry("local", 0, "nearchus+reamer", real_metrics),
                                                        **real_extra}]))
            return
        sc = load_embedded("default")
        prof = load_profiles(profiles)
        results = run_policies(sc, policy_names(), prof, track=6)
    out.print(_table(results, f"Reamer demo: {sc.name} scenario (simulated, seed {sc.seed})"))
    colo = load_embedded("colocation")
    colo_results = [simulate(colo, "static", harvest=h, profiles=prof) for h in policy_names("harvest")]
    rows = _colo_rows(colo_results)
    out.print(_colo_table(rows, f"Reamer demo: inference on the spare CPU of GPU training nodes ({colo.name}, "
                                "simulated)"))
    if json_out:
        entries = _entries([*results, *colo_results])
        if real_metrics:
            entries.insert(0, {**run_entry("local", 0, "nearchus+reamer", real_metrics), **real_extra})
        emit_json(json_out, _document("demo", entries))
    from reamer.reports.html import write_report

    write_report(report, f"Reamer demo: {sc.name}", results)
    write_report(colo_report, f"Reamer demo: {colo.name}", colo_results, table=rows)
    out.print(f"HTML reports: {report.resolve()}, {colo_report.resolve()}")


@app.command("local")
def local_command(
    scenario: Annotated[Path | None, typer.Argument(help="Local scenario YAML (default: the embedded one)")] = None,
    json_out: JsonOut = None,
    report: Annotated[Path, typer.Option(help="Where to write the HTML report")] = Path("out/local-report.html"),
    profiles: ProfilesOpt = None,
    state_dir: Annotated[Path | None, typer.Option(
        help="The run's durable state (record, checkpoints, logs); an unfinished run there is resumed "
             "(default: ~/.local/state/reamer/local/SCENARIO)")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Discard an unfinished run in the state folder")] = False,
    keep_state: Annotated[bool, typer.Option("--keep-state",
                                             help="Keep the state folder after a run that finished")] = False,
    dashboard: DashboardOpt = False,
    dashboard_host: DashboardHost = "127.0.0.1",
    dashboard_port: DashboardPort = 0,
) -> None:
    """Run a local scenario for real: testbed hosts, cgroups, real PS training and inference.
    Crash-safe: after a crash, the same command resumes the jobs from their checkpoints."""
    from reamer.backends.local.session import default_state_dir, unavailable
    from reamer.cli.local import run_real
    from reamer.config.local import load_local
    from reamer.models.profiles import load_profiles
    from reamer.reports.results import run_entry
    from reamer.runtime.policies import harvest_policy, training_policy

    with _errors():
        check_output(json_out, "--json")
        check_output(report, "--report", stdout_ok=False)
        sc = load_local(scenario)
        prof = load_profiles(profiles)
        training_policy(sc.policy, sc.source)  # the policies' names and options, before the machine is touched
        if sc.services and sc.policy.harvest is not None:
            harvest_policy(sc.policy, sc.source, prof.inference, sc.policy.interval_s)
        reason = unavailable()
        if reason is not None:
            raise InputError("reamer local", "machine", "root, writable cgroups, iproute2, torch, onnxruntime", reason)
        metrics, extra = run_real(sc, prof, console, human(json_out), report,
                                   state_dir=state_dir or default_state_dir(sc.name), fresh=fresh,
                                   keep_state=keep_state, dashboard=(dashboard_host, dashboard_port) if dashboard else None)
    if json_out:
        name = sc.policy.training + (f"+{sc.policy.harvest}" if sc.services and sc.policy.harvest else "")
        emit_json(json_out, _document("local", [{**run_entry(sc.name, sc.seed, name, metrics), **extra}]))


@app.command()
def cleanup(
    json_out: Annotated[Path | None, typer.Option("--json", help="Write what was removed as JSON here; - : stdout")]
    = None,
    cgroup_root: Annotated[Path, typer.Option(help="The cgroup mount")] = Path("/sys/fs/cgroup"),
    temp_root: Annotated[Path, typer.Option(help="Where runs without a state folder keep their temporary folder")]
    = Path(tempfile.gettempdir()),
) -> None:
    """Remove what a dead real run left (cgroups, network namespaces, temporary folders).

    After a real run (reamer local, reamer demo) was killed (kill -9, a crash): its cgroups,
    killing the processes still in them, its network namespaces, and the temporary folder of a
    run without a state folder (reamer demo). Refuses while a live run holds the machine's lock.
    State folders (checkpoints, for a resume) are kept."""
    from reamer.backends.local import session

    with _errors():
        check_output(json_out, "--json")
        try:
            with session.run_lock(session.LOCK_PATH):
                removed = session.sweep_leftovers(cgroup_root)
                folders = [str(d) for d in session.sweep_temp_folders(temp_root)]
        except session.RunLocked as e:
            raise InputError("reamer cleanup", "machine", "no live real run (it removes its own leftovers)",
                             str(e)) from None
    namespaces = [r for r in removed if r.startswith(f"{session.NETNS_PREFIX}-")]
    cgroups = [r for r in removed if r not in namespaces]
    out = human(json_out)
    if not removed and not folders:
        out.print(f"nothing to remove: no {session.CGROUP_PREFIX} cgroups under {cgroup_root}, no network namespace "
                  f"{session.NETNS_PREFIX}-* of a dead run, no temporary run folder in {temp_root}", highlight=False)
    for name in cgroups:
        out.print(f"removed cgroup {name}", highlight=False)
    for name in namespaces:
        out.print(f"removed network namespace {name}", highlight=False)
    for name in folders:
        out.print(f"removed temporary run folder {name}", highlight=False)
    if json_out:
        emit_json(json_out, {"removed": {"cgroups": cgroups, "namespaces": namespaces, "folders": folders}})


@app.command()
def calibrate(
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the profile here (atomically); - : stdout")]
    = None,
    quick: Annotated[bool, typer.Option("--quick", help="Short runs (about a minute on 2 cores)")] = False,
    parts: Annotated[str, typer.Option(help="Comma-separated: training,models,inference,interference")] =
        "training,models,inference,interference",
    inference_models: Annotated[str | None, typer.Option(
        help="Comma-separated inference models (default: the real-workload models)")] = None,
    base: Annotated[Path | None, typer.Option(help="Profile whose unmeasured entries are kept (default: shipped)")] = None,
) -> None:
    """Measure this machine's performance-model constants into one profile (docs/calibration.md)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from reamer.backends.local.session import sigterm_as_interrupt
    from reamer.calibration.run import calibrate as run_calibration
    from reamer.calibration.run import check_parts, dumps, real_models
    from reamer.models.profiles import load_profiles

    names = [m.strip() for m in inference_models.split(",") if m.strip()] if inference_models is not None else None
    part_list = [p.strip() for p in parts.split(",") if p.strip()]
    with _errors():  # bad options, base profile or output path: one line, before any measurement
        check_output(json_out, "--json")
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
    human(json_out).print(_calibration_table(doc))
    if json_out:
        emit_text(json_out, dumps(doc))
        if not to_stdout(json_out):
            console.print(f"wrote {json_out}")


def _calibration_table(doc: dict) -> Table:
    from rich.table import Table

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
