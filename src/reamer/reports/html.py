"""Self-contained interactive HTML report (plotly): JCT CDF, queue length, utilization,
and per-job allocation timelines when a run tracked them."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.io import to_html
from plotly.subplots import make_subplots

from reamer.reports.results import write_atomic

MAX_POINTS = 2000


def _thin(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    if len(xs) <= MAX_POINTS:
        return list(xs), list(ys)
    idx = np.linspace(0, len(xs) - 1, MAX_POINTS).astype(int)
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _color(k: int) -> str:
    """One colour per run, the same in every figure."""
    return f"hsl({(k * 67) % 360},60%,45%)"


def figures(results: Sequence) -> list[go.Figure]:
    figs = []
    cdf = go.Figure()
    for k, r in enumerate(results):
        jct = np.sort([j.jct_s for j in r.jobs])
        if len(jct):
            x, y = _thin(list(jct / 3600.0), list(np.arange(1, len(jct) + 1) / len(jct)))
            cdf.add_scatter(x=x, y=y, mode="lines", name=r.policy, line={"color": _color(k)})
    cdf.update_layout(title="Job completion time (CDF)", xaxis_title="JCT (hours)", yaxis_title="share of jobs",
                      xaxis_type="log")
    figs.append(cdf)

    ts = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                       subplot_titles=("Queued jobs", "CPU used (% of cluster cores)", "GPU used (% of cluster GPUs)"))
    for k, r in enumerate(results):
        t = [x / 3600.0 for x in r.series.get("t", [])]
        color = _color(k)
        for row, key in ((1, "queue"), (2, "cpu_used_pct"), (3, "gpu_used_pct")):
            x, y = _thin(t, r.series.get(key, []))
            ts.add_scatter(x=x, y=y, mode="lines", name=r.policy, legendgroup=r.policy,
                           showlegend=row == 1, line={"color": color, "shape": "hv"}, row=row, col=1)
    ts.update_layout(title="Over time", height=800)
    ts.update_xaxes(title_text="time (hours)", row=3, col=1)
    figs.append(ts)

    colo = [r for r in results if getattr(r, "inference_series", None)]
    if colo:
        figs += colocation_figures(colo)
    tracked = [r for r in results if r.timelines]
    if tracked:
        jobs = sorted({j for r in tracked for j in r.timelines})[:6]
        tl = make_subplots(rows=len(jobs), cols=1, shared_xaxes=False, subplot_titles=jobs,
                           vertical_spacing=0.3 / max(1, len(jobs)))
        for k, r in enumerate(results):
            if not r.timelines:
                continue
            color = _color(k)
            for row, jid in enumerate(jobs, start=1):
                pts = r.timelines.get(jid, [])
                if not pts:
                    continue
                t = [p[0] / 3600.0 for p in pts]
                text = [f"{r.policy}: {p[1]} PS, {p[2]} workers, {p[3]:.1f} cores" for p in pts]
                tl.add_scatter(x=t, y=[p[3] for p in pts], text=text, hoverinfo="text+x", mode="lines+markers",
                               name=r.policy, legendgroup=r.policy, showlegend=row == 1,
                               line={"color": color, "shape": "hv"}, row=row, col=1)
        tl.update_layout(title="Per-job allocation (cores; hover for PS/workers)", height=260 * len(jobs))
        figs.append(tl)
    return figs


def write_report(path: str | Path, title: str, results: Sequence, table: list[dict] | None = None,
                 extra: Sequence[go.Figure] = ()) -> Path:
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if table:
        cols = list(table[0])
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        rows = "".join("<tr>" + "".join(f"<td>{_fmt(r[c])}</td>" for c in cols) + "</tr>" for r in table)
        parts.append(f"<table border=1 cellpadding=4><tr>{head}</tr>{rows}</table>")
    for i, fig in enumerate([*figures(results), *extra]):
        parts.append(to_html(fig, full_html=False, include_plotlyjs=(i == 0)))
    doc = ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title)
           + "</title></head><body style='font-family:sans-serif'>" + "\n".join(parts) + "</body></html>")
    write_atomic(path, doc)
    return Path(path)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}"
    return html.escape(str(v))


def colocation_figures(results: Sequence) -> list[go.Figure]:
    """GPU training nodes' CPU stacked (training use, training unused, inference, idle) per
    run, for all GPU nodes together or one node (a menu), and each service's per-window p99
    against its SLO."""
    figs = []
    stack = make_subplots(rows=len(results), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                          subplot_titles=[f"{r.policy}: CPU of GPU training nodes (cores)" for r in results])
    layers = (("training_used_cores", "training use", "#1f77b4"), ("training_unused_cores", "training unused", "#aec7e8"),
              ("harvested_cores", "inference (harvested)", "#2ca02c"), ("idle_cores", "idle", "#dddddd"))
    nodes = sorted({k.split(":", 2)[2] for r in results for k in r.inference_series if k.startswith("node_cpu:")})
    views = ["", *nodes]  # "" = all GPU nodes
    owner: list[str] = []  # the view of each trace
    for view in views:
        for row, r in enumerate(results, start=1):
            s = r.inference_series
            t = [x / 3600.0 for x in s["t"]]
            for key, label, color in layers:
                x, y = _thin(t, s.get(f"node_cpu:{key}:{view}" if view else key, [0.0] * len(t)))
                stack.add_scatter(x=x, y=y, name=label, legendgroup=label, showlegend=row == 1 and not view,
                                  stackgroup=f"s{row}", mode="lines", line={"width": 0.5, "color": color},
                                  visible=not view, row=row, col=1)
                owner.append(view)
    if nodes:
        stack.update_layout(updatemenus=[{"x": 1.0, "y": 1.08, "xanchor": "right", "buttons": [
            {"label": v or "all GPU nodes", "method": "update", "args": [{"visible": [o == v for o in owner]}]}
            for v in views]}])
    stack.update_layout(title="Where the GPU nodes' CPU goes", height=260 * len(results))
    stack.update_xaxes(title_text="time (hours)", row=len(results), col=1)
    figs.append(stack)
    lat = go.Figure()
    for k, r in enumerate(results):
        s = r.inference_series
        t = [x / 3600.0 for x in s["t"]]
        for key in (key for key in s if key.startswith("p99_ms:")):
            x, y = _thin(t, s[key])
            lat.add_scatter(x=x, y=y, mode="lines", name=f"{r.policy} {key[7:]}", line={"color": _color(k)})
    slos = {k[7:]: v[0] for r in results for k, v in r.inference_series.items() if k.startswith("slo_ms:") and v}
    for sid, slo in sorted(slos.items()):
        lat.add_hline(y=slo, line={"dash": "dot", "color": "#888", "width": 1}, annotation_text=f"SLO {sid}",
                      annotation_position="top left")
    lat.update_layout(title="Per-service p99 latency per window (ms) and SLOs (dotted)", yaxis_type="log",
                      xaxis_title="time (hours)")
    figs.append(lat)
    return figs
