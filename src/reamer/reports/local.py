"""Summary and HTML report of a real (local-backend) run: per-round training speed and
shape, what NEARCHUS diagnosed, and each service's per-window p99 against its SLO."""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from reamer.reports.page import line, table, write_page


def phases(rounds: Any, job: str) -> list[dict[str, Any]]:
    """The job's consecutive rounds (:class:`~reamer.runtime.rounds.RoundRecord`-like: ``t``,
    ``shapes``, ``speeds``, ``bottlenecks``) with one shape (PS, workers): mean measured speed
    over them (the first measured round after a change is left out: it straddles the restart),
    and the bottleneck diagnosed most often."""
    out: list[dict[str, Any]] = []
    for r in rounds:
        shape = r.shapes.get(job)
        if shape is None:
            continue
        key = (shape[0], shape[1])
        if not out or out[-1]["ps"] != key[0] or out[-1]["workers"] != key[1]:
            out.append({"ps": key[0], "workers": key[1], "t0": r.t, "speeds": [], "bottlenecks": []})
        if job in r.speeds:
            out[-1]["speeds"].append(r.speeds[job])
            out[-1]["bottlenecks"].append(r.bottlenecks.get(job, "none"))
    for p in out:
        sp = p.pop("speeds")[1:]
        bn = p.pop("bottlenecks")[1:]
        p["rounds"] = len(sp)
        p["speed"] = statistics.fmean(sp) if sp else None
        p["bottleneck"] = Counter(bn).most_common(1)[0][0] if bn else None
    return out


MOVES = ("PlaceReplica", "MigrateReplica", "EvictReplica")


def placements(rounds: Sequence[Any], around: int = 2) -> list[dict[str, Any]]:
    """Training speed around every round that placed, moved or evicted a replica: per job,
    the mean of its last ``around`` measured speeds before the round and of its first
    ``around`` after it (``change_pct``: after vs before). ``noise_pct`` is the standard deviation
    such a change has without a cause: that of a difference of two means of ``around`` rounds,
    from the spread of the job's speeds in its shape (the first round after a reshape left
    out). A job whose shape changed in between (NEARCHUS reshaped it) is marked ``reshaped``:
    its change is not the replica's."""
    out = []
    for i, r in enumerate(rounds):
        moves = [d for d in r.decisions if d.split(" ", 1)[0] in MOVES]
        if not moves:
            continue
        jobs = {}
        for job in sorted({j for q in rounds for j in q.speeds}):
            before = [(q.speeds[job], q.shapes.get(job)) for q in rounds[:i] if job in q.speeds][-around:]
            after = [(q.speeds[job], q.shapes.get(job)) for q in rounds[i + 1:] if job in q.speeds][:around]
            if not before or not after:
                continue
            b = statistics.fmean(s for s, _ in before)
            a = statistics.fmean(s for s, _ in after)
            same = [q.speeds[job] for q in rounds if job in q.speeds and q.shapes.get(job) == before[-1][1]][1:]
            noise = (100.0 * statistics.stdev(same) / statistics.fmean(same) * math.sqrt(2.0 / around)
                     if len(same) > 2 else None)
            jobs[job] = {"before": b, "after": a, "change_pct": 100.0 * (a / b - 1.0) if b > 0 else None,
                         "noise_pct": noise, "reshaped": len({sh for _, sh in before + after}) > 1}
        out.append({"t_s": round(r.t, 3), "moves": [d.split(" ", 1)[0] for d in moves], "jobs": jobs})
    return out


def worst_change(places: Sequence[dict[str, Any]]) -> float | None:
    """The largest drop (most negative ``change_pct``) of a job whose shape did not change."""
    vals = [j["change_pct"] for p in places for j in p["jobs"].values()
            if not j["reshaped"] and j["change_pct"] is not None]
    return min(vals) if vals else None


def summarize(run: Any, slo_ms: dict[str, float]) -> dict[str, float]:
    """Flat metrics of a real run (``name:subject`` keys, the unit as suffix; :func:`label` names them)."""
    res = run.result
    m: dict[str, float] = {"wall_s": res.wall_s, "unfinished_jobs": float(res.unfinished - len(res.failed_jobs)),
                           "failed_jobs": float(len(res.failed_jobs)), "job_failures": float(len(res.failures)),
                           "steps_lost": float(sum(f[3] for f in res.failures)),
                           "actuation_errors": float(len(res.actuation_errors)),
                           "replica_failures": float(len(res.replica_failures))}
    for job, jct in run.result.jct_s.items():
        m[f"jct_s:{job}"] = jct
    if run.result.restarts_s:
        m["restart_s_mean"] = statistics.fmean(run.result.restarts_s)
    worst = worst_change(placements(res.rounds, around=3))
    if worst is not None:
        m["speed_change_at_replica_move_min_pct"] = worst
    for sid, windows in run.services.items():
        # every window with traffic is judged: one with errors, or with no success at all, is missed
        judged = [w for w in windows if w["ok"] + w["errors"] > 0]
        if judged:
            met = sum(1 for w in judged if w["p99_ms"] is not None and w["p99_ms"] <= slo_ms[sid] and w["errors"] == 0)
            m[f"slo_attainment_pct:{sid}"] = 100.0 * met / len(judged)
            m[f"windows_missed:{sid}"] = float(len(judged) - met)
        rep = run.load_reports.get(sid)
        if rep:
            m[f"errors:{sid}"] = float(sum(rep.get("errors", {}).values()))
            if rep.get("latency_ms", {}).get("p99") is not None:
                m[f"p99_ms:{sid}"] = rep["latency_ms"]["p99"]
    return m


