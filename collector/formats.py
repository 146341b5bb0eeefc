"""One way to print records for every command: an aligned text table, Markdown, CSV or JSON.

A command builds a list of records (dicts) whose keys are its columns in order, plus the text
(display) form of each cell where it differs; `render` turns them into lines. Column order follows
one rule across commands: what identifies a series first (kernel, mode, provider, shape, dtype,
device, machine), then the measurements, then the verdicts and notes.
"""
from __future__ import annotations

import csv
import io
import json
import math
from datetime import date, datetime
from typing import Any, Iterable, Sequence

import click

FORMATS = ("table", "markdown", "csv", "json")
IDENTITY = ("kernel", "mode", "provider", "shape", "dtype", "gpu", "machine")

format_option = click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                             help="Output: an aligned table, Markdown, CSV or JSON (for scripts and bots).")


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    return v


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render(records: Sequence[dict[str, Any]], fmt: str, columns: Sequence[str] | None = None,
           text: Sequence[dict[str, str]] | None = None, right: Iterable[str] = ()) -> list[str]:
    """Lines of `records` in `fmt`. `columns`: which keys, in order (default: the first record's).
    `text`: per record, the display form of cells (table and Markdown only; CSV and JSON keep the
    raw values, so that scripts get numbers). `right`: columns aligned right in the table."""
    columns = list(columns or (records[0].keys() if records else ()))
    if fmt == "json":
        return [json.dumps([{c: _plain(r.get(c)) for c in columns} for r in records], indent=1)]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        for r in records:
            w.writerow(["" if _plain(r.get(c)) is None else _plain(r.get(c)) for c in columns])
        return buf.getvalue().rstrip("\n").split("\n")
    cells = [[(text[i].get(c) if text and c in text[i] else _text(r.get(c))) for c in columns]
             for i, r in enumerate(records)]
    if fmt == "markdown":
        esc = [[c.replace("|", "\\|") for c in row] for row in [columns, *cells]]
        return (["| " + " | ".join(esc[0]) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
                + ["| " + " | ".join(row) + " |" for row in esc[1:]])
    if not columns:
        return []
    right = set(right)
    widths = [max(len(str(x)) for x in col) for col in zip(columns, *cells)]
    lines = []
    for j, row in enumerate([columns, *cells]):
        lines.append("  ".join(str(c).rjust(w) if name in right else str(c).ljust(w)
                               for c, w, name in zip(row, widths, columns)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines
