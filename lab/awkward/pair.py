"""Two sweeps of one seed, by two versions of the code, compared case by case: python -m
lab.awkward.pair A.jsonl B.jsonl. The cases both checked, per dtype: how many changed verdict, the
geometric mean of B's worst part over its gate against A's, and how many cases and parts B made
better or worse by more than 10%; then the cases whose worst part moved most. A sweep's own table
counts its failures; this says whether a change moved the errors of the cases both ran (two
trees in two processes draw the same cases, in the same order, from one seed)."""
from __future__ import annotations

import argparse
import json
import math
import sys

from .common import worst_part

MOVED = 0.10  # a change by more than this fraction counts as better or worse


def load(path: str) -> dict[str, dict]:
    """{the case as drawn (JSON, keys sorted): its verdict} of one sweep's JSONL."""
    cases = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            verdict = row.pop("verdict")
            row.pop("index", None)
            cases[json.dumps(row, sort_keys=True)] = verdict
    return cases


def _worst(verdict: dict) -> float:
    """The case's largest error over its gate, across its parts (common.worst_part's)."""
    p = worst_part(verdict["parts"])
    return p["ours"] / p["gate"] if p and p["gate"] else 0.0


def compare(a: dict[str, dict], b: dict[str, dict]) -> list[dict]:
    """Per dtype of the cases with parts in both sweeps: the counts that main prints, and the cases
    with their worst part's ratio (B over A), sorted from most improved to most worsened."""
    shared = [k for k in a if k in b and a[k].get("parts") and b[k].get("parts")]
    out = []
    for dtype in sorted({json.loads(k)["dtype"] for k in shared}):
        keys = [k for k in shared if json.loads(k)["dtype"] == dtype]
        row = dict(dtype=dtype, cases=len(keys), verdict_changed=0, better=0, worse=0, parts_better=0,
                   parts_worse=0, moves=[])
        logs = []
        for k in keys:
            va, vb = a[k], b[k]
            row["verdict_changed"] += va["status"] != vb["status"]
            wa, wb = _worst(va), _worst(vb)
            ratio = wb / wa if wa > 0 else 1.0
            logs.append(math.log(max(ratio, 1e-12)))
            row["better"] += wb < (1 - MOVED) * wa
            row["worse"] += wb > (1 + MOVED) * wa
            pb = {p["name"]: p["ours"] for p in vb["parts"]}
            for p in va["parts"]:
                if p["name"] in pb:
                    row["parts_better"] += pb[p["name"]] < (1 - MOVED) * p["ours"]
                    row["parts_worse"] += pb[p["name"]] > (1 + MOVED) * p["ours"]
            row["moves"].append((ratio, wa, wb, json.loads(k)))
        row["geomean"] = math.exp(sum(logs) / len(logs))
        row["moves"].sort(key=lambda m: m[0])
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.awkward.pair", description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the first sweep's JSONL (e.g. the older code)")
    ap.add_argument("b", help="the second sweep's JSONL")
    ap.add_argument("--most", type=int, default=3, help="cases listed at each end")
    args = ap.parse_args(argv)
    rows = compare(load(args.a), load(args.b))
    if not rows:
        print("no case with parts in both sweeps", file=sys.stderr)
        return 2
    print(f"{'dtype':<9} {'cases':>5} {'verdict changed':>15} {'worst/gate B/A':>14} {'better':>6} {'worse':>6} "
          f"{'parts better':>12} {'parts worse':>11}")
    for r in rows:
        print(f"{r['dtype']:<9} {r['cases']:>5} {r['verdict_changed']:>15} {r['geomean']:>14.3f} {r['better']:>6} "
              f"{r['worse']:>6} {r['parts_better']:>12} {r['parts_worse']:>11}")
    for r in rows:
        for title, moves in (("most improved", r["moves"][:args.most]), ("most worsened", r["moves"][-args.most:][::-1])):
            print(f"{r['dtype']} {title}:")
            for ratio, wa, wb, case in moves:
                print(f"  {ratio:6.2f}  worst/gate {wa:.3g} -> {wb:.3g}  {json.dumps(case)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
