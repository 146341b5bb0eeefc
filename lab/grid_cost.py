"""Where a run's measuring seconds went, from what its runs and rows stored: each run's phases
(runs.phases), and the rows' own seconds (results.seconds: a row's first call, check, timing and
recheck, plus its share of its case's inputs, references and release) by kernel x provider x mode,
beside the device work the row timed (median x reps of its first measurement). Numbers are the
store's; nothing is estimated.

    python -m lab.grid_cost data/runs/*-5d1374af data/runs/*-c4f0d70c ...   # run folders
    python -m lab.grid_cost --db kbench.duckdb [--since ISO-TIME]           # a store's runs
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import duckdb

from kcollect.formats import render
from kcollect.phases import PHASES

TIMED = ("ok", "unstable")  # rows with a time; the others stop at their first call and check
BANDS = ((None, "no time"), (1.0, "< 1 ms"), (10.0, "1-10 ms"), (100.0, "10-100 ms"), (float("inf"), ">= 100 ms"))


def load(folders: list[str], db: str | None, since: str | None) -> tuple[list[dict], list[dict]]:
    con = duckdb.connect(db, read_only=True) if db else duckdb.connect()
    if db:
        where = "WHERE started_at >= ?" if since else ""
        runs = _dicts(con, f"SELECT * FROM runs {where} ORDER BY started_at", [since] if since else [])
        ids = [r["run_id"] for r in runs]
        rows = _dicts(con, "SELECT * FROM results WHERE list_contains(?, run_id)", [ids]) if ids else []
        return runs, rows
    runs = _dicts(con, "SELECT * FROM read_parquet(?, union_by_name=true) ORDER BY started_at",
                  [[str(Path(f) / "run.parquet") for f in folders]])
    rows = _dicts(con, "SELECT * FROM read_parquet(?, union_by_name=true)",
                  [[str(Path(f) / "results.parquet") for f in folders]])
    return runs, rows


def _dicts(con, sql: str, args: list) -> list[dict]:
    cur = con.execute(sql, args)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def phase_lines(runs: list[dict]) -> list[str]:
    """Each run's breakdown (seconds per phase), a column per run, and their sum."""
    parts = {r["run_id"][:8]: json.loads(r["phases"]) for r in runs if r.get("phases")}
    if not parts:
        return ["(no run stored its breakdown)"]
    names = [p for p in (*PHASES, "other", "wall") if any(p in v for v in parts.values())]
    recs = [{"phase": p, **{k: v.get(p) for k, v in parts.items()}, "sum": sum(v.get(p, 0.0) for v in parts.values())}
            for p in names]
    text = [{k: "" if r[k] is None else f"{r[k]:.1f}" for k in (*parts, "sum")} for r in recs]
    return render(recs, "table", ["phase", *parts, "sum"], text, right=(*parts, "sum"))


def _group(rows: list[dict], key) -> dict:
    by: dict = {}
    for r in rows:
        g = by.setdefault(key(r), {"rows": 0, "timed_rows": 0, "seconds": 0.0, "untimed_s": 0.0, "device_s": 0.0,
                                   "call_ms": [], "reps": []})
        s = r.get("seconds") or 0.0
        g["rows"] += 1
        g["seconds"] += s
        if r["status"] in TIMED and r.get("median_ms") is not None:
            g["timed_rows"] += 1
            g["device_s"] += r["median_ms"] * r["reps"] / 1e3
            g["call_ms"].append(r["median_ms"])
            g["reps"].append(r["reps"])
        else:
            g["untimed_s"] += s
    return by


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return None if not xs else (xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2)


