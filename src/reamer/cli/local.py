"""The real half of ``reamer demo`` (and ``reamer local``): one local scenario run for real,
shown round by round, summarized in a table and an HTML report."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from reamer.backends.local.session import RunLocked, sigterm_as_interrupt
from reamer.config.local import LocalScenario
from reamer.errors import InputError
from reamer.models.profiles import Profiles
from reamer.reports.local import failures, label, phases, placements, summarize, write_local_report
from reamer.runtime.local import run_scenario
from reamer.runtime.rounds import RoundRecord, RoundStream


def _round_line(r: RoundRecord) -> str:
    parts = [f"t={r.t:6.1f}s"]
    for job, shape in r.shapes.items():
        sp = r.speeds.get(job)
        parts.append(f"{job}: {shape[0]} PS {shape[1]} w {shape[2]:g} cores"
                     + (f", {sp:.1f} samples/s, {r.bottlenecks.get(job)}" if sp is not None else ", starting"))
    for sid, s in r.inference.items():
        reps = " ".join(f"{n}:{c:g}" for n, c in s["replicas"]) or "-"
        p99 = f"{s['p99_ms']:.0f} ms" if s["p99_ms"] is not None else "-"
        parts.append(f"{sid}: p99 {p99} [{reps}]")
    if r.decisions:
        parts.append("→ " + "; ".join(d.split(" ", 1)[0] for d in r.decisions))
    return " | ".join(parts)


def print_round(console: Console, r: RoundRecord) -> None:
    """One round's line, as plain text (its replica lists are in brackets, not markup)."""
    console.print(_round_line(r), highlight=False, markup=False)


def run_real(sc: LocalScenario, profiles: Profiles, console: Console, out: Console, report: Path, *,
             state_dir: Path | None = None, fresh: bool = False, keep_state: bool = False,
             dashboard: tuple[str, int] | None = None) -> tuple[dict[str, float], dict[str, list[dict]]]:
    """Run ``sc`` for real; Ctrl-C or SIGTERM stop it and still remove every process and
    cgroup. With ``state_dir`` the run is crash-safe (an unfinished run there is resumed, or
    with ``fresh`` discarded); with ``dashboard`` (host, port) its live dashboard is served
    there while it runs. Returns its metrics and what failed during it."""
    missing = [s.model for s in sc.services if s.model not in profiles.inference]
    if missing:
        raise InputError("profiles", "inference", f"a service-time profile for {missing[0]} (run: reamer calibrate)")
    stream = RoundStream({"scenario": sc.name, "backend": "local", "policy": sc.policy.training,
                          "harvest": sc.policy.harvest if sc.services else None})
    dash = None
    if dashboard is not None:
        from reamer.dashboard import serve

        try:
            dash = serve(stream, *dashboard)
        except OSError as e:
            raise InputError("--dashboard-port", "value", f"a free port on {dashboard[0]}", str(e)) from None
        console.print(f"dashboard: {dash.url}", highlight=False)
    with sigterm_as_interrupt():
        console.print(f"[bold]real run[/bold]: {sc.name} ({len(sc.hosts)} testbed hosts, "
                      f"{len(sc.jobs)} training job(s), {len(sc.services)} service(s); up to {sc.max_s:g} s)")
        try:
            run = run_scenario(sc, profiles,
                               on_round=stream.hook(lambda r: print_round(console, r)),
                               state_dir=state_dir, fresh=fresh, keep_state=keep_state)
        except RunLocked as e:
            raise InputError("reamer local", "machine", "no other real run on this machine", str(e)) from None
        finally:
            stream.finish()
            if dash is not None:
                dash.close()
    slo = {s.id: s.slo_p99_ms for s in sc.services}
    for line in run.recovered:
        console.print(line, highlight=False)
    if run.swept:
        console.print(f"removed leftovers of an earlier run: {', '.join(run.swept)}")
    t = Table(title=f"Reamer demo: {sc.name} (real processes, cgroups, network namespaces)")
    for col in ("job", "PS", "workers", "from (s)", "rounds", "speed (samples/s)", "diagnosed"):
        t.add_column(col, justify="left" if col in ("job", "diagnosed") else "right")
    for job in sorted(run.result.jct_s) or [j.id for j in sc.jobs]:
        for p in phases(run.result.rounds, job):
            t.add_row(job, str(p["ps"]), str(p["workers"]), f"{p['t0']:.0f}", str(p["rounds"]),
                      "-" if p["speed"] is None else f"{p['speed']:.1f}", str(p["bottleneck"]))
    out.print(t)
    metrics = summarize(run, slo)
    m = Table(title="Reamer demo: real run summary")
    m.add_column("metric")
    m.add_column("value", justify="right")
    for k, v in metrics.items():
        m.add_row(label(k), f"{v:,.2f}")
    out.print(m)
    for f in failures(run):
        if "job" in f:
            console.print(f"[yellow]failure[/yellow] t={f['t_s']:.0f}s {f['job']}: {f['what']}, {f['steps_lost']} "
                          "steps lost" + (f"; given up: {f['gave_up']}" if f["gave_up"] else ""), highlight=False)
        else:
            console.print(f"[yellow]failure[/yellow] t={f['t_s']:.0f}s replica {f['replica']} {f['what']}: replaced",
                          highlight=False)
    write_local_report(report, f"Reamer demo: {sc.name} (real run)", run, slo)
    out.print(f"HTML report (real run): {report.resolve()}")
    places = placements(run.result.rounds, around=3)
    for p in places:
        for job, j in p["jobs"].items():
            console.print(f"t={p['t_s']:.0f}s {'+'.join(p['moves'])}: {job} {j['before']:.1f} -> {j['after']:.1f} "
                          f"samples/s" + (f" (noise ±{j['noise_pct']:.1f}%)" if j["noise_pct"] is not None else "")
                          + (" (reshaped)" if j["reshaped"] else ""), highlight=False)
    return metrics, {"failures": failures(run), "placements": places}
