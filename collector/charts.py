"""Chart material for the site: Plotly figure dicts (plain JSON, not plotly.graph_objects, whose
validation would cost seconds over hundreds of figures) and sparkline SVG points.

The trend charts are drawn in the browser from the per-kernel data files (site.js), because their
data is loaded only when a section is shown; the figures here are the small ones a page carries.
"""
from __future__ import annotations

from typing import Any

# One colour per provider, fixed across every chart of the site (Plotly's default cycle).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


def provider_colors(providers: list[str]) -> dict[str, str]:
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(providers)}


def shape_figure(rows: list[dict[str, Any]], shapes: list[str], providers: list[str], colors: dict[str, str],
                 unit: str, ceiling: float | None, ceiling_name: str, axis_title: str) -> dict[str, Any]:
    """The metric (GB/s or TFLOP/s) of every provider against shape, with the measured ceiling as
    the roof. Rows that did not pass the gate have no point: a gap, never a speed."""
    traces = []
    by = {(r["provider"], r["shape"]): r for r in rows}
    for p in providers:
        cells = [by.get((p, s)) for s in shapes]
        if not any(c and c["rate"] is not None for c in cells):
            continue
        y = [c["rate"] if c else None for c in cells]
        text = [_hover(c, unit) for c in cells]
        traces.append({"type": "scatter", "mode": "lines+markers", "name": p, "meta": p, "x": shapes, "y": y,
                       "text": text, "hovertemplate": "%{text}<extra>" + p + "</extra>",
                       "line": {"color": colors[p]}, "marker": {"size": 7}})
    if ceiling:
        traces.append({"type": "scatter", "mode": "lines", "name": f"measured {ceiling_name} ({ceiling:,.0f} {unit})",
                       "x": shapes, "y": [ceiling] * len(shapes), "hoverinfo": "skip",
                       "line": {"color": "#444", "dash": "dash", "width": 1.5}})
    layout = {"height": 320, "margin": {"l": 60, "r": 10, "t": 30, "b": 60},
              "legend": {"orientation": "h", "y": 1.12, "x": 0},
              "xaxis": {"title": {"text": axis_title}, "type": "category"},
              "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
              "hovermode": "closest"}
    return {"data": traces, "layout": layout}


def _hover(row: dict[str, Any] | None, unit: str) -> str:
    if row is None:
        return ""
    if row["rate"] is None:
        return f"{row['shape']}: {row['status']}"
    frac = f", {100 * row['frac_of_peak']:.0f}% of ceiling" if row["frac_of_peak"] is not None else ""
    return f"{row['shape']}: {row['rate']:,.4g} {unit}, {row['median_ms']:.4g} ms{frac}"


def sparkline(values: list[float], width: int = 100, height: int = 24) -> str:
    """SVG polyline points for values, scaled to the box. Rounded to whole units of a 100x24 box: a sparkline has no more resolution than that, and
    the overview carries hundreds of them."""
    if len(values) < 2:  # one commit has no trend to draw
        return ""
    lo, hi = min(values), max(values)
    # A span of at least 20% of the level: run-to-run noise of a percent stays a wiggle instead of
    # being stretched to the full height, while a real step still shows.
    centre = (hi + lo) / 2
    span = max(hi - lo, 0.2 * abs(centre), 1e-12)
    lo = centre - span / 2
    n = len(values)
    pts = []
    for i, v in enumerate(values):
        x = width * i / (n - 1) if n > 1 else width / 2
        y = 2 + (height - 4) * (1 - (v - lo) / span)
        pts.append(f"{x:.0f},{y:.0f}")
    return " ".join(pts)