def group_lines(rows: list[dict], key, label: list[str], top: int | None = None) -> list[str]:
    """Rows' seconds by `key` (a tuple named by `label`), largest first: all of them, those of rows
    without a time, the timed device work, the median call, the mean timed calls, and a timed row's
    seconds in units of its median call (how many calls' worth a row cost)."""
    total = sum(r.get("seconds") or 0.0 for r in rows)
    recs = []
    for k, g in sorted(_group(rows, key).items(), key=lambda kv: -kv[1]["seconds"])[:top]:
        timed_s = g["seconds"] - g["untimed_s"]
        calls = sum(g["call_ms"]) / 1e3
        recs.append({**dict(zip(label, k)), "rows": g["rows"], "timed": g["timed_rows"], "seconds": g["seconds"],
                     "share": 100 * g["seconds"] / total if total else 0.0, "untimed_s": g["untimed_s"],
                     "device_s": g["device_s"], "call_ms": _median(g["call_ms"]),
                     "reps": sum(g["reps"]) / len(g["reps"]) if g["reps"] else None,
                     "calls_per_row": timed_s / calls if calls else None})
    fmt = {"seconds": "{:.1f}", "share": "{:.1f}%", "untimed_s": "{:.1f}", "device_s": "{:.1f}", "call_ms": "{:.3g}",
           "reps": "{:.1f}", "calls_per_row": "{:.0f}"}
    text = [{c: "-" if r[c] is None else f.format(r[c]) for c, f in fmt.items()} for r in recs]
    columns = [*label, "rows", "timed", "seconds", "share", "untimed_s", "device_s", "call_ms", "reps", "calls_per_row"]
    return render(recs, "table", columns, text, right=columns[len(label):])


def _wall(runs: list[dict]) -> str:
    """The runs' wall seconds as their breakdowns say (runs.phases), summed."""
    walls = [json.loads(r["phases"]).get("wall", 0.0) for r in runs if r.get("phases")]
    return f"{sum(walls):.1f} s" if walls else "not stored"


def dtype_lines(rows: list[dict]) -> list[str]:
    """For each kernel measured in several dtypes: each other dtype's timed rows against the first
    dtype's same (mode, provider, shape), as the ratio of their medians (median, 5th and 95th
    percentile, extremes), and the seconds the other dtype's rows cost: whether a dtype's times
    tell anything its twin's do not."""
    from kcollect.timing import quantile

    by: dict = {}
    for r in rows:
        by.setdefault(r["kernel"], {}).setdefault(r["dtype"], []).append(r)
    recs = []
    for kernel, dtypes in sorted(by.items()):
        first, *others = sorted(dtypes, key=lambda d: (d != "bfloat16", d))
        base = {(r["mode"], r["provider"], r["shape"]): r for r in dtypes[first] if r["status"] in TIMED}
        for other in others:
            ratios = sorted(r["median_ms"] / base[k]["median_ms"] for r in dtypes[other]
                            if r["status"] in TIMED and (k := (r["mode"], r["provider"], r["shape"])) in base)
            if ratios:
                recs.append({"kernel": kernel, "dtype": f"{other} / {first}", "pairs": len(ratios),
                             "median": quantile(ratios, 0.5), "p5": quantile(ratios, 0.05),
                             "p95": quantile(ratios, 0.95), "min": ratios[0], "max": ratios[-1],
                             "seconds": sum(r.get("seconds") or 0.0 for r in dtypes[other])})
    if not recs:
        return ["(every kernel in one dtype)"]
    fmt = {c: "{:.3f}" for c in ("median", "p5", "p95", "min", "max")} | {"seconds": "{:.1f}"}
    text = [{c: f.format(r[c]) for c, f in fmt.items()} for r in recs]
    columns = ["kernel", "dtype", "pairs", "median", "p5", "p95", "min", "max", "seconds"]
    return render(recs, "table", columns, text, right=columns[2:])


def band(row: dict) -> str:
    ms = row.get("median_ms") if row["status"] in TIMED else None
    return next(name for limit, name in BANDS if (ms is None) == (limit is None) and (ms is None or ms < limit))


