"""Chart material for the site: Plotly figure dicts (plain JSON, not plotly.graph_objects, whose
validation would cost seconds over hundreds of figures) and sparkline SVG points.

The trend charts are drawn in the browser from the per-kernel data files (site.js), because their
data is loaded only when a section is shown; the figures here are the small ones a page carries.
Legends sit above the plot area, never over the lines, and every axis has a title with its unit.
"""
from __future__ import annotations

from html import escape
from typing import Any

# One colour per provider, fixed across every chart of the site (Plotly's default cycle).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
LEGEND = {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom", "font": {"size": 11}}
MIB = 2**20


def provider_colors(providers: list[str]) -> dict[str, str]:
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(providers)}


def compact(shapes: list[str]) -> tuple[list[str], str]:
    """Tick labels for named shapes and the axis title that names the dims: M=4096,N=14336 ->
    4096×14336 under "shape (M × N)". Dims with one value over every shape leave the labels for the
    title ("shape (Sq × D)" over "B=4, causal=1"), so that the labels stay short enough for a phone. Labels
    that are not all of one named form stay as they are. Escaped: Plotly renders labels as a small
    subset of HTML, and these come from the data."""
    parts = [[p.partition("=") for p in s.split(",")] for s in shapes]
    names = [n for n, _, _ in parts[0]] if parts else []
    if not parts or any([n for n, _, _ in p] != names or not all(eq for _, eq, _ in p) for p in parts):
        return [escape(s, quote=False) for s in shapes], "shape"
    varying = [i for i in range(len(names)) if len({p[i][2] for p in parts}) > 1] or list(range(len(names)))
    fixed = ", ".join(f"{names[i]}={parts[0][i][2]}" for i in range(len(names)) if i not in varying)
    title = escape(f"shape ({' × '.join(names[i] for i in varying)})", quote=False)
    return [escape("×".join(p[i][2] for i in varying), quote=False) for p in parts], title + (f"<br>{escape(fixed, quote=False)}" if fixed else "")


def _layout(x_title: str, y_title: str, log: bool) -> dict[str, Any]:
    return {"height": 340, "margin": {"l": 64, "r": 10, "t": 10, "b": 10},
            "legend": LEGEND, "hovermode": "closest",
            "xaxis": {"title": {"text": x_title}, "type": "category", "automargin": True},
            "yaxis": {"title": {"text": y_title}, "type": "log" if log else "linear", "automargin": True}}


def shape_figure(rows: list[dict[str, Any]], shapes: list[str], providers: list[str], colors: dict[str, str],
                 unit: str, ceiling: float | None, ceiling_name: str) -> dict[str, Any]:
    """The metric (GB/s or TFLOP/s) of every provider against shape, with the measured ceiling as
    the roof. Rows that did not pass the gate have no point: a gap, never a speed."""
    ticks, axis_title = compact(shapes)
    traces = []
    by = {(r["provider"], r["shape"]): r for r in rows}
    for p in providers:
        cells = [by.get((p, s)) for s in shapes]
        if not any(c and c["rate"] is not None for c in cells):
            continue
        y = [c["rate"] if c else None for c in cells]
        text = [_hover(c, unit) for c in cells]
        traces.append({"type": "scatter", "mode": "lines+markers", "name": escape(p, quote=False), "meta": p,
                       "x": ticks, "y": y, "text": text, "hovertemplate": "%{text}<extra>" + escape(p, quote=False) + "</extra>",
                       "line": {"color": colors[p]}, "marker": {"size": 7}})
    if ceiling:
        traces.append({"type": "scatter", "mode": "lines", "name": f"measured {ceiling_name} ({ceiling:,.0f} {unit})",
                       "x": ticks, "y": [ceiling] * len(shapes), "hoverinfo": "skip",
                       "line": {"color": "#444", "dash": "dash", "width": 1.5}})
    return {"data": traces, "layout": _layout(axis_title, f"{unit} (higher is faster)", log=False)}


def memory_figure(rows: list[dict[str, Any]], shapes: list[str], providers: list[str],
                  colors: dict[str, str]) -> dict[str, Any] | None:
    """Peak memory one call allocates beyond what existed before it, against shape; None when no
    row of the part recorded it."""
    ticks, axis_title = compact(shapes)
    by = {(r["provider"], r["shape"]): r for r in rows}
    traces = []
    for p in providers:
        y = [(by[(p, s)]["peak_mem_bytes"] / MIB if (p, s) in by and by[(p, s)].get("peak_mem_bytes") is not None
              else None) for s in shapes]
        if all(v is None for v in y):
            continue
        traces.append({"type": "scatter", "mode": "lines+markers", "name": escape(p, quote=False), "meta": p,
                       "x": ticks, "y": y, "text": [escape(s, quote=False) for s in shapes],
                       "hovertemplate": "%{text}: %{y:,.4g} MiB<extra>" + escape(p, quote=False) + "</extra>",
                       "line": {"color": colors[p]}, "marker": {"size": 7}})
    if not traces:
        return None
    return {"data": traces, "layout": _layout(axis_title, "peak memory per call (MiB)", log=False)}


def _hover(row: dict[str, Any] | None, unit: str) -> str:
    if row is None:
        return ""
    shape = escape(row["shape"], quote=False)
    if row["rate"] is None:
        return f"{shape}: {row['status']}"
    frac = f", {100 * row['frac_of_peak']:.0f}% of ceiling" if row["frac_of_peak"] is not None else ""
    return f"{shape}: {row['rate']:,.4g} {unit}, {row['median_ms']:.4g} ms{frac}"


def sparkline(values: list[float], width: int = 100, height: int = 24, mark: int | None = None) -> dict[str, Any] | str:
    """SVG polyline points for values, scaled to the box. Rounded to whole units of a 100x24 box: a
    sparkline has no more resolution than that, and the overview carries hundreds of them. With
    `mark` (an index), returns {"points", "x", "y"}: the line and where that point sits."""
    if len(values) < 2:  # one commit has no trend to draw
        return "" if mark is None else {"points": "", "x": None, "y": None}
    lo, hi = min(values), max(values)
    # A span of at least 20% of the level: run-to-run noise of a percent stays a wiggle instead of
    # being stretched to the full height, while a real step still shows.
    centre = (hi + lo) / 2
    span = max(hi - lo, 0.2 * abs(centre), 1e-12)
    lo = centre - span / 2
    n = len(values)
    xy = [(width * i / (n - 1), 2 + (height - 4) * (1 - (v - lo) / span)) for i, v in enumerate(values)]
    points = " ".join(f"{x:.0f},{y:.0f}" for x, y in xy)
    if mark is None:
        return points
    return {"points": points, "x": round(xy[mark][0]), "y": round(xy[mark][1])}
