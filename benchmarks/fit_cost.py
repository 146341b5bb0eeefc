"""Fit the cost model (collector/cost.py) on the run folders' per-row seconds and breakdowns, and say
how well it predicts the wall time of runs it was not fitted on.

    python benchmarks/fit_cost.py [--runs data/runs --runs lab/results/cost_runs] [--write]

The run folders are the history's (data/runs: GPU runs) and lab/results/cost_runs (runs made only
to fit the model, such as a CPU run of the quick grid: the site never shows them).

Held out: the newest finished run of each machine that has per-row seconds (results.seconds, schema
6 on) is predicted by a model fitted on every other run (its rows and its breakdown left out of
every term); then each finished run in turn. The tables give each held-out run's measured wall time
(runs.phases: precompile and start-up included), the ETA of the model before (baseline: commit
663dd57's, rows + one line for the pass + the mean start-up) and of the model now (rows with their
cases' shares + the cold first calls + the pass per kernel + the median start-up), each with its
error, and how many of them are within WITHIN. A run with a precompile pass had cold caches: all of
its builds counted as missing from them. `--write` then fits on every run and writes
collector/cost_model.json, the terms the plan's estimates and the shards use.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent

from kcollect import cost, schedule

WITHIN = 0.2  # the bound on the ETA's error (issue 43)
SHARED = ("inputs", "reference", "release")  # runs.phases a case spends outside its measurements

QUERY = """
SELECT r.run_id, u.machine, u.started_at, u.status, u.phases, u.config, e.device_kind AS device, r.kernel,
       r.provider, r.mode, r.shape, r.dtype, r.bytes, r.seconds
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


def builder(device: str):
    """(kernel, provider) -> whether its first call builds code (Provider.builds), from the
    registry; a kernel or provider it no longer has counts as building unless it is eager."""
    from kcollect.common import load_registry

    registry = load_registry(device)

    def builds(kernel: str, provider: str) -> bool:
        try:
            return registry.get(kernel).provider(provider).builds
        except Exception:  # gone since the run: the registry's own error types vary
            return provider not in ("torch", "eager")
    return builds


def annotate(rows: list[dict]) -> list[dict]:
    """Each row with builds (whether its provider builds code) and cold (whether its run made the
    precompile pass: its caches lacked every build; None for a run that left no breakdown), as
    cost.fit_cold and cost.fit read them."""
    builds = builder("cpu")
    for r in rows:
        phases = json.loads(r["phases"] or "{}")
        r["builds"] = builds(r["kernel"], r["provider"])
        r["cold"] = bool(phases.get("precompile")) if "wall" in phases else None
    cases = Counter((r["run_id"], r["kernel"], r["shape"], r["dtype"]) for r in rows)
    for r in rows:
        r["case_rows"] = cases[(r["run_id"], r["kernel"], r["shape"], r["dtype"])]
    return rows


def run_records(rows: list[dict]) -> list[dict]:
    """The finished runs with a breakdown, each with what cost.fit_runs needs; of several workers'
    runs, only those without a pass (a pass builds every worker's cases: not one run's rows).
    Rows as annotate leaves them."""
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r["run_id"]].append(r)
    out = []
    for run, mine in by.items():
        first = mine[0]
        phases, config = json.loads(first["phases"] or "{}"), json.loads(first["config"] or "{}")
        if first["status"] != "finished" or "wall" not in phases or (config.get("workers", 1) != 1
                                                                      and "precompile" in phases):
            continue
        built = [r for r in mine if r["builds"]]
        cases = len({(r["kernel"], r["shape"], r["dtype"]) for r in built})
        out.append(dict(run_id=run, machine=first["machine"], started_at=first["started_at"], device=first["device"],
                        rows=len(mine), wall=phases["wall"], precompile_s=phases.get("precompile", 0.0),
                        rows_s=sum(r["seconds"] for r in mine), builds=dict(Counter(r["kernel"] for r in built)),
                        shared_s=sum(phases.get(p, 0.0) for p in SHARED),
                        cases=dict(Counter(k for k, _, _ in {(r["kernel"], r["shape"], r["dtype"]) for r in mine})),
                        procs=min(config.get("precompile") or 0, cases)))
    return sorted(out, key=lambda r: (r["started_at"], r["run_id"]))