def report(runs: list[dict], rows: list[dict], top: int) -> list[str]:
    total = sum(r.get("seconds") or 0.0 for r in rows)
    head = [f"{len(runs)} runs ({', '.join(sorted({r['status'] for r in runs}))}), {len(rows)} rows, "
            f"rows' seconds {total:.1f}"]
    head += [f"  run {r['run_id'][:8]} device {r.get('device_index')} {r['status']} git {str(r.get('git_commit'))[:8]}"
             for r in runs]
    legend = ("rows: all; timed: ok or unstable; seconds: the rows' own; untimed_s: of which rows without a time "
              "(failed, error, unavailable); device_s: median x reps of the first measurement; call_ms: median call "
              "of the timed rows; reps: their mean timed calls; calls_per_row: a timed row's seconds over its median "
              "call (the calls it cost, first call, estimate, warm-up, recheck and case share included)")
    return [*head, "", "where each run's wall time went (runs.phases, seconds):", *phase_lines(runs),
            "", "rows' seconds by the median call of the row:",
            *group_lines(rows, lambda r: (band(r),), ["call"]),
            "", "rows' seconds by kernel:", *group_lines(rows, lambda r: (r["kernel"],), ["kernel"]),
            "", f"rows' seconds by kernel x provider x mode (the {top} largest):",
            *group_lines(rows, lambda r: (r["kernel"], r["provider"], r["mode"]), ["kernel", "provider", "mode"], top),
            "", legend, "", "a kernel's rows in a second dtype against the same rows in its first, ratio of medians "
            "(seconds: the second dtype's rows'):", *dtype_lines(rows)]


KEY = ("kernel", "mode", "provider", "shape", "dtype")


def against_lines(rows: list[dict], others: list[dict]) -> list[str]:
    """Two runs of the same plan, row by row (matched on kernel, mode, provider, shape, dtype), by
    kernel x provider x mode: each one's seconds, and the median ratio of the rows' medians (this
    over the other) where both timed the row."""
    theirs = {tuple(r[k] for k in KEY): r for r in others}
    by: dict = {}
    for r in rows:
        o = theirs.get(tuple(r[k] for k in KEY))
        if o is None:
            continue
        g = by.setdefault((r["kernel"], r["provider"], r["mode"]),
                          {"rows": 0, "this_s": 0.0, "other_s": 0.0, "ratios": []})
        g["rows"] += 1
        g["this_s"] += r.get("seconds") or 0.0
        g["other_s"] += o.get("seconds") or 0.0
        if r["status"] in TIMED and o["status"] in TIMED and r.get("median_ms") and o.get("median_ms"):
            g["ratios"].append(r["median_ms"] / o["median_ms"])
    total = {"rows": sum(g["rows"] for g in by.values()), "this_s": sum(g["this_s"] for g in by.values()),
             "other_s": sum(g["other_s"] for g in by.values()), "ratios": [x for g in by.values() for x in g["ratios"]]}
    recs = [{"kernel": k, "provider": p, "mode": m, **g} for (k, p, m), g in
            sorted(by.items(), key=lambda kv: -kv[1]["other_s"])]
    recs.append({"kernel": "all", "provider": "", "mode": "", **total})
    text = [{"this_s": f"{r['this_s']:.1f}", "other_s": f"{r['other_s']:.1f}",
             "median_ratio": "-" if not r["ratios"] else f"{_median(r['ratios']):.3f}",
             "timed_both": str(len(r["ratios"]))} for r in recs]
    columns = ["kernel", "provider", "mode", "rows", "this_s", "other_s", "timed_both", "median_ratio"]
    return render(recs, "table", columns, text, right=columns[3:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", help="run folders (data/runs/...), each with run.parquet and results.parquet")
    ap.add_argument("--db", help="a kcollect DuckDB file instead of run folders")
    ap.add_argument("--since", help="with --db: only runs started at or after this time (ISO)")
    ap.add_argument("--top", type=int, default=60, help="kernel x provider x mode lines shown (default 60)")
    ap.add_argument("--against", metavar="DB",
                    help="with --db: another store's run of the same plan, compared row by row")
    args = ap.parse_args()
    if bool(args.folders) == bool(args.db):
        ap.error("give run folders or --db, not both")
    runs, rows = load(args.folders, args.db, args.since)
    print("\n".join(report(runs, rows, args.top)))
    if args.against:
        other_runs, others = load([], args.against, args.since)
        print(f"\nthis ({args.db}: wall {_wall(runs)}) against {args.against} (wall {_wall(other_runs)}), row by row; "
              "median_ratio: of the rows' medians, this over the other:")
        print("\n".join(against_lines(rows, others)))


if __name__ == "__main__":
    main()
