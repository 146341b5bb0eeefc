"""Chart material for the site: each provider's colour, short shape labels, the y axis a chart needs,
and sparkline SVG points. The charts themselves are drawn in the browser (site.js) from the pages'
data files, loaded when a chart comes into view.
"""
from __future__ import annotations

import colorsys
import math
import re
from typing import Any

OURS = "triton"
# Our kernels: always this colour, drawn thicker and on top, on every chart of the site.
OURS_COLOR = "#d62728"
# Every other provider: one colour each, in the site's provider order, the same on every page of a
# build. 24 colours picked greedily for the largest smallest CIELAB distance (26.6) from each other
# and from OURS_COLOR, among colours with a contrast of at least 3:1 on white (a thin line stays
# visible).
PALETTE = ("#1f77b4", "#049f04", "#0606ef", "#ef06b5", "#5c4e23", "#40037c", "#049f85", "#94385e",
           "#c78605", "#0667ef", "#c806ef", "#788b18", "#23585c", "#7c2c03", "#23285c", "#ef0667",
           "#136c29", "#a843b1", "#ef6706", "#439fb1", "#0525c7", "#b17a43", "#5c2823", "#6c1365")


def provider_colors(providers: list[str]) -> dict[str, str]:
    """provider -> colour, distinct for every provider given (past the palette, evenly spaced hues
    that skip red)."""
    out, n = {}, 0
    for p in providers:
        if p == OURS:
            out[p] = OURS_COLOR
            continue
        out[p] = PALETTE[n] if n < len(PALETTE) else _extra(n - len(PALETTE))
        n += 1
    return out


def _extra(i: int) -> str:
    hue = (0.08 + 0.618034 * i) % 1.0 * 0.84 + 0.08  # golden-angle steps over the hues apart from red
    r, g, b = colorsys.hls_to_rgb(hue, 0.3 + 0.06 * (i % 2), 0.75)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def log_axis(values: list[float | None]) -> bool:
    """Whether a chart of these values needs a log axis: they span more than a decade."""
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return bool(vals) and max(vals) > 10 * min(vals)


LABEL_MAX = 14  # characters of a tick label; longer labels number the shapes instead


def _short(value: str) -> str:
    """4096 -> 4k, 14336 -> 14k, 131072 -> 128k: whole multiples of 1024 past 1024."""
    return f"{int(value) // 1024}k" if re.fullmatch(r"\d{4,}", value) and int(value) % 1024 == 0 else value


def compact(shapes: list[str]) -> tuple[list[str], str]:
    """Tick labels for named shapes and the axis title that names the dims: M=4096,N=14336 -> 4k×14k
    under "shape (M × N)". Dims with one value over every shape go to the title ("shape (Sq × D)"
    over "B=4, causal=1"), so that the labels stay short. Where the labels would still be long (many
    dims vary), the shapes are numbered in grid order and a point's hover names its dims. Labels are
    plain text: site.js escapes them for Plotly."""
    parts = [[p.partition("=") for p in s.split(",")] for s in shapes]
    names = [n for n, _, _ in parts[0]] if parts else []
    if not parts or any([n for n, _, _ in p] != names or not all(eq for _, eq, _ in p) for p in parts):
        labels, title = list(shapes), "shape"
    else:
        varying = [i for i in range(len(names)) if len({p[i][2] for p in parts}) > 1] or list(range(len(names)))
        fixed = ", ".join(f"{names[i]}={parts[0][i][2]}" for i in range(len(names)) if i not in varying)
        labels = ["×".join(_short(p[i][2]) for i in varying) for p in parts]
        title = f"shape ({' × '.join(names[i] for i in varying)})" + (f"\n{fixed}" if fixed else "")
    if max(map(len, labels), default=0) > LABEL_MAX:
        return [f"#{i + 1}" for i in range(len(shapes))], "shape (# in grid order; hover a point for its dims)"
    return labels, title


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
