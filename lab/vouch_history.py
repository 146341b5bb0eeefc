"""The committed history as the recheck rule of stability.vouched would have stored it: a copy of
the run folders in which each row that its series' last time (on the same GPU model, from the runs
before it) vouches for has no recheck. For benchmarks/regress_eval.py on both, to see what the
rechecks it drops cost the verdicts.

    PYTHONPATH=. python -m lab.vouch_history --out /tmp/runs_vouched
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import duckdb

from kcollect import stability, timing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="data/runs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(args.runs, out)
    con = duckdb.connect()

    def one(path: Path, sql: str) -> dict:
        cur = con.execute(sql.replace("$f", str(path)))
        names = [c[0] for c in cur.description]
        return dict(zip(names, cur.fetchone()))

    folders = []
    for d in sorted(out.iterdir()):
        run = one(d / "run.parquet", "SELECT started_at FROM read_parquet('$f')")
        env = one(d / "environment.parquet", "SELECT gpu_name FROM read_parquet('$f')")
        folders.append((str(run["started_at"]), d, env["gpu_name"]))
    last: dict[tuple, tuple] = {}  # the series' last time, as previous.previous_times keeps it
    dropped = kept = 0
    for _, d, gpu in sorted(folders, key=lambda f: f[0]):
        f = d / "results.parquet"
        con.execute(f"CREATE OR REPLACE TABLE t AS SELECT row_number() OVER () AS n, * FROM read_parquet('{f}')")
        have = {c[0] for c in con.execute("DESCRIBE t").fetchall()}
        cols = ", ".join(c if c in have else f"NULL AS {c}" for c in (
            "n", "kernel", "mode", "provider", "shape", "dtype", "status", "median_ms", "p20_ms", "p80_ms",
            "recheck_ms", "timing", "reps"))
        cur = con.execute(f"SELECT {cols} FROM t ORDER BY {'seq, ' if 'seq' in have else ''}n")
        names = [c[0] for c in cur.description]
        drop = []
        for r in (dict(zip(names, v)) for v in cur.fetchall()):
            ms = r["median_ms"]
            if r["status"] != "ok" or not ms or ms <= 0:
                continue
            key = (gpu, r["kernel"], r["mode"], r["provider"], r["shape"], r["dtype"])
            p20 = r["p20_ms"] if r["p20_ms"] is not None else ms
            p80 = r["p80_ms"] if r["p80_ms"] is not None else ms
            t1 = stability.Measured(timing.Timing(r["timing"] or "", ms, p20, p80, ms, 0.0, ms, r["reps"] or 1))
            recheck = r["recheck_ms"]
            if recheck and stability.vouched(t1, last.get(key)):
                drop.append(r["n"])
                recheck = None
            elif recheck:
                kept += 1
            if not stability.disagree(ms, recheck, p20, p80, "cuda" if gpu else "cpu"):
                last[key] = (ms, p20, p80, r["timing"])
        if drop:
            dropped += len(drop)
            con.execute(f"UPDATE t SET recheck_ms = NULL WHERE n IN ({', '.join(map(str, drop))})")
            con.execute(f"COPY (SELECT * EXCLUDE (n) FROM t ORDER BY n) TO '{f}' (FORMAT parquet)")
    print(f"{dropped} rechecks dropped, {kept} kept, in {len(folders)} runs -> {out}")


if __name__ == "__main__":
    main()
