"""One GPU against several (`kcollect run --gpus all`) on the same plan: each run's phases and wall
(runs.phases), the phases summed over the several GPUs' runs beside the one GPU's, and the
(kernel, provider) pairs whose rows' seconds (results.seconds) differ most between the two. Numbers
are the store's; nothing is estimated.

    python -m lab.gpus_scaling --one data/runs/*-4a1a07ab --several data/runs/*-4b2bb522 data/runs/*-d8acef17
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import duckdb

from kcollect.formats import render

PHASES = ("setup", "inputs", "reference", "first_call", "check", "capture", "timing", "recheck",
          "recheck_fresh", "release", "store", "other", "timed_work", "wall")


def runs(folders: list[str]) -> list[dict]:
    con = duckdb.connect()
    out = []
    for f in folders:
        run_id, device, phases = con.execute(
            "SELECT run_id, device_index, phases FROM read_parquet(?)", [str(Path(f) / "run.parquet")]).fetchone()
        n, secs = con.execute("SELECT count(*), sum(seconds) FROM read_parquet(?)",
                              [str(Path(f) / "results.parquet")]).fetchone()
        out.append({"run": run_id[:8], "device": device, "rows": n, "row_s": secs, **json.loads(phases)})
    return out


def by_pair(folders: list[str]) -> dict:
    con = duckdb.connect()
    rows = con.execute("SELECT kernel, provider, count(*), sum(seconds) FROM read_parquet(?) GROUP BY 1, 2",
                       [[str(Path(f) / "results.parquet") for f in folders]]).fetchall()
    return {(k, p): (n, s) for k, p, n, s in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", required=True, help="the one-GPU run's folder")
    ap.add_argument("--several", nargs="+", required=True, help="the several GPUs' run folders")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    one, several = runs([a.one]), runs(a.several)
    table = [{"run": r["run"], "device": r["device"], "rows": r["rows"], "row_s": round(r["row_s"], 1),
              **{p: round(r.get(p, 0.0), 1) for p in PHASES}} for r in one + several]
    summed = {p: sum(r.get(p, 0.0) for r in several) for p in PHASES + ("row_s",)}
    table.append({"run": "several, summed", "device": "-", "rows": sum(r["rows"] for r in several),
                  **{p: round(v, 1) for p, v in summed.items()}})
    print("\n".join(render(table, "table")))
    walls = max(r["wall"] for r in several)
    print(f"\nwall (the runs' own records): one GPU {one[0]['wall']:.1f} s, {len(several)} GPUs {walls:.1f} s "
          f"(the slower run): {one[0]['wall'] / walls:.2f}x")
    a1, a2 = by_pair([a.one]), by_pair(a.several)
    diff = sorted(((a2[k][1] - a1[k][1], k) for k in a1.keys() & a2.keys()), reverse=True)
    print("\n(kernel, provider) whose rows took longest beyond the one GPU's: several - one, row seconds")
    worst = [{"kernel": k, "provider": p, "rows": a2[(k, p)][0], "one_s": round(a1[(k, p)][1], 1),
              "several_s": round(a2[(k, p)][1], 1), "more_s": round(d, 1)} for d, (k, p) in diff[:a.top]]
    print("\n".join(render(worst, "table")))


if __name__ == "__main__":
    main()
