"""The cost model as the plan uses it: each finished run predicted from the runs before it alone
(fitted on every earlier run of the history, none later), for variants of how a kernel's own terms
weigh old runs (cost.fit's `recent`: the newest N runs that measured the term, or all of them).

    python -m lab.cost_forward [--runs data/runs] [--choose-before ISO-TIME]

The variant is chosen on the runs started before --choose-before (default: the middle run's start)
and reported on the runs after it, which the choice never saw; per variant: how many runs' ETA fell
within 20% of the measured wall, and the median absolute error."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_cost  # noqa: E402
from kcollect import cost  # noqa: E402

VARIANTS = (None, 1, 2, 3, 5)  # None: every run, as the committed model before
MIN_EARLIER = 3  # runs of the same device before a run, for it to be predicted


def errors(rows: list[dict], runs: list[dict], recent: int | None) -> dict[str, float]:
    """{run_id: relative error of its ETA} for each run predicted from the runs before it."""
    out = {}
    for run in runs:
        earlier_ids = {r["run_id"] for r in runs if r["started_at"] < run["started_at"]}
        earlier_runs = [r for r in runs if r["run_id"] in earlier_ids]
        if sum(r["device"] == run["device"] for r in earlier_runs) < MIN_EARLIER:
            continue
        # rows of every earlier run, finished or not (as the store holds them), none of later ones
        earlier_rows = [r for r in rows if r["started_at"] < run["started_at"]]
        mine = [r for r in rows if r["run_id"] == run["run_id"]]
        model = cost.Model(*cost.fit_all(earlier_rows, earlier_runs, recent))
        out[run["run_id"]] = sum(fit_cost.predict(model, run, mine, cold=True)) / run["wall"] - 1
    return out


def summary(errs: list[float]) -> str:
    if not errs:
        return "no run"
    within = sum(abs(e) <= fit_cost.WITHIN for e in errs)
    return f"{within} of {len(errs)} within 20%, median |error| {statistics.median(abs(e) for e in errs):.1%}"


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.cost_forward", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, action="append")
    ap.add_argument("--choose-before", default=None)
    args = ap.parse_args()
    rows = fit_cost.annotate(fit_cost.load_rows(args.runs or [ROOT / "data" / "runs"]))
    runs = fit_cost.run_records(rows)
    by_variant = {v: errors(rows, runs, v) for v in VARIANTS}
    predicted = [r for r in runs if r["run_id"] in by_variant[None]]
    cut = args.choose_before or str(predicted[len(predicted) // 2]["started_at"])
    early = [r["run_id"] for r in predicted if str(r["started_at"]) < cut]
    late = [r["run_id"] for r in predicted if str(r["started_at"]) >= cut]
    print(f"{len(predicted)} runs predicted from the runs before them; chosen on the {len(early)} before {cut}, "
          f"reported on the {len(late)} from it\n")
    print("| recent runs a kernel's terms take | choice set | held-out set |\n| --- | --- | --- |")
    scores = {}
    for v, errs in by_variant.items():
        scores[v] = (sum(abs(errs[r]) <= fit_cost.WITHIN for r in early), -statistics.median(abs(errs[r]) for r in early))
        print(f"| {'all' if v is None else v} | {summary([errs[r] for r in early])} | {summary([errs[r] for r in late])} |")
    best = max(VARIANTS, key=lambda v: (scores[v], v is None))
    print(f"\nchosen on the choice set: {'all' if best is None else best}")
    print("\nheld-out runs, chosen variant against all:")
    for r in predicted:
        if r["run_id"] in late:
            print(f"  {r['run_id'][:8]} {r['machine']} {r['rows']} rows, wall {r['wall']:.1f} s: "
                  f"{by_variant[best][r['run_id']]:+.1%} (all: {by_variant[None][r['run_id']]:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
