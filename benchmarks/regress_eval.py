"""How well kcollect.regress finds planted steps, and how often it flags step-free series.

Synthetic series shaped like real ones: 30-60 commits; each commit measured by 1 run (70%), 2 (20%)
or 3 (10%); each run's median is the commit's true level times lognormal noise (sigma 1%, 2% or 3%),
times a slow outlier (x1.1-1.5) with probability 3%; each run's p20-p80 band is its median
x exp(-/+h), h ~ U(0.5%, 2%). A planted step multiplies every commit from a random index on
(at least regress.PERSIST commits from either end) by 1.05 or 1.10, or divides by it (improvement).

Found: a flag of the right kind within one commit of the planted index (exact index reported too).
False flags: step-free series with any flag; extra flags on stepped series are counted too.

    python benchmarks/regress_eval.py [--trials 1000] [--seed 0]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from kcollect.regress import PERSIST, WINDOW, Point, detect

NOISES = (0.01, 0.02, 0.03)
STEPS = (0.05, 0.10)


def series(rng: np.random.Generator, n: int, noise: float, step: float, at: int, up: bool) -> list[Point]:
    level = np.ones(n)
    if step:
        level[at:] *= (1 + step) if up else 1 / (1 + step)
    points = []
    for i in range(n):
        runs = rng.choice([1, 2, 3], p=[0.7, 0.2, 0.1])
        med = level[i] * np.exp(rng.normal(0, noise, runs))
        med *= np.where(rng.random(runs) < 0.03, rng.uniform(1.1, 1.5, runs), 1.0)
        h = rng.uniform(0.005, 0.02, runs)
        m = float(np.median(med))
        points.append(Point(commit=f"c{i}", commit_time=None, median_ms=m,
                            p20_ms=min(float(np.median(med * np.exp(-h))), float(med.min())),
                            p80_ms=max(float(np.median(med * np.exp(h))), float(med.max())), runs=int(runs)))
    return points


def trial(rng, noise: float, step: float, threshold: float) -> tuple[bool, bool, int, int, bool]:
    """-> (found within one commit, found at the exact index, false flags, commits, step is interior:
    a full WINDOW of commits on each side)"""
    n = int(rng.integers(30, 61))
    at = int(rng.integers(PERSIST, n - PERSIST + 1))
    up = bool(rng.random() < 0.5)
    flags = detect(series(rng, n, noise, step, at, up), threshold)
    kind = "regression" if up else "improvement"
    hits = [f for f in flags if step and f.kind == kind and abs(f.index - at) <= 1]
    return bool(hits), any(f.index == at for f in hits), len(flags) - min(len(hits), 1), n, WINDOW <= at <= n - WINDOW


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000, help="series per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=float, action="append",
                    help="relative threshold(s) to evaluate (repeatable); default 0.05 and 0.03")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{args.trials} series per cell, 30-60 commits, seed {args.seed}")
    print("found: within one commit [at the exact commit] {among steps with a full window each side}")
    print(f"{'threshold':>9} {'noise':>5} | {'5% steps found':>24} {'10% steps found':>24} | "
          f"{'step-free series flagged':>24} {'false flags / 100 commits':>25}")
    t0 = time.perf_counter()
    for threshold in args.threshold or (0.05, 0.03):
        for noise in NOISES:
            cells = []
            for step in STEPS:
                r = [trial(rng, noise, step, threshold) for _ in range(args.trials)]
                interior = [x[0] for x in r if x[4]]
                cells.append(f"{np.mean([x[0] for x in r]):6.1%} [{np.mean([x[1] for x in r]):5.1%}]"
                             f" {{{np.mean(interior):5.1%}}}")
            free = [trial(rng, noise, 0.0, threshold) for _ in range(args.trials)]
            flagged = np.mean([x[2] > 0 for x in free])
            per100 = 100 * sum(x[2] for x in free) / sum(x[3] for x in free)
            print(f"{threshold:>9.0%} {noise:>5.0%} | {cells[0]:>24} {cells[1]:>24} | {flagged:>24.1%} {per100:>25.2f}")
    print(f"evaluation took {time.perf_counter() - t0:.1f} s")
    long = series(rng, 200, 0.02, 0.0, 0, True)
    t0 = time.perf_counter()
    for _ in range(200):
        detect(long)
    print(f"detect() on a 200-commit step-free series: {(time.perf_counter() - t0) / 200 * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