def failures(run: Any) -> list[dict[str, Any]]:
    """What died during a real run and what became of it (the JSON's ``failures``)."""
    res = run.result
    jobs = [{"t_s": round(t, 3), "job": job, "what": what, "steps_lost": lost,
             "gave_up": res.failed_jobs.get(job) if i == max(k for k, f in enumerate(res.failures) if f[1] == job)
             else None} for i, (t, job, what, lost) in enumerate(res.failures)]
    return jobs + [{"t_s": round(t, 3), "replica": rid, "what": why, "replaced": True}
                   for t, rid, why in res.replica_failures]


LABELS = {"wall_s": "wall time (s)", "unfinished_jobs": "jobs unfinished", "failed_jobs": "jobs given up",
          "job_failures": "training process failures", "steps_lost": "training steps lost",
          "actuation_errors": "actuation errors (reconciled)", "replica_failures": "replica failures (replaced)",
          "restart_s_mean": "mean restart after a reshape (s)", "jct_s": "JCT of {} (s)",
          "slo_attainment_pct": "{}: SLO met (% of windows)", "windows_missed": "{}: windows missing the SLO",
          "errors": "{}: failed requests", "speed_change_at_replica_move_min_pct": "training speed after a replica move, worst (%)", "p99_ms": "{}: p99 latency over the run (ms)"}


def label(key: str) -> str:
    """A metric key of :func:`summarize` in words (``jct_s:cifar-ps`` → ``JCT of cifar-ps (s)``)."""
    name, _, subject = key.partition(":")
    text = LABELS.get(name)
    if text is None:
        return key
    return text.format(subject) if "{}" in text else text


_FIELD = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,()]+)")


def _fields(text: str) -> dict[str, str]:
    return {k: v.strip().strip("'\"") for k, v in _FIELD.findall(text)}


def _num(v: str | None, scale: float = 1.0) -> str:
    try:
        return f"{float(v) * scale:g}"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(v)


def action(subject: str, what: str) -> tuple[str, str]:
    """One recorded event (``run.events``: a job and what happened to it, or a harvesting
    decision's type and its repr) as (subject, action) in words."""
    f = _fields(what)
    if subject == "PlaceReplica":
        return f.get("service", "?"), (f"start a replica on {f.get('node', '?')} with {_num(f.get('cores'))} cores "
                                       f"(batches of up to {f.get('max_batch', '?')}, waiting at most "
                                       f"{_num(f.get('max_wait_s'), 1e3)} ms)")
    if subject == "ResizeReplica":
        return f.get("replica", "?"), f"resize to {_num(f.get('cores'))} cores (in place)"
    if subject == "MigrateReplica":
        return f.get("replica", "?"), f"move to {f.get('to_node', '?')} (the new replica serves before the old stops)"
    if subject == "EvictReplica":
        return f.get("replica", "?"), "stop"
    if subject == "ReplicaFailed":
        rid, _, why = what.partition(" ")
        return rid, f"{why or 'failed'}: taken out of routing and replaced"
    if subject.endswith("Failed") or (subject[:1].isupper() and "(" in what):  # another decision type
        words = re.sub(r"(?<!^)(?=[A-Z])", " ", subject).lower()
        return f.get("service", f.get("replica", "")), words + (": " + ", ".join(f"{k} {v}" for k, v in f.items())
                                                                 if f else "")
    return subject, what


def _axes(fig: go.Figure, rows: Sequence[str], x: str = "time (s)") -> None:
    for row, title in enumerate(rows, start=1):
        fig.update_yaxes(title_text=title, rangemode="tozero", row=row, col=1)
        fig.update_xaxes(title_text=x, row=row, col=1)


