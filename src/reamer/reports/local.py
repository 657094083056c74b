"""Summary and HTML report of a real (local-backend) run: per-round training speed and
shape, what NEARCHUS diagnosed, and each service's per-window p99 against its SLO."""

from __future__ import annotations

import html
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.io import to_html
from plotly.subplots import make_subplots

from reamer.reports.results import write_atomic


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


def summarize(run: Any, slo_ms: dict[str, float]) -> dict[str, float]:
    """Flat metrics of a real run (DESIGN.md §4 style keys)."""
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


def figures(run: Any, slo_ms: dict[str, float]) -> list[go.Figure]:
    rounds = run.result.rounds
    jobs = sorted({j for r in rounds for j in r.shapes})
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("training speed (samples/s)",
                                                                            "allocation: PS count, cores"))
    for job in jobs:
        pts = [(r.t, r.speeds[job]) for r in rounds if job in r.speeds]
        fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=f"{job} speed",
                        text=[r.bottlenecks.get(job, "") for r in rounds if job in r.speeds], row=1, col=1)
        sh = [(r.t, r.shapes[job]) for r in rounds if job in r.shapes]
        fig.add_scatter(x=[p[0] for p in sh], y=[p[1][0] for p in sh], mode="lines", line_shape="hv",
                        name=f"{job} PS", row=2, col=1)
        fig.add_scatter(x=[p[0] for p in sh], y=[p[1][2] for p in sh], mode="lines", line_shape="hv",
                        name=f"{job} cores", row=2, col=1)
    fig.update_layout(title="Training under NEARCHUS (hover: diagnosed bottleneck)", xaxis2_title="time (s)")
    figs = [fig]
    for sid, windows in run.services.items():
        f = make_subplots(rows=2, cols=1, shared_xaxes=True,
                          subplot_titles=(f"{sid}: p99 per window vs SLO (ms)", f"{sid}: replicas (node: cores)"))
        f.add_bar(x=[w["t_end_s"] for w in windows], y=[w["p99_ms"] for w in windows], name="p99", row=1, col=1)
        f.add_hline(y=slo_ms[sid], line_dash="dash", annotation_text="SLO", row=1, col=1)
        reps = [(r.t, r.inference.get(sid, {}).get("replicas", [])) for r in rounds]
        nodes = sorted({n for _, rs in reps for n, _ in rs})
        for n in nodes:
            f.add_scatter(x=[t for t, _ in reps], y=[sum(c for nn, c in rs if nn == n) for _, rs in reps],
                          mode="lines", line_shape="hv", stackgroup="cores", name=n, row=2, col=1)
        f.update_layout(title=f"Inference service {sid} (harvested CPU)", xaxis2_title="time (s)")
        figs.append(f)
    return figs


def write_local_report(path: str | Path, title: str, run: Any, slo_ms: dict[str, float]) -> Path:
    metrics = summarize(run, slo_ms)
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:,.2f}</td></tr>" for k, v in metrics.items())
    events = "".join(f"<li>{t:.1f} s — {html.escape(str(a))}: {html.escape(str(b))}</li>" for t, a, b in run.events)
    parts = [f"<h1>{html.escape(title)}</h1>", f"<table border=1 cellpadding=4>{rows}</table>",
             f"<h2>Actions</h2><ul>{events}</ul>"]
    for i, fig in enumerate(figures(run, slo_ms)):
        parts.append(to_html(fig, full_html=False, include_plotlyjs=(i == 0)))
    doc = ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title)
           + "</title></head><body style='font-family:sans-serif'>" + "\n".join(parts) + "</body></html>")
    write_atomic(path, doc)
    return Path(path)
