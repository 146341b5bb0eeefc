"""The summary of one run: printed at the end of `kcollect run` and by `kcollect summary`, in any
of the formats of formats.py, with the columns in the shared order (identity, measurements,
verdicts and notes)."""
from __future__ import annotations

import json
from typing import Any

from .formats import render
from .names import RATES
from .phases import NOT_WALL

COLUMNS = ("kernel", "mode", "provider", "shape", "dtype", "gpu", "machine",
           "median_ms", "p20_ms", "p80_ms", "rate", "unit", "pct_peak", "vs_base", "rel_err",
           "timing", "status", "note")
# the headers a person reads in the table and Markdown forms; CSV and JSON keep the keys
HEADERS = {"median_ms": "median ms", "p20_ms": "p20 ms", "p80_ms": "p80 ms", "pct_peak": "% peak",
           "vs_base": "vs base", "rel_err": "error"}
NUMERIC = ("median_ms", "p20_ms", "p80_ms", "rate", "pct_peak", "vs_base", "rel_err")


def metric(row: dict[str, Any]) -> tuple[float, str] | None:
    """(value, unit) of the row's rate: GB/s for memory-bound kernels, TFLOP/s for compute-bound."""
    if row.get("status") != "ok" or not row.get("median_ms"):
        return None
    column, scale, unit = RATES["compute" if row["bound"] == "compute" else "memory"]
    return row[column] / (row["median_ms"] * scale), unit


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


def records(rows: list[dict[str, Any]], copy_gbps: float | None, matmul_tflops: float | None,
            gpu: str | None = None, machine: str | None = None) -> list[dict[str, Any]]:
    """One record per result row, keyed by COLUMNS; measurements only where the row passed."""
    ups = speedups(rows)
    out = []
    for i, r in enumerate(rows):
        ok = r["status"] == "ok"
        rate = metric(r)
        frac = fraction_of_peak(r, copy_gbps, matmul_tflops)
        out.append({
            "kernel": r["kernel"], "mode": r["mode"], "provider": r["provider"], "shape": r["shape"],
            "dtype": r["dtype"], "gpu": gpu, "machine": machine,
            "median_ms": r["median_ms"] if ok else None, "p20_ms": r.get("p20_ms") if ok else None,
            "p80_ms": r.get("p80_ms") if ok else None,
            "rate": rate[0] if rate else None, "unit": rate[1] if rate else None,
            "pct_peak": 100 * frac if frac else None, "vs_base": ups.get(i), "rel_err": r.get("rel_err"),
            "timing": r.get("timing"), "status": r["status"], "note": None if ok else (r.get("error") or None),
        })
    return out


def is_ours(row: dict[str, Any]) -> bool:
    """Whether a row measured our own code, whose failing gate fails `kcollect run`: the row's
    `ours` (declared on the provider, Provider.ours; the store keeps it since schema 8, and gives
    older rows it on import). The one place the run's exit code asks it."""
    return bool(row.get("ours"))


def run_records(runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of several runs' rows (the workers' runs of one `kcollect run`), each against
    its own run's ceilings and labelled with its GPU and machine; in the order of `runs`."""
    from .regress import device

    out = []
    for run in runs:
        mine = [r for r in rows if r["run_id"] == run["run_id"]]
        out += records(mine, run["copy_gbps"], run["matmul_tflops"], gpu=device(run), machine=run.get("machine"))
    return out


def _display(rec: dict[str, Any]) -> dict[str, str]:
    """The table and Markdown forms of the cells whose plain form would be hard to read."""
    def num(key, fmt):
        return "-" if rec[key] is None else format(rec[key], fmt)

    return {"median_ms": num("median_ms", ".4f"), "p20_ms": num("p20_ms", ".4f"), "p80_ms": num("p80_ms", ".4f"),
            "rate": num("rate", ".1f"), "pct_peak": num("pct_peak", ".1f"),
            "vs_base": "-" if rec["vs_base"] is None else f"{rec['vs_base']:.2f}x",
            "rel_err": num("rel_err", ".1e"), "note": (rec["note"] or "")[:60]}


