"""How a machine's drift depends on a row's duration: for consecutive runs of one GPU (each with at
least --min-rows rows of code that is not ours, so that it never changes), the median change of
those rows by the duration of the run before, beside the median of all of them. Where the hosts
behind one machine name differ in their cost per call (a launch, a graph replay), the short rows
move by a share the long ones do not: what verdicts.Drift's time per call is fitted for.

    python -m lab.drift_bands [--db data/kbench.duckdb] [--gpu H200] [--min-rows 300]
"""
from __future__ import annotations

import argparse
import math
import statistics

import duckdb

BANDS_MS = (0.0, 0.01, 0.02, 0.05, 0.2, math.inf)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="data/kbench.duckdb")
    ap.add_argument("--gpu", default="H200", help="part of the GPU's name")
    ap.add_argument("--min-rows", type=int, default=300)
    args = ap.parse_args()
    con = duckdb.connect(args.db, read_only=True)
    runs = con.execute(
        "SELECT u.run_id, u.started_at, left(u.git_commit, 7) FROM runs u JOIN environments e USING (env_id) "
        "JOIN results r USING (run_id) WHERE e.gpu_name LIKE ? AND r.status = 'ok' AND NOT r.ours "
        "GROUP BY ALL HAVING count(*) >= ? ORDER BY u.started_at", [f"%{args.gpu}%", args.min_rows]).fetchall()
    times = {rid: {tuple(k): ms for *k, ms in con.execute(
        "SELECT kernel, mode, provider, shape, dtype, median_ms FROM results "
        "WHERE run_id = ? AND status = 'ok' AND NOT ours AND median_ms > 0", [rid]).fetchall()}
        for rid, _, _ in runs}
    names = [f"{lo * 1000:g}-{hi * 1000:g} us" if hi < math.inf else f"over {lo * 1000:g} us"
             for lo, hi in zip(BANDS_MS, BANDS_MS[1:])]
    print(f"median change of rows not ours between consecutive {args.gpu} runs, by the duration before "
          "(rows in brackets)")
    print(f"{'runs':<21} {'started':<11} {'rows':>5} {'all':>7}  " + "  ".join(f"{n:>14}" for n in names))
    for (a, _, ca), (b, tb, cb) in zip(runs, runs[1:]):
        common = times[a].keys() & times[b].keys()
        if len(common) < args.min_rows // 2:
            continue
        pairs = [(times[a][k], math.log(times[b][k] / times[a][k])) for k in common]
        cells = []
        for lo, hi in zip(BANDS_MS, BANDS_MS[1:]):
            logs = [x for ms, x in pairs if lo <= ms < hi]
            cells.append(f"{math.expm1(statistics.median(logs)):+7.1%} ({len(logs):3d})" if len(logs) >= 5 else
                         f"{'-':>7} ({len(logs):3d})")
        overall = math.expm1(statistics.median(x for _, x in pairs))
        print(f"{ca}->{cb:<12} {str(tb)[5:16]:<11} {len(common):5d} {overall:+7.2%}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