def figures(run: Any, slo_ms: dict[str, float]) -> list[go.Figure]:
    rounds = run.result.rounds
    jobs = sorted({j for r in rounds for j in r.shapes})
    figs = []
    if jobs:
        nodes = sorted({n for r in rounds for n in r.node_cpu})
        rows = ["samples/s", "count", "cores"]
        titles = ["training speed (hover: diagnosed bottleneck)", "shape: PS (solid) and workers (dotted)",
                  "CPU: allocated per job (lines)" + (" beside training use per node (filled)" if nodes else "")]
        fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=titles)
        for k, job in enumerate(jobs):
            pts = [(r.t, r.speeds[job], r.bottlenecks.get(job, "")) for r in rounds if job in r.speeds]
            if pts:
                fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], text=[p[2] for p in pts],
                                mode="lines+markers", name=job, legendgroup=job, line=line(k), row=1, col=1)
            sh = [(r.t, r.shapes[job]) for r in rounds if job in r.shapes]
            xs = [p[0] for p in sh]
            fig.add_scatter(x=xs, y=[p[1][0] for p in sh], mode="lines", name=f"{job} PS", legendgroup=job,
                            showlegend=False, line=line(k, shape="hv"), row=2, col=1)
            fig.add_scatter(x=xs, y=[p[1][1] for p in sh], mode="lines", name=f"{job} workers", legendgroup=job,
                            showlegend=False, line=line(k, shape="hv", dash="dot"), row=2, col=1)
            fig.add_scatter(x=xs, y=[p[1][2] for p in sh], mode="lines", name=f"{job} cores allocated",
                            legendgroup=job, showlegend=not pts, line=line(k, shape="hv", width=2.5), row=3, col=1)
        for n in nodes:
            fig.add_scatter(x=[r.t for r in rounds], y=[r.node_cpu.get(n, 0.0) for r in rounds], mode="lines",
                            stackgroup="use", name=f"training use on {n}", line={"width": 0.5}, opacity=0.5,
                            row=3, col=1)
        _axes(fig, rows)
        fig.update_layout(title="Training under NEARCHUS", height=820)
        figs.append(fig)
    for sid, windows in run.services.items():
        lat = [w for w in windows if w.get("p99_ms") is not None]
        reps = [(r.t, r.inference.get(sid, {}).get("replicas", [])) for r in rounds]
        nodes = sorted({n for _, rs in reps for n, _ in rs})
        panels = ([("p99 per window against the SLO (dotted)", "p99 latency (ms)")] if lat else []) \
            + ([("replicas: CPU limit per node", "cores")] if nodes else [])
        if not panels:
            continue
        f = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.16,
                          subplot_titles=[p[0] for p in panels])
        row = 1
        if lat:
            xs = [w["t_end_s"] for w in lat]
            f.add_bar(x=xs, y=[w["p99_ms"] for w in lat], name="p99", marker_color="#1f77b4", row=1, col=1)
            if sid in slo_ms:
                f.add_scatter(x=[min(xs), max(xs)], y=[slo_ms[sid]] * 2, mode="lines", name=f"SLO ({slo_ms[sid]:g} ms)",
                              line={"dash": "dot", "color": "#555"}, row=1, col=1)
            row = 2
        for n in nodes:
            f.add_scatter(x=[t for t, _ in reps], y=[sum(c for nn, c in rs if nn == n) for _, rs in reps],
                          mode="lines", line_shape="hv", stackgroup="cores", name=f"on {n}", row=row, col=1)
        _axes(f, [p[1] for p in panels])
        f.update_layout(title=f"Inference service {sid} (harvested CPU)", height=300 * len(panels) + 120)
        figs.append(f)
    return figs


def headline(run: Any, slo_ms: dict[str, float]) -> list[dict[str, Any]]:
    """The real run's key metrics in words: finished and unfinished jobs first."""
    m = summarize(run, slo_ms)
    rows: list[dict[str, Any]] = [{"metric": "jobs finished", "value": len(run.result.jct_s)}]
    rows += [{"metric": label(k), "value": v} for k, v in m.items()]
    return rows


def write_local_report(path: str | Path, title: str, run: Any, slo_ms: dict[str, float]) -> Path:
    """The real run's report at ``path``; plotly.js is written once beside it."""
    events = [{"time (s)": round(t, 1), "of": s, "action": a}
              for t, subject, what in run.events for s, a in [action(subject, what)]]
    parts = [table(headline(run, slo_ms), "Headline")]
    if events:
        parts.append("<h2>Actions</h2>" + table(events))
    if getattr(run.result, "failures", None) or getattr(run.result, "replica_failures", None):
        names = {"t_s": "time (s)", "steps_lost": "steps lost", "gave_up": "given up"}
        parts.append("<h2>Failures</h2>" + table([
            {names.get(k, k): ("yes" if v is True else v) for k, v in f.items()} for f in failures(run)]))
    return write_page(path, title, parts, figures(run, slo_ms))