def lines(recs: list[dict[str, Any]], fmt: str) -> list[str]:
    """The summary table in `fmt`. The text forms leave out gpu and machine when no record has them
    (the end of `kcollect run`, where they are said once above the table)."""
    columns = [c for c in COLUMNS if fmt in ("csv", "json") or c not in ("gpu", "machine")
               or any(r[c] is not None for r in recs)]
    if fmt in ("csv", "json"):
        return render(recs, fmt, columns)
    headers = [HEADERS.get(c, c) for c in columns]
    shown = [{HEADERS.get(k, k): v for k, v in r.items()} for r in recs]
    text = [{HEADERS.get(k, k): v for k, v in _display(r).items()} for r in recs]
    return render(shown, fmt, headers, text, right=[HEADERS.get(c, c) for c in NUMERIC])


def table_lines(rows: list[dict[str, Any]], copy_gbps: float | None, matmul_tflops: float | None) -> list[str]:
    """The aligned table `kcollect run` prints at its end."""
    return lines(records(rows, copy_gbps, matmul_tflops), "table")


def phase_lines(run: dict[str, Any], fmt: str) -> list[str]:
    """Where the run's wall time went (runs.phases, JSON {phase: seconds}), largest first, with
    the share of the wall time (finished - started) and what no phase accounts for."""
    if not run.get("phases") or fmt in ("csv", "json"):
        return []
    phases = {k: float(v) for k, v in json.loads(run["phases"]).items()}
    # a run's own breakdown carries its wall time and parts of phases (timed_work, within timing):
    # neither is a phase of its own to add up
    wall = phases.pop("wall", None)
    parts = {k: phases.pop(k) for k in NOT_WALL if k in phases}
    if wall is None and run.get("finished_at") and run.get("started_at"):
        wall = (run["finished_at"] - run["started_at"]).total_seconds()
    total = wall if wall and wall >= sum(phases.values()) else sum(phases.values())
    if wall and wall > sum(phases.values()):
        phases["other"] = phases.get("other", 0.0) + wall - sum(phases.values())
    recs = [{"phase": k, "seconds": v, "share": 100 * v / total if total else None}
            for k, v in sorted({**phases, **parts}.items(), key=lambda kv: -kv[1])]
    text = [{"seconds": f"{r['seconds']:.1f}", "share": "-" if r["share"] is None else f"{r['share']:.0f}%"}
            for r in recs]
    title = f"wall time {total:.1f} s" + ("" if wall else " (sum of the phases; the run did not finish)")
    return ["", title + ":", *render(recs, fmt, text=text, right=("seconds", "share"))]


def cost_lines(rows: list[dict[str, Any]], fmt: str) -> list[str]:
    """Where the rows' own seconds went (results.seconds: each row's first call, check, timing and
    recheck; a case's inputs and float64 reference are not in them), kernel by kernel, largest
    first: the timed work inside them (median x reps) and the provider that took the most."""
    if fmt in ("csv", "json") or not any(r.get("seconds") for r in rows):
        return []
    by: dict[str, dict[str, Any]] = {}
    for r in rows:
        k = by.setdefault(r["kernel"], {"kernel": r["kernel"], "rows": 0, "seconds": 0.0, "timed": 0.0, "of": {}})
        s = r.get("seconds") or 0.0
        k["rows"] += 1
        k["seconds"] += s
        k["timed"] += (r.get("median_ms") or 0.0) * (r.get("reps") or 0) / 1e3
        k["of"][r["provider"]] = k["of"].get(r["provider"], 0.0) + s
    total = sum(k["seconds"] for k in by.values())
    recs = sorted(by.values(), key=lambda k: -k["seconds"])
    for k in recs:
        name, s = max(k.pop("of").items(), key=lambda kv: kv[1])
        k.update(share=100 * k["seconds"] / total if total else None, costliest=f"{name} ({s:.1f} s)")
    text = [{"seconds": f"{k['seconds']:.1f}", "timed": f"{k['timed']:.1f}",
             "share": "-" if k["share"] is None else f"{k['share']:.0f}%"} for k in recs]
    title = f"the rows' own {total:.1f} s by kernel (first calls, checks, timing, rechecks; timed: median x reps)"
    return ["", title + ":", *render(recs, fmt, ("kernel", "rows", "seconds", "share", "timed", "costliest"),
                                      text=text, right=("rows", "seconds", "share", "timed"))]
