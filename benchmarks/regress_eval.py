"""How well kcollect.regress finds planted steps in series made of the real history's noise.

Noise: the committed history (data/runs, imported into a temporary store). For each kernel, the
residuals of its reference series (providers other than ours, whose code never changed between the
commits: log time minus the series' median) over the commits that measured it. A synthetic series of
n points (6-30) takes n consecutive commits of that kernel (blocks of 5 consecutive commits, joined,
where the kernel has fewer than n), and one reference series' residuals over them as its noise; up to
40 other reference series of the kernel over the same commits are the references from which the
machine drift is estimated, exactly as `regress.analyse` does. So every synthetic point carries the
noise, outliers and commit-to-commit drift that real points had, and its references carry the
same commits' drift.

Scenarios (each on its own series):
- step: +-5% or +-10% from a random point (at least 2 points before and 3 after) to the end;
- plateau: +20% for 2 or 3 commits, then reverted (at least 2 points before and after);
- sticky clock: every series (the target and its references) 5-20% slower on 2-4 consecutive
  commits, nothing planted in the target;
- none: the noise alone.

Found: a flag of the right kind whose step is within 2 commits of the planted one and that was
decided at most 2 commits after it (the commit of the step and the next). A plateau counts when, at
the end of the series, its regression is still flagged (within 1 commit) and marked recovered.
False flags: any flag on a sticky-clock or noise-only series, per series per commit.

    python benchmarks/regress_eval.py [--trials 1000] [--seed 0] [--threshold 0.03]
"""
from __future__ import annotations

import argparse
import math
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from kcollect import regress
from kcollect.history import import_path
from kcollect.regress import Point, SeriesKey
from kcollect.store import Store

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 5
MAX_REFERENCES = 40


class Noise:
    """The real history as residual matrices, one per kernel (reference series x its commits)."""

    def __init__(self, runs: Path, raw: bool = False):
        with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "k.duckdb") as store:
            import_path(store, runs)
            rows = store.query(regress.QUERY)
        analysed = regress.analyse(rows)
        self.pooled = regress.pooled_noise({k: r.points for k, r in analysed.items()})
        self.kernels = []
        for kernel in sorted({k.kernel for k in analysed}):
            refs = {k: r for k, r in analysed.items() if k.kernel == kernel and k.provider not in regress.OURS}
            commits = sorted({(p.commit_time, p.commit) for r in refs.values() for p in r.points})
            index = {c: i for i, (_, c) in enumerate(commits)}
            keys = [k for k, r in refs.items() if len(r.points) >= 4]
            m = np.full((len(keys), len(commits)), np.nan)
            for row, k in enumerate(keys):
                m[row, [index[p.commit] for p in refs[k].points]] = _residuals(refs[k], raw)
            priors = [self.pooled.get(regress.pool_key(k, refs[k].points)) for k in keys]
            if len(keys) > regress.MIN_REFERENCES:
                self.kernels.append((kernel, keys, m, priors))

    def draw(self, rng: np.random.Generator, n: int):
        """(target residuals, target's pooled prior, residual matrix of its references), over n commits."""
        while True:
            kernel, keys, m, priors = self.kernels[rng.integers(len(self.kernels))]
            cols = _commits(rng, m.shape[1], n)
            t = int(rng.integers(len(keys)))
            target = m[t, cols]
            if np.isnan(target).any():
                continue
            others = [r for r in range(len(keys)) if r != t]
            refs = m[rng.permutation(others)[:MAX_REFERENCES]][:, cols]
            return target, priors[t], refs


def _residuals(r: regress.SeriesResult, raw: bool) -> np.ndarray:
    """Log time minus its level: the series' median (raw), or the median of its segment between the
    steps the detector found in it (a reference's own level shifts are changes, not noise)."""
    y = np.log([p.median_ms for p in r.points])
    if raw:
        return y - np.median(y)
    cuts = [0] + [f.index for f in r.flags] + [len(y)]
    return np.concatenate([y[a:b] - np.median(y[a:b]) for a, b in zip(cuts, cuts[1:])])


def _commits(rng, available: int, n: int) -> np.ndarray:
    if n <= available:
        start = int(rng.integers(available - n + 1))
        return np.arange(start, start + n)
    blocks = []
    while sum(len(b) for b in blocks) < n:
        start = int(rng.integers(max(available - BLOCK, 0) + 1))
        blocks.append(np.arange(start, min(start + BLOCK, available)))
    return np.concatenate(blocks)[:n]