def baseline(rows: list[dict], runs: list[dict]) -> cost.Model:
    """The model as it was before the cold excess and the per-kernel pass (commit 663dd57): row
    terms over cold and warm rows alike, the pass as one line over builds per process, the mean
    start-up. Only for the tables' 'before' column."""
    run_terms: dict[str, dict] = {}
    for device in {r["device"] for r in runs}:
        mine = [r for r in runs if r["device"] == device]
        terms = run_terms.setdefault(device, {})
        if len(mine) >= cost.MIN_RUNS:
            rest = [r["wall"] - r["precompile_s"] - r["rows_s"] for r in mine]
            terms["startup"] = [max(0.0, sum(rest) / len(rest)), len(rest)]
        points = [(sum(r["builds"].values()) / r["procs"], r["precompile_s"]) for r in mine
                  if r["precompile_s"] and r["procs"]]
        if len(points) >= cost.MIN_RUNS:
            fixed, per_build = cost._fit_line(points)
            terms["precompile"] = {"fixed": fixed, "runs": len(points), "per": {cost.ANY: [per_build, len(points)]}}
    return cost.Model(cost.fit(rows), run_terms)


def predict(model: cost.Model, run: dict, rows: list[dict], cold: bool) -> tuple[float, float, float, float]:
    """(rows, their cold excess, precompile, start-up) seconds of a run as the plan would estimate
    them; `cold`: whether the model adds the cold excess (the baseline does not)."""
    measuring = 0.0
    for r in rows:
        gb = (r["bytes"] or 0) / 1e9
        fitted = model.row(r["device"], r["kernel"], r["provider"], r["mode"], gb, r["case_rows"])
        measuring += schedule.constant_cost(r["device"], r["provider"], gb) if fitted is None else fitted
    missing = run["builds"] if run["precompile_s"] else {}  # a run that made the pass lacked them all
    providers = Counter(r["provider"] for r in rows if r["builds"]) if missing and cold else Counter()
    return (measuring, model.cold(run["device"], providers) or 0.0,
            model.precompile(run["device"], missing, run["procs"]) or 0.0, model.startup(run["device"]) or 0.0)


def holdout(rows: list[dict], runs: list[dict], held: list[dict]) -> tuple[list[str], int, int]:
    """The table of the held-out runs, and how many of them each ETA had within WITHIN."""
    lines = ["| machine | run | rows | caches | measured wall s (rows + precompile + rest) "
             "| ETA before s (rows + precompile + start-up) "
             "| error | ETA now s (rows + cold first calls + precompile + start-up) | error |", "| --- " * 9 + "|"]
    hits = [0, 0]
    for run in held:
        # fitted without the run: none of its rows, nor its breakdown
        other_rows = [r for r in rows if r["run_id"] != run["run_id"]]
        other_runs = [r for r in runs if r["run_id"] != run["run_id"]]
        mine = [r for r in rows if r["run_id"] == run["run_id"]]
        old = predict(baseline(other_rows, other_runs), run, mine, cold=False)
        new = predict(cost.Model(*cost.fit_all(other_rows, other_runs, cost.RECENT_RUNS)), run, mine, cold=True)
        want = run["wall"]
        cells = []
        for i, parts in enumerate((old, new)):
            error = sum(parts) / want - 1
            hits[i] += abs(error) <= WITHIN
            shown = parts[:1] + parts[2:] if i == 0 else parts
            cells.append(f"{sum(parts):.1f} ({' + '.join(f'{p:.1f}' for p in shown)}) | {error:+.1%}")
        caches = "cold" if run["precompile_s"] else "warm"
        rest_s = want - run["rows_s"] - run["precompile_s"]
        measured = f"{want:.1f} ({run['rows_s']:.1f} + {run['precompile_s']:.1f} + {rest_s:.1f})"
        lines.append(f"| {run['machine']} | {run['run_id'][:8]} | {run['rows']} | {caches} | {measured} | "
                     f"{' | '.join(cells)} |")
    return lines, hits[0], hits[1]


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
    rows = annotate(rows)
    runs = run_records(rows)
    newest = {r["machine"]: r for r in runs}  # runs are oldest first
    for title, held in (("The newest finished run of each machine", list(newest.values())),
                        ("Each finished run", runs)):
        lines, before, now = holdout(rows, runs, held)
        print(f"{title}, held out: within {WITHIN:.0%} of the measured wall, {before} of {len(held)} "
              f"before and {now} of {len(held)} now\n")
        print("\n".join(lines) + "\n")
    if args.write:
        ids = sorted({r["run_id"] for r in rows})
        terms, run_terms = cost.fit_all(rows, runs, cost.RECENT_RUNS)
        cost.save(terms, run_terms, {"runs": ids, "rows": len(rows)})
        print(f"wrote {cost.MODEL_FILE.relative_to(ROOT)}: {len(terms)} terms from {len(rows)} rows of {len(ids)} "
              f"runs; run terms {json.dumps(run_terms)}")

if __name__ == "__main__":
    main()
