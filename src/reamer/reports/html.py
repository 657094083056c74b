"""Interactive HTML report of simulated runs (plotly, sharing one plotly.js beside the
report): a headline table (finished and unfinished jobs, JCT, use beside allocation), the
JCT CDF, queue and use/allocation over time, per-job allocation timelines when a run
tracked them, and for co-location runs the GPU nodes' CPU and each service's p99 against
its SLO."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from reamer.reports.page import color, line, log_range, log_ticks, write_page
from reamer.reports.page import table as html_table

MAX_POINTS = 2000


def _thin(xs: Sequence[float], ys: Sequence[float], n: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    if len(xs) <= n:
        return list(xs), list(ys)
    idx = np.linspace(0, len(xs) - 1, n).astype(int)
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _packed(xs: Sequence[float], ys: Sequence[float], n: int = MAX_POINTS) -> dict:
    """A trace's ``x`` and ``y``, thinned to about ``n`` points, compact: evenly spaced x as
    ``x0``/``dx`` (one number, not one per point), y as a float32 array that plotly writes
    base64-packed (~5 bytes a point, not ~18 as JSON text). Many-trace figures stay small."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(xs) > n:
        step = -(-len(xs) // n)  # a stride keeps the spacing even
        xs, ys = xs[::step], ys[::step]
    if len(xs) > 2 and np.allclose(np.diff(xs), xs[1] - xs[0], rtol=1e-6, atol=1e-9):
        return {"x0": float(xs[0]), "dx": float(xs[1] - xs[0]), "y": ys.astype(np.float32)}
    return {"x": xs.astype(np.float32), "y": ys.astype(np.float32)}


_color = color  # kept for callers of the old name


def _has_gpus(results: Sequence) -> bool:
    """Whether any run's cluster has GPUs in use or allocated (no GPU panel or column for
    CPU-only clusters)."""
    return any(r.metrics.get("gpu_alloc_pct", 0.0) > 0 or any(v > 0 for v in r.series.get("gpu_alloc_pct", ()))
               for r in results)


def _finished(r) -> str:
    n = len(r.jobs)
    return f"{n}/{n + r.unfinished} finished"


def headline(results: Sequence) -> list[dict]:
    """One row per run: finished and unfinished jobs (JCT is over the finished ones only),
    JCT, queueing, and use beside allocation."""
    gpus = _has_gpus(results)
    rows = []
    for r in results:
        m = r.metrics
        row: dict[str, object] = {"policy": r.policy, "jobs finished": len(r.jobs), "jobs unfinished": r.unfinished,
                                  "mean JCT (h)": m.get("mean_jct_s", math.nan) / 3600.0,
                                  "p95 JCT (h)": m.get("p95_jct_s", math.nan) / 3600.0,
                                  "mean queueing (h)": m.get("mean_queue_s", math.nan) / 3600.0,
                                  "CPU used %": m.get("cpu_util_pct", math.nan),
                                  "CPU allocated %": m.get("cpu_alloc_pct", math.nan)}
        if gpus:
            row["GPU used % (model-busy)"] = m.get("gpu_util_pct", math.nan)
            row["GPU allocated %"] = m.get("gpu_alloc_pct", math.nan)
        row["reconfigurations"] = m.get("reconfigurations", math.nan)
        rows.append(row)
    return rows


def figures(results: Sequence) -> list[go.Figure]:
    figs = []
    total = max((len(r.jobs) + r.unfinished for r in results), default=0)
    cdf = go.Figure()
    hours: list[float] = []
    for k, r in enumerate(results):
        jct = np.sort([j.jct_s for j in r.jobs]) / 3600.0
        if len(jct):
            n = len(jct) + r.unfinished  # share of all jobs: unfinished ones never arrive
            x, y = _thin(list(jct), list(np.arange(1, len(jct) + 1) / n))
            hours += [x[0], x[-1]]
            cdf.add_scatter(x=[x[0], *x], y=[0.0, *y], mode="lines+markers" if len(x) < 30 else "lines",
                            name=f"{r.policy} ({_finished(r)})", line=line(k, shape="hv"))
    if hours:
        cdf.update_layout(title=f"Job completion time (CDF over all {total} jobs; unfinished jobs never finish)",
                          xaxis={"title": "JCT (hours, log scale)", "type": "log", **log_ticks(hours)},
                          yaxis={"title": "share of all jobs finished", "range": [0, 1.02]})
        figs.append(cdf)

    panels = [("queue", None, "queued jobs", "jobs"),
              ("cpu_used_pct", "cpu_alloc_pct", "CPU: used (thick) and allocated (thin)", "% of cluster cores")]
    if _has_gpus(results):
        panels.append(("gpu_used_pct", "gpu_alloc_pct", "GPU: model-busy (thick) and allocated (thin)",
                       "% of cluster GPUs"))
    ts = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                       subplot_titles=[p[2] for p in panels])
    for k, r in enumerate(results):
        t = [x / 3600.0 for x in r.series.get("t", [])]
        for row, (used, alloc, _, _) in enumerate(panels, start=1):
            ts.add_scatter(**_packed(t, r.series.get(used, [])), mode="lines", name=r.policy, legendgroup=r.policy,
                           showlegend=row == 1,
                           line=line(k, shape="hv", width=2.5), row=row, col=1)
            if alloc:
                ts.add_scatter(**_packed(t, r.series.get(alloc, [])), mode="lines", name=f"{r.policy} allocated",
                               legendgroup=r.policy,
                               showlegend=False, opacity=0.6, line=line(k, shape="hv", width=1), row=row, col=1)
    for row, (_, _, _, unit) in enumerate(panels, start=1):
        ts.update_yaxes(title_text=unit, rangemode="tozero", row=row, col=1)
        ts.update_xaxes(title_text="time (hours)", row=row, col=1)
    ts.update_layout(title="Over time", height=300 * len(panels))
    figs.append(ts)

    colo = [r for r in results if getattr(r, "inference_series", None)]
    if colo:
        figs += colocation_figures(colo)
    tracked = [r for r in results if r.timelines]
    jobs = sorted({j for r in tracked for j, pts in r.timelines.items() if pts})[:6]
    if jobs:
        tl = make_subplots(rows=len(jobs), cols=1, shared_xaxes=False, subplot_titles=jobs,
                           vertical_spacing=0.4 / max(1, len(jobs)))
        for k, r in enumerate(results):
            for row, jid in enumerate(jobs, start=1):
                pts = r.timelines.get(jid, []) if r.timelines else []
                if not pts:
                    continue
                t = [p[0] / 3600.0 for p in pts]
                text = [f"{r.policy}: {p[1]} PS, {p[2]} workers, {p[3]:.1f} cores" for p in pts]
                tl.add_scatter(x=t, y=[p[3] for p in pts], text=text, hoverinfo="text+x", mode="lines+markers",
                               name=r.policy, legendgroup=r.policy, showlegend=row == 1,
                               line=line(k, shape="hv"), row=row, col=1)
        for row in range(1, len(jobs) + 1):
            tl.update_yaxes(title_text="cores allocated", row=row, col=1)
            tl.update_xaxes(title_text="time (hours)", row=row, col=1)
        tl.update_layout(title="Per-job allocation (cores; hover for PS/workers)", height=max(380, 280 * len(jobs)))
        figs.append(tl)
    return figs


