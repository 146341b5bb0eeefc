"""Regression detection on one series of benchmark points: pure functions, no I/O.

A series is (kernel, mode, provider, shape, dtype, GPU) in commit order. Repeated runs of one commit
are one point, so an A/A rerun can never look like a step. The method is a baseline-window rule with
binary segmentation (docs/regressions.md has the long form):

- levels: at each candidate index i the level before is the median of up to WINDOW points before i,
  the level after the median of up to WINDOW points from i on; medians, so one outlier moves nothing;
- persistence: a step needs at least PERSIST points on each side, and of the NEAR points next to it
  on each side all but one on their own side of the halfway level; so the last PERSIST - 1 commits
  can never be flagged (that is `kcollect compare`'s job);
- a flag needs all of: |change| beyond the relative threshold; the step at least MIN_Z standard errors
  of the difference of the two window medians, the standard error coming from the series' own
  point-to-point scatter; and the level after outside the p20-p80 band of the points before it;
- where the rule holds, the step is put at the index that best splits the neighbourhood into two flat
  pieces (least absolute deviations, as asv does), then both sides are searched again, so two steps
  close together (a regression and its fix) are both found; a last pass re-checks each step with its
  windows bounded by the neighbouring steps.

Everything happens on log(time), so a 5% slowdown and a 1.05x speed-up are the same distance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from statistics import median
from typing import Iterable

import numpy as np

DEFAULT_THRESHOLD = 0.05
WINDOW = 10  # points each side that set the levels: long enough to average noise, short enough to be local
PERSIST = 3  # points a new level must last (and the old one must have lasted): one outlier is not a step
NEAR, PERSIST_SHARE = 4, 0.75  # of the 4 points next to a step, 3 must lie on their side of it
MIN_Z = 3.5  # step / its standard error; with ~50 candidate indices per series this keeps false flags rare
MEDIAN_SE = math.sqrt(math.pi / 2)  # standard error of a median = this * sigma / sqrt(n) (normal noise)
SIGMA_FLOOR = 1e-4  # 0.01%: identical repeated values must not make every change infinitely significant


@dataclass(frozen=True)
class Point:
    commit: str
    commit_time: datetime | None
    median_ms: float
    p20_ms: float
    p80_ms: float
    runs: int


@dataclass(frozen=True)
class Flag:
    kind: str  # 'regression' (slower) or 'improvement' (faster)
    index: int  # the first point after the step
    before_commit: str
    after_commit: str
    before_ms: float
    after_ms: float
    change: float  # after / before - 1
    noise_sigmas: float  # the step in standard errors of the two levels' difference


# -- points ------------------------------------------------------------------------------------------


def points_from_rows(rows: Iterable[dict]) -> list[Point]:
    """Rows of ONE series (results_v columns) -> one point per commit, in commit order.

    A commit's point is the median of its runs' medians; its band runs from the median of their p20s
    to the median of their p80s, widened to hold every run's median, so disagreeing reruns show as
    spread. Rows without a time (status other than 'ok') are left out; a run without a commit is its
    own point."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("status", "ok") != "ok" or not r.get("median_ms") or r["median_ms"] <= 0:
            continue
        key = r.get("git_commit") or f"run:{str(r.get('run_id', ''))[:8]}"
        groups.setdefault(key, []).append(r)
    points = []
    for commit, runs in groups.items():
        medians = [r["median_ms"] for r in runs]
        p20 = median(r.get("p20_ms") or r["median_ms"] for r in runs)
        p80 = median(r.get("p80_ms") or r["median_ms"] for r in runs)
        times = [r.get("commit_time") for r in runs if r.get("commit_time") is not None]
        points.append((_order_key(runs), Point(commit=commit, commit_time=min(times) if times else None,
                                               median_ms=median(medians), p20_ms=min(p20, *medians),
                                               p80_ms=max(p80, *medians), runs=len(runs))))
    points.sort(key=lambda kp: kp[0])
    return [p for _, p in points]


