"""What the recheck tells that the first measurement does not (issue 43's "recheck only where
doubtful"): the committed GPU rows with a recheck, by the first measurement's own spread
((p80 - p20) / median), and how far each row's recheck lands from its median. Were the recheck skipped
where the spread is tight, the rows of that band whose recheck differs would be stored as surer than
they are, and the verdicts would read their differences as steps.

    python -m lab.recheck_value [--db data/kbench.duckdb] [--since 2026-11-28]
"""
from __future__ import annotations

import argparse
import math

import duckdb

from kcollect.common import DEFAULT_DB
from kcollect.formats import render

BANDS = (0.0, 0.005, 0.01, 0.02, 0.05, math.inf)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=DEFAULT_DB)
    ap.add_argument("--since", default="2026-11-28", help="runs started on or after (ISO time)")
    a = ap.parse_args()
    con = duckdb.connect(a.db, read_only=True)
    rows = con.execute("""
        SELECT x.median_ms, x.p20_ms, x.p80_ms, x.recheck_ms, x.status FROM results x JOIN runs r USING (run_id)
        JOIN environments e USING (env_id)
        WHERE e.device_kind = 'cuda' AND r.grid <> 'lab' AND r.started_at >= ? AND x.recheck_ms > 0
          AND x.median_ms > 0 AND x.p20_ms IS NOT NULL AND x.p80_ms IS NOT NULL""", [a.since]).fetchall()
    table = []
    for lo, hi in zip(BANDS, BANDS[1:]):
        diffs = sorted(abs(math.log(rc / med)) for med, p20, p80, rc, _ in rows if lo <= (p80 - p20) / med < hi)
        if not diffs:
            continue
        n = len(diffs)
        table.append({"spread": f"{lo:.1%}-{hi:.1%}" if hi < math.inf else f">= {lo:.1%}", "rows": n,
                      "share": round(n / len(rows), 3), "median_diff": round(diffs[n // 2], 4),
                      "p99_diff": round(diffs[min(n - 1, int(n * 0.99))], 4), "max_diff": round(diffs[-1], 4),
                      "over_3pct": sum(d > math.log1p(0.03) for d in diffs)})
    print(f"{len(rows)} GPU rows with a recheck, runs since {a.since}; diff: |log(recheck / median)|")
    print("\n".join(render(table, "table")))


if __name__ == "__main__":
    main()