def _with_counts(table: list[dict], results: Sequence) -> list[dict]:
    """The caller's table with each run's finished and unfinished jobs after its policy."""
    by = {r.policy: r for r in results}
    out = []
    for row in table:
        r = by.get(row.get("policy"))  # type: ignore[arg-type]
        if r is None or "jobs finished" in row:
            out.append(row)
            continue
        items = list(row.items())
        out.append({**dict(items[:1]), "jobs finished": len(r.jobs), "jobs unfinished": r.unfinished,
                    **dict(items[1:])})
    return out


def write_report(path: str | Path, title: str, results: Sequence, table: list[dict] | None = None,
                 extra: Sequence[go.Figure] = ()) -> Path:
    """The report at ``path``; plotly.js is written once beside it (``plotly.min.js``)."""
    parts = [html_table(headline(results), "Headline (JCT and queueing over finished jobs only)")]
    if table:
        parts.append(html_table(_with_counts(table, results), "Inference on the spare CPU"))
    return write_page(path, title, parts, [*figures(results), *extra])


def colocation_figures(results: Sequence) -> list[go.Figure]:
    """GPU training nodes' CPU stacked (training use, training unused, inference, idle) per
    run, for all GPU nodes together or one node (a menu), and each service's per-window p99
    against its SLO."""
    figs = []
    stack = make_subplots(rows=len(results), cols=1, shared_xaxes=True, vertical_spacing=0.3 / len(results),
                          subplot_titles=[f"{r.policy}: CPU of GPU training nodes" for r in results])
    layers = (("training_used_cores", "training use", "#1f77b4"),
              ("training_unused_cores", "training allocated, unused", "#aec7e8"),
              ("harvested_cores", "inference (harvested)", "#2ca02c"), ("idle_cores", "idle", "#dddddd"))
    nodes = sorted({k.split(":", 2)[2] for r in results for k in r.inference_series if k.startswith("node_cpu:")})
    views = ["", *nodes]  # "" = all GPU nodes
    owner: list[str] = []  # the view of each trace
    for view in views:
        for row, r in enumerate(results, start=1):
            s = r.inference_series
            t = [x / 3600.0 for x in s["t"]]
            for key, label, col in layers:
                # one node's view (a menu choice) at a coarser step: nodes × runs × 4 traces
                xy = _packed(t, s.get(f"node_cpu:{key}:{view}" if view else key, [0.0] * len(t)),
                             MAX_POINTS // 4 if view else MAX_POINTS)
                stack.add_scatter(**xy, name=label, legendgroup=label, showlegend=row == 1 and not view,
                                  stackgroup=f"s{row}", mode="lines", line={"width": 0.5, "color": col},
                                  visible=not view, row=row, col=1)
                owner.append(view)
    if nodes:
        stack.update_layout(updatemenus=[{"x": 1.0, "y": 1.08, "xanchor": "right", "buttons": [
            {"label": v or "all GPU nodes", "method": "update", "args": [{"visible": [o == v for o in owner]}]}
            for v in views]}])
    for row in range(1, len(results) + 1):
        stack.update_yaxes(title_text="cores", rangemode="tozero", row=row, col=1)
        stack.update_xaxes(title_text="time (hours)", row=row, col=1)
    stack.update_layout(title="Where the GPU nodes' CPU goes", height=max(380, 330 * len(results)))
    figs.append(stack)

    lat = go.Figure()
    values: list[float] = []
    t_all: list[float] = []
    for k, r in enumerate(results):
        s = r.inference_series
        t = [x / 3600.0 for x in s["t"]]
        t_all += t
        for key in (key for key in s if key.startswith("p99_ms:")):
            x, y = _thin(t, s[key])
            y = [v if v is not None and math.isfinite(v) and v > 0 else None for v in y]
            values += [v for v in y if v is not None]
            lat.add_scatter(x=x, y=y, mode="lines", name=f"{r.policy} {key[7:]}", line=line(k))
    slos = {k[7:]: v[0] for r in results for k, v in r.inference_series.items() if k.startswith("slo_ms:") and v}
    t0, t1 = (min(t_all), max(t_all)) if t_all else (0.0, 1.0)
    for sid, slo in sorted(slos.items()):
        # a trace, not add_hline: a line annotation's y on a log axis is read as log10 (300 → 1e300)
        lat.add_scatter(x=[t0, t1], y=[slo, slo], mode="lines", name=f"SLO {sid} ({slo:g} ms)",
                        line={"dash": "dot", "color": "#555", "width": 1.5}, hoverinfo="name")
        lat.add_annotation(text=f"SLO {sid}", x=0, xref="paper", xanchor="left", y=math.log10(slo), yref="y",
                           yanchor="bottom", showarrow=False, font={"color": "#555"})
    rng = log_range([*values, *slos.values()])
    lat.update_layout(title="Per-service p99 latency per window and SLOs (dotted)", xaxis_title="time (hours)",
                      yaxis={"title": "p99 latency (ms, log scale)", "type": "log",
                             **({"range": rng} if rng else {}), **log_ticks([*values, *slos.values()])})
    figs.append(lat)
    return figs
