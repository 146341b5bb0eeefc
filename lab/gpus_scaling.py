"""One GPU against several (`kcollect run --gpus all`) on the same plan: each run's phases and wall
(runs.phases), the phases summed over the several GPUs' runs beside the one GPU's, and the
(kernel, provider) pairs whose rows' seconds (results.seconds) differ most between the two. Numbers
are the store's; nothing is estimated.

    python -m lab.gpus_scaling --one data/runs/*-4a1a07ab --several data/runs/*-4b2bb522 data/runs/*-d8acef17
"""
from __future__ import annotations

import argparse
import json

from kcollect.formats import render
from lab.grid_cost import load

PHASES = ("setup", "inputs", "reference", "first_call", "check", "capture", "timing", "recheck",
          "recheck_fresh", "release", "store", "other", "timed_work", "wall")


def runs(folders: list[str]) -> tuple[list[dict], dict]:
    """Each run's phases, rows and row seconds; and {(kernel, provider): (rows, seconds)} of them all."""
    records, rows = load(folders, None, None)
    out = []
    for r in records:
        mine = [x for x in rows if x["run_id"] == r["run_id"]]
        out.append({"run": r["run_id"][:8], "device": r["device_index"], "rows": len(mine),
                    "row_s": sum(x["seconds"] or 0.0 for x in mine), **json.loads(r["phases"] or "{}")})
    pairs: dict = {}
    for x in rows:
        n, secs = pairs.get((x["kernel"], x["provider"]), (0, 0.0))
        pairs[(x["kernel"], x["provider"])] = (n + 1, secs + (x["seconds"] or 0.0))
    return out, pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", required=True, help="the one-GPU run's folder")
    ap.add_argument("--several", nargs="+", required=True, help="the several GPUs' run folders")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    (one, a1), (several, a2) = runs([a.one]), runs(a.several)
    table = [{"run": r["run"], "device": r["device"], "rows": r["rows"], "row_s": round(r["row_s"], 1),
              **{p: round(r.get(p, 0.0), 1) for p in PHASES}} for r in one + several]
    summed = {p: sum(r.get(p, 0.0) for r in several) for p in PHASES + ("row_s",)}
    table.append({"run": "several, summed", "device": "-", "rows": sum(r["rows"] for r in several),
                  **{p: round(v, 1) for p, v in summed.items()}})
    print("\n".join(render(table, "table")))
    walls = max(r["wall"] for r in several)
    print(f"\nwall (the runs' own records): one GPU {one[0]['wall']:.1f} s, {len(several)} GPUs {walls:.1f} s "
          f"(the slower run): {one[0]['wall'] / walls:.2f}x")
    diff = sorted(((a2[k][1] - a1[k][1], k) for k in a1.keys() & a2.keys()), reverse=True)
    print("\n(kernel, provider) whose rows took longest beyond the one GPU's: several - one, row seconds")
    worst = [{"kernel": k, "provider": p, "rows": a2[(k, p)][0], "one_s": round(a1[(k, p)][1], 1),
              "several_s": round(a2[(k, p)][1], 1), "more_s": round(d, 1)} for d, (k, p) in diff[:a.top]]
    print("\n".join(render(worst, "table")))


if __name__ == "__main__":
    main()
