"""A/B of the L2 flush before each timed call: is it what makes short launches noisy from run to run?

The verdicts' noise of our series under 20 us is 4.3% (median, H100) and 2.1% (H200) from commit
to commit, against 0.2-0.5% for longer ones (docs/regressions.md), and a 5% step there is found
about one time in twenty. The flush writes 256 MB (`flush.zero_()`), which leaves the L2 full of
dirty lines that the timed call then writes back as it evicts them: a cost that lands inside a
short call's events and may vary from run to run. Each variant runs `kcollect run` in fresh
processes (a run is what the verdicts compare), rounds of every variant in turn so that a drift
moves them alike; per variant, the spread of log(median) of each row across its runs.

    python -m lab.flush_ab --rounds 4 -- rms_norm gelu softmax --where M=1 --provider triton --provider torch

Variants: `write` (the collector's: zero_), `clean` (zero_, then a read of the same buffer: the L2
ends holding clean lines, HBM as with write), `read` (a read only). Writes each run's store and log
under --out (default: a temporary folder) and prints the table.
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

VARIANTS = ("write", "clean", "read")


class _Flush:
    """The flush buffer as timing.time_cuda uses it (it calls zero_ before each timed call)."""

    def __init__(self, buffer, variant: str):
        import torch

        self.buffer, self.variant = buffer, variant
        self.words = buffer.view(torch.int32)

    def zero_(self):
        if self.variant != "read":
            self.buffer.zero_()
        if self.variant != "write":
            self.words.amax()  # reads all 256 MB; the result is dropped


def spread(medians: list[float]) -> float:
    """The relative spread (standard deviation of log) of medians; nan for one."""
    logs = [math.log(m) for m in medians]
    return float(np.std(logs, ddof=1)) if len(logs) > 1 else float("nan")


def child(variant: str, run_args: list[str]) -> int:
    from kcollect import cli, timing

    real = timing.time_cuda

    def time_cuda(fn, budget, flush, *args, **kwargs):
        return real(fn, budget, _Flush(flush, variant), *args, **kwargs)

    timing.time_cuda = time_cuda  # the runner's calls and Graph.time both go through the module
    sys.argv = ["kcollect", "run", *run_args]
    return cli.main()


def rows(db: Path) -> dict[tuple, float]:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        found = con.execute("select kernel, mode, provider, shape, dtype, median_ms from results "
                            "where status = 'ok' and median_ms > 0").fetchall()
    return {tuple(r[:5]): r[5] for r in found}


def report(runs: dict[str, list[dict[tuple, float]]]) -> None:
    """Per variant and duration class: rows, the median over rows of the spread of log(median)
    across runs (as a relative spread), and the level against `write` (geometric mean of ratios)."""
    classes = ((0.02, "under 20 us"), (0.2, "20-200 us"), (math.inf, "over 200 us"))
    keys = set.intersection(*(set(r) for rs in runs.values() for r in rs))
    base = {k: np.exp(np.mean([math.log(r[k]) for r in runs["write"]])) for k in keys} if "write" in runs else {}
    print(f"{'variant':<8} {'class':<12} {'rows':>5} {'run-to-run spread':>18} {'level vs write':>15}")
    for variant, rs in runs.items():
        by_class = defaultdict(list)
        for k in keys:
            medians = [r[k] for r in rs]
            level = float(np.exp(np.mean(np.log(medians))))
            name = next(n for limit, n in classes if level < limit)
            by_class[name].append((spread(medians), level / base[k] if base else float("nan")))
        for _, name in classes:
            if by_class[name]:
                spreads, ratio = zip(*by_class[name])
                print(f"{variant:<8} {name:<12} {len(spreads):>5} {np.median(spreads):>17.2%} "
                      f"{np.exp(np.mean(np.log(ratio))):>14.3f}x")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    run_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="python -m lab.flush_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="runs of each variant (fresh processes)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, default=None, help="folder for the stores and logs")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, run_args)
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        ap.error(f"unknown variant(s) {sorted(unknown)}; valid: {', '.join(VARIANTS)}")
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (a spread needs two runs)")
    out = args.out or Path(tempfile.mkdtemp(prefix="flush_ab_"))
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[tuple, float]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            db = out / f"{v}_{r}.duckdb"
            with open(out / f"{v}_{r}.log", "w") as log:
                cmd = [sys.executable, "-m", "lab.flush_ab", "--child", v, "--", *run_args, "--db", str(db),
                       "--format", "csv"]
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            print(f"round {r} {v}: exit {rc}", flush=True)
            if db.exists():
                runs[v].append(rows(db))
    report({v: rs for v, rs in runs.items() if len(rs) >= 2})
    return 0


if __name__ == "__main__":
    sys.exit(main())
