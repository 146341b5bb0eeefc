"""Fit the cost model (collector/cost.py) on the run folders' per-row seconds, and say how well it
predicts runs it was not fitted on.

    python benchmarks/fit_cost.py [--runs data/runs --runs lab/results/cost_runs] [--write]

The run folders are the history's (data/runs: GPU runs) and lab/results/cost_runs (runs made only
to fit the model, such as a CPU run of the quick grid: the site never shows them).

Held out: the newest run of each machine that has per-row seconds (results.seconds, schema 6 on) is
predicted by a model fitted on every other run; the table gives each held-out run's predicted and
measured seconds (the sum of its rows' seconds, i.e. its measuring time) and the error of the sum.
`--write` then fits on every run and writes collector/cost_model.json, the terms the plan's estimates
and the shards use.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent

from kcollect import cost

QUERY = """
SELECT r.run_id, u.machine, u.started_at, e.device_kind AS device, r.kernel, r.provider, r.mode,
       r.bytes, r.seconds
FROM read_parquet({results}, union_by_name=true) r
JOIN read_parquet({runs}, union_by_name=true) u USING (run_id)
JOIN (SELECT DISTINCT env_id, device_kind FROM read_parquet({envs}, union_by_name=true)) e USING (env_id)
"""


def load_rows(folders: list[Path]) -> list[dict]:
    folders = [f for f in folders if f.is_dir()]
    if not folders:
        return []
    files = {name: "[" + ", ".join(f"'{f}/*/{name}.parquet'" for f in folders) + "]"
             for name in ("results", "run", "environment")}
    con = duckdb.connect()
    columns = {c[0] for c in con.execute(f"DESCRIBE SELECT * FROM read_parquet({files['results']}, "
                                         "union_by_name=true)").fetchall()}
    if "seconds" not in columns:
        return []
    query = QUERY.format(results=files["results"], runs=files["run"], envs=files["environment"])
    cur = con.execute(query + " WHERE r.seconds IS NOT NULL ORDER BY u.started_at, r.seq")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def holdout(rows: list[dict]) -> list[str]:
    newest: dict[str, tuple] = {}
    for r in rows:
        newest[r["machine"]] = max(newest.get(r["machine"], (r["started_at"], r["run_id"])),
                                   (r["started_at"], r["run_id"]))
    held = {run for _, run in newest.values()}
    model = cost.Model(cost.fit(r for r in rows if r["run_id"] not in held))
    lines = ["| machine | run | rows | predicted s | measured s | error |", "| --- | --- | --- | --- | --- | --- |"]
    for machine, (_, run) in sorted(newest.items()):
        mine = [r for r in rows if r["run_id"] == run]
        guesses = [model.seconds(r["device"], r["kernel"], r["provider"], r["mode"], (r["bytes"] or 0) / 1e9)
                   for r in mine]
        if any(g is None for g in guesses):
            lines.append(f"| {machine} | {run[:8]} | {len(mine)} | no term for {sum(g is None for g in guesses)} rows "
                         "| | |")
            continue
        got, want = sum(guesses), sum(r["seconds"] for r in mine)
        lines.append(f"| {machine} | {run[:8]} | {len(mine)} | {got:.1f} | {want:.1f} | {got / want - 1:+.1%} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, action="append",
                    help="folder of run folders (repeatable; default data/runs and lab/results/cost_runs)")
    ap.add_argument("--write", action="store_true", help="write collector/cost_model.json from every run")
    args = ap.parse_args()
    folders = args.runs or [ROOT / "data" / "runs", ROOT / "lab" / "results" / "cost_runs"]
    rows = load_rows(folders)
    if not rows:
        sys.exit(f"fit_cost: no run under {', '.join(map(str, folders))} has per-row seconds")
    print("\n".join(holdout(rows)))
    if args.write:
        runs = sorted({r["run_id"] for r in rows})
        terms = cost.fit(rows)
        cost.save(terms, {"runs": runs, "rows": len(rows)})
        print(f"wrote {cost.MODEL_FILE.relative_to(ROOT)}: {len(terms)} terms from {len(rows)} rows of {len(runs)} runs")


if __name__ == "__main__":
    main()