def _order_key(runs: list[dict]) -> tuple:
    # By commit time, then by when it was measured; a run without a commit time falls back to its start.
    started = [r["started_at"] for r in runs if r.get("started_at") is not None]
    first_start = min(started) if started else datetime.min
    times = [r["commit_time"] for r in runs if r.get("commit_time") is not None]
    return (min(times) if times else first_start, first_start)


# -- detection ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Series:
    y: np.ndarray  # log median
    lo: np.ndarray  # log p20
    hi: np.ndarray  # log p80
    sigma: float  # point-to-point noise of y
    log_t: float  # log(1 + threshold)


def detect(points: list[Point], threshold: float = DEFAULT_THRESHOLD) -> list[Flag]:
    """Steps in one series (points in commit order), earliest first."""
    n = len(points)
    if n < 2 * PERSIST:
        return []
    y = np.log([p.median_ms for p in points])
    s = _Series(y=y, lo=np.log([min(p.p20_ms, p.median_ms) for p in points]),
                hi=np.log([max(p.p80_ms, p.median_ms) for p in points]),
                sigma=_scatter(y), log_t=math.log1p(threshold))
    steps: list[int] = []
    _split(s, 0, n, steps)
    return [_flag(points, i, step) for i, step in _confirm(s, sorted(steps))]


def detect_all(rows: list[dict], thresholds: dict[str, float] | None = None) -> dict[tuple, list[Flag]]:
    """Rows of results_v -> {(kernel, mode, provider, shape, dtype, gpu_name): flags} for the series
    with at least one flag. CPU (interpreted) rows get gpu_name 'cpu' so they never join a GPU series."""
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        device = r.get("gpu_name") if r.get("device_kind") == "cuda" else "cpu"
        series.setdefault((r["kernel"], r["mode"], r["provider"], r["shape"], r["dtype"], device), []).append(r)
    thresholds = thresholds or {}
    out = {}
    for key, group in series.items():
        flags = detect(points_from_rows(group), thresholds.get(key[0], DEFAULT_THRESHOLD))
        if flags:
            out[key] = flags
    return out


def _scatter(y: np.ndarray) -> float:
    """Noise of one point from successive differences (MAD, scaled to a normal sigma): a step moves
    one difference and an outlier two, so neither inflates it the way a plain std would."""
    d = np.abs(np.diff(y))
    return max(1.4826 * float(np.median(d)) / math.sqrt(2), SIGMA_FLOOR)


