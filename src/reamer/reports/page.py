"""What every HTML report shares: one copy of plotly.js next to the reports (not 5 MB
inside each), the page around the figures, headline tables, per-run line styles and
readable log-axis ticks."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import plotly.graph_objects as go
from plotly.io import to_html

from reamer.reports.results import write_atomic

PLOTLY_JS = "plotly.min.js"  # written beside the report, shared by every report in that folder
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
CSS = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0 1.5em}"
       "th,td{border:1px solid #bbb;padding:3px 8px}td.n{text-align:right}th{background:#f2f2f2}")


def color(k: int) -> str:
    """One colour per run, the same in every figure."""
    return f"hsl({(k * 67) % 360},60%,45%)"


def line(k: int, **extra: object) -> dict:
    """Colour and dash of run ``k``: runs whose lines overlap stay apart in print and for
    colour-blind readers."""
    return {"color": color(k), "dash": DASHES[k % len(DASHES)], **extra}


def write_plotly_js(folder: Path) -> Path:
    """plotly.js of the installed plotly, once per folder (rewritten when it differs)."""
    from plotly.offline import get_plotlyjs

    path = folder / PLOTLY_JS
    js = get_plotlyjs()
    if not path.exists() or path.stat().st_size != len(js.encode()):
        write_atomic(path, js)
    return path


def write_page(path: str | Path, title: str, parts: Sequence[str], figs: Iterable[go.Figure]) -> Path:
    """The report: ``parts`` (HTML), then the figures, loading the shared plotly.js."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_plotly_js(path.parent)
    body = [f"<h1>{html.escape(title)}</h1>", *parts]
    body += [to_html(fig, full_html=False, include_plotlyjs=False, config={"displaylogo": False}) for fig in figs]
    doc = ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title>"
           f"<style>{CSS}</style><script src='{PLOTLY_JS}'></script></head><body>" + "\n".join(body)
           + "</body></html>")
    write_atomic(path, doc)
    return path


def fmt(v: object) -> str:
    if isinstance(v, bool) or v is None:
        return "–" if v is None else html.escape(str(v))
    if isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) < 1e6):
        return f"{int(v):,}"
    if isinstance(v, float):
        return "–" if not math.isfinite(v) else f"{v:,.2f}"
    return html.escape(str(v))


def table(rows: Sequence[dict], caption: str = "") -> str:
    """Rows of one shape as an HTML table (numbers right-aligned)."""
    if not rows:
        return ""
    cols = list(dict.fromkeys(c for r in rows for c in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(
        f"<td class='n'>{fmt(r.get(c))}</td>" if isinstance(r.get(c), int | float) and not isinstance(r.get(c), bool)
        else f"<td>{fmt(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
    cap = f"<caption style='text-align:left;font-weight:bold'>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<tr>{head}</tr>{body}</table>"


def log_ticks(values: Iterable[float]) -> dict:
    """Tick values 1-2-5 per decade over the positive ``values``, labelled as plain numbers
    (plotly's own minor labels read "2 … 9" for 0.2–0.9)."""
    pos = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not pos:
        return {}
    lo, hi = math.floor(math.log10(min(pos))), math.ceil(math.log10(max(pos)))
    vals = [m * 10.0 ** e for e in range(lo, hi + 1) for m in (1, 2, 5)]
    vals = [v for v in vals if min(pos) / 2.5 <= v <= max(pos) * 2.5]
    return {"tickvals": vals, "ticktext": [f"{v:g}" for v in vals]}


def log_range(values: Iterable[float], pad: float = 1.25) -> list[float] | None:
    """A log axis's range (log10 units) over the positive ``values``, ``pad`` × either side."""
    pos = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not pos:
        return None
    return [math.log10(min(pos) / pad), math.log10(max(pos) * pad)]
