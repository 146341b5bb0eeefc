"""The summary table printed at the end of a run (and by `kcollect summary`)."""
from __future__ import annotations

from typing import Any, Iterable

HEADER = ("kernel", "mode", "shape", "dtype", "provider", "median ms", "GB/s or TFLOP/s", "% peak", "vs base", "error")


def metric(row: dict[str, Any]) -> tuple[float, str] | None:
    """(value, unit) of the row's rate: GB/s for memory-bound kernels, TFLOP/s for compute-bound."""
    if row.get("status") != "ok" or not row.get("median_ms"):
        return None
    if row["bound"] == "compute":
        return row["flops"] / (row["median_ms"] * 1e9), "TFLOP/s"
    return row["bytes"] / (row["median_ms"] * 1e6), "GB/s"


def fraction_of_peak(row: dict[str, Any], copy_gbps: float | None, matmul_tflops: float | None) -> float | None:
    m = metric(row)
    ceiling = matmul_tflops if row["bound"] == "compute" else copy_gbps
    return m[0] / ceiling if m and ceiling else None


def speedups(rows: list[dict[str, Any]]) -> dict[int, float]:
    """index in rows -> baseline median / this median, only where both passed the gate."""
    base = {}
    for r in rows:
        if r["provider"] == r["baseline"] and r["status"] == "ok":
            base[(r["kernel"], r["mode"], r["shape"], r["dtype"])] = r["median_ms"]
    out = {}
    for i, r in enumerate(rows):
        b = base.get((r["kernel"], r["mode"], r["shape"], r["dtype"]))
        if b and r["status"] == "ok":
            out[i] = b / r["median_ms"]
    return out


def table_cells(rows: list[dict[str, Any]], copy_gbps: float | None, matmul_tflops: float | None) -> list[tuple]:
    ups = speedups(rows)
    body = []
    for i, r in enumerate(rows):
        if r["status"] == "ok":
            value, _ = metric(r)
            frac = fraction_of_peak(r, copy_gbps, matmul_tflops)
            cells = (f"{r['median_ms']:.4f}", f"{value:.1f}", f"{100 * frac:.1f}" if frac else "-",
                     f"{ups[i]:.2f}x" if i in ups else "-", f"{r['rel_err']:.1e}" if r["rel_err"] is not None else "-")
        else:
            note = r["status"].upper()
            if r["status"] == "failed" and r.get("rel_err") is not None:
                cells = (note, "-", "-", "-", f"{r['rel_err']:.1e}")
            else:
                cells = (note, "-", "-", "-", (r.get("error") or "")[:60])
        body.append((r["kernel"], r["mode"], r["shape"], r["dtype"], r["provider"]) + cells)
    return body


def table_lines(rows: list[dict[str, Any]], copy_gbps: float | None, matmul_tflops: float | None) -> list[str]:
    return _format([HEADER] + table_cells(rows, copy_gbps, matmul_tflops))


def _format(table: Iterable[tuple]) -> list[str]:
    table = [tuple(str(c) for c in row) for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = []
    for j, row in enumerate(table):
        lines.append("  ".join(c.ljust(w) if i < 5 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def markdown_lines(rows: list[dict[str, Any]], copy_gbps: float | None, matmul_tflops: float | None) -> list[str]:
    out = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(" --- " for _ in HEADER) + "|"]
    for cells in table_cells(rows, copy_gbps, matmul_tflops):
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return out