T0 = datetime(2026, 1, 1)


def _points(logs: np.ndarray) -> list[Point]:
    return [Point(commit=f"c{i}", commit_time=T0 + timedelta(hours=i), median_ms=float(math.exp(v)), p20_ms=float(math.exp(v)),
                  p80_ms=float(math.exp(v)), runs=1) for i, v in enumerate(logs) if np.isfinite(v)]


def detect(target: np.ndarray, prior: float | None, refs: np.ndarray, threshold: float) -> list[regress.Flag]:
    """The flags of the target series with the drift estimated from its references, as analyse does."""
    series = {SeriesKey("k", "fwd", "torch", f"s{r}", "bf16", "gpu", None, "cuda-graph"): _points(refs[r])
              for r in range(len(refs))}
    drift = regress.machine_drift(series).get(("gpu", None), {})
    points = _points(target)
    return regress.detect(points, threshold, prior, [drift.get(p.commit, 0.0) for p in points])


def trial(noise: Noise, rng, scenario: str, size: float, threshold: float) -> tuple[bool, int, int]:
    """-> (found, false flags, points)"""
    n = int(rng.integers(6, 31))
    target, prior, refs = noise.draw(rng, n)
    plant = np.zeros(n)
    if scenario == "step":
        at = int(rng.integers(2, n - 2))
        up = bool(rng.random() < 0.5)
        plant[at:] = math.log1p(size) * (1 if up else -1)
    elif scenario == "plateau":
        length = min(int(rng.integers(2, 4)), n - 4)
        at = int(rng.integers(2, n - length - 1))
        plant[at:at + length] = math.log1p(size)
    elif scenario == "sticky":
        length = int(rng.integers(2, 5))
        at = int(rng.integers(1, n - length + 1))
        clock = np.zeros(n)
        clock[at:at + length] = math.log1p(rng.uniform(0.05, 0.20))
        plant, refs = clock, refs + clock
    flags = detect(target + plant, prior, refs, threshold)
    if scenario == "step":
        kind = "regression" if up else "improvement"
        hit = any(f.kind == kind and abs(f.index - at) <= 2 and f.decided_index <= at + 2 for f in flags)
        return hit, 0, n
    if scenario == "plateau":
        hit = any(f.kind == "regression" and abs(f.index - at) <= 1 and f.status == "recovered" for f in flags)
        return hit, 0, n
    return False, len(flags), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000, help="series per scenario")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=float, default=regress.DEFAULT_THRESHOLD)
    ap.add_argument("--raw", action="store_true",
                    help="noise as log time minus the series' median, level shifts of references included")
    ap.add_argument("--runs", type=Path, default=ROOT / "data" / "runs", help="the history whose noise is used")
    ap.add_argument("--min-z", type=float, default=regress.MIN_Z, help="the detector's MIN_Z, to tune it")
    args = ap.parse_args()
    regress.MIN_Z = args.min_z
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    noise = Noise(args.runs, args.raw)
    print(f"noise from {args.runs} ({'raw' if args.raw else 'between steps'}): {len(noise.kernels)} kernels, "
          f"{sum(len(k[1]) for k in noise.kernels)} reference series; threshold {args.threshold:.0%}, "
          f"MIN_Z {regress.MIN_Z}, {args.trials} series (6-30 points) per scenario, seed {args.seed}")
    print(f"{'scenario':<34} {'found':>7} {'false flags per series per commit':>36}")
    for scenario, size, label in (("step", 0.10, "10% step (found within 2 commits)"),
                                  ("step", 0.05, "5% step (found within 2 commits)"),
                                  ("plateau", 0.20, "+20% plateau of 2-3, reverted"),
                                  ("sticky", 0.0, "sticky clock (5-20%, 2-4 commits)"),
                                  ("none", 0.0, "noise only")):
        r = [trial(noise, rng, scenario, size, args.threshold) for _ in range(args.trials)]
        found = f"{np.mean([x[0] for x in r]):7.1%}" if scenario in ("step", "plateau") else f"{'-':>7}"
        false = sum(x[1] for x in r) / sum(x[2] for x in r)
        print(f"{label:<34} {found} {false:>36.3%}")
    print(f"evaluation took {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