def _windows(a: np.ndarray, idx: np.ndarray, lo: int, hi: int, before: bool,
             width: int = WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """Each index's window of a (before: [i-width, i), after: [i, i+width)) clipped to [lo, hi),
    as sorted rows padded with NaN at the end, and the number of real values in each row."""
    cols = idx[:, None] + np.arange(width)[None, :] - (width if before else 0)
    valid = (cols >= lo) & (cols < hi)
    return np.sort(np.where(valid, a[np.clip(cols, 0, len(a) - 1)], np.nan), axis=1), valid.sum(axis=1)


def _median(rows: np.ndarray, count: np.ndarray) -> np.ndarray:
    # The middle of each row's real part (np.nanmedian is several times slower on small rows).
    r = np.arange(len(rows))
    return (rows[r, (count - 1) // 2] + rows[r, count // 2]) / 2


def _test(s: _Series, idx: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For candidate indices: (passes, z, levels before/after as a 2-row array)."""
    wb, nb = _windows(s.y, idx, lo, hi, before=True)
    wa, na = _windows(s.y, idx, lo, hi, before=False)
    before, after = _median(wb, nb), _median(wa, na)
    step = after - before
    z = np.abs(step) / (MEDIAN_SE * s.sigma * np.sqrt(1 / nb + 1 / na))
    passes = (np.abs(step) >= s.log_t) & (z >= MIN_Z)
    if passes.any():  # the rest only where these hold: it is rarely needed
        # Persistence: of the NEAR points next to the step on each side, all but one sit on their own
        # side of the halfway level (all of them when only three are left), so two outliers among the
        # last four commits, which move a median of four, are not a step.
        sign, mid = np.sign(step)[:, None], ((before + after) / 2)[:, None]
        near_a, ka = _windows(s.y, idx, lo, hi, before=False, width=NEAR)
        near_b, kb = _windows(s.y, idx, lo, hi, before=True, width=NEAR)
        persists = ((np.sum((near_a - mid) * sign > 0, axis=1) >= PERSIST_SHARE * ka)
                    & (np.sum((mid - near_b) * sign > 0, axis=1) >= PERSIST_SHARE * kb))
        # Beyond the spread: the new level lies outside the p20-p80 band of the points before it.
        band_hi = _median(*_windows(s.hi, idx, lo, hi, before=True))
        band_lo = _median(*_windows(s.lo, idx, lo, hi, before=True))
        passes &= persists & np.where(step > 0, after > band_hi, after < band_lo)
    return passes, z, np.vstack([before, after])


def _split(s: _Series, lo: int, hi: int, steps: list[int]) -> None:
    """Binary segmentation: the strongest step in [lo, hi), then each side on its own."""
    idx = np.arange(lo + PERSIST, hi - PERSIST + 1)
    if idx.size == 0:
        return
    passes, z, _ = _test(s, idx, lo, hi)
    if not passes.any():
        return
    best = int(np.argmax(np.where(passes, z, -np.inf)))
    first = last = best  # the run of passing candidates around the best one
    while first > 0 and passes[first - 1]:
        first -= 1
    while last + 1 < idx.size and passes[last + 1]:
        last += 1
    # The fit window reaches only PERSIST points past the run: a wider one can hold the other edge
    # of a short plateau (a regression fixed a few commits later) and tie the two edges.
    i = _locate(s.y, int(idx[first]), int(idx[last]), max(lo, int(idx[first]) - PERSIST),
                min(hi, int(idx[last]) + PERSIST))
    steps.append(i)
    _split(s, lo, i, steps)
    _split(s, i, hi, steps)


def _locate(y: np.ndarray, first: int, last: int, a: int, b: int) -> int:
    """The index in [first, last] that splits y[a:b] into two flat pieces with the least absolute
    deviation: medians are flat around a step, this is not, so it puts the step where it happened."""
    def cost(j: int) -> float:
        left, right = y[a:j], y[j:b]
        return float(np.abs(left - np.median(left)).sum() + np.abs(right - np.median(right)).sum())

    return min(range(first, last + 1), key=cost)


def _confirm(s: _Series, steps: list[int]) -> list[tuple[int, tuple[float, float, float]]]:
    """Re-test each step with its windows bounded by its neighbours; drop those that no longer pass
    (their neighbours' windows then widen), until nothing changes. -> [(index, (before, after, z))]."""
    n = len(s.y)
    while True:
        kept, results = [], []
        for k, i in enumerate(steps):
            lo = steps[k - 1] if k > 0 else 0
            hi = steps[k + 1] if k + 1 < len(steps) else n
            passes, z, levels = _test(s, np.array([i]), lo, hi)
            if passes[0]:
                kept.append(i)
                results.append((i, (float(levels[0, 0]), float(levels[1, 0]), float(z[0]))))
        if len(kept) == len(steps):
            return results
        steps = kept


def _flag(points: list[Point], i: int, step: tuple[float, float, float]) -> Flag:
    before, after, z = step
    before_ms, after_ms = math.exp(before), math.exp(after)
    return Flag(kind="regression" if after_ms > before_ms else "improvement", index=i,
                before_commit=points[i - 1].commit, after_commit=points[i].commit, before_ms=before_ms,
                after_ms=after_ms, change=after_ms / before_ms - 1, noise_sigmas=round(z, 2))
