"""Run-to-run noise of a benchmark series, measured from its own history.

A series' noise is the spread of log(time) between measurements of the same code: the relative
spread of one point (0.01 = 1%). It is estimated from differences between measurements that should
agree, namely consecutive points of one segment (no step and no change of environment between them)
and reruns of one commit. Two independent measurements of spread s differ by s*sqrt(2); the median
absolute difference, scaled to a normal sigma (the MAD about zero), is not moved by the odd outlier
or by the one difference that straddles a step.

A short history says little about its noise, so its estimate is shrunk towards the pool's: the
median noise of the series measured in like conditions (same GPU, machine and timing method, and
of the same duration class: launches under 20 us are noisier). The pooled value counts as
PRIOR_WEIGHT differences, so a series with 3 points leans on the pool and one with 30 on itself.
"""
from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass
from statistics import median
from typing import Iterable

SIGMA_FLOOR = 0.001  # 0.1%: identical repeated values must not make every change infinitely significant
PRIOR_WEIGHT = 4  # the pooled estimate counts as this many differences of the series' own
DEFAULT_SIGMA = 0.005  # 0.5%, about the median series of the committed history: for a series with no
# history in a pool with none either
MAD_TO_SIGMA = 1.482602218505602  # median |x| of a normal sample -> its sigma (1 / Phi^-1(3/4))
DURATION_CLASSES = ((0.02, "under 20 us"), (0.2, "20-200 us"), (math.inf, "over 200 us"))


@dataclass(frozen=True)
class Noise:
    """The noise of one point of a series, in log(time) (about a relative spread)."""

    sigma: float
    n: int  # differences of the series' own history behind it (0: the pool's value alone)
    pooled: float | None  # the pool's value it leans on (None: no pool, DEFAULT_SIGMA was used)

    @property
    def percent(self) -> float:
        return 100 * self.sigma


def sigma_of_differences(diffs: Iterable[float]) -> float | None:
    """The noise of one measurement from differences of pairs of them; None when there are none."""
    d = [abs(x) for x in diffs if math.isfinite(x)]
    if not d:
        return None
    return MAD_TO_SIGMA * median(d) / math.sqrt(2)


def combine(own: float | None, n: int, pooled: float | None) -> Noise:
    """A series' own estimate from n differences, shrunk towards the pool's (in variance)."""
    prior = DEFAULT_SIGMA if pooled is None else pooled
    if own is None or n == 0:
        sigma = prior
    else:
        sigma = math.sqrt((n * own * own + PRIOR_WEIGHT * prior * prior) / (n + PRIOR_WEIGHT))
    return Noise(sigma=max(sigma, SIGMA_FLOOR), n=n, pooled=pooled)


def duration_class(median_ms: float) -> str:
    for limit, name in DURATION_CLASSES:
        if median_ms < limit:
            return name
    return DURATION_CLASSES[-1][1]


def pool(estimates: Iterable[tuple[tuple, float | None, int]], min_differences: int = 3) -> dict[tuple, float]:
    """{pool key: pooled sigma} from (pool key, own sigma, differences) of many series: the median of
    the series with at least `min_differences` behind their own estimate."""
    by_key: dict[tuple, list[float]] = {}
    for key, sigma, n in estimates:
        if sigma is not None and n >= min_differences:
            by_key.setdefault(key, []).append(sigma)
    return {k: max(median(v), SIGMA_FLOOR) for k, v in by_key.items()}


class RunningDifferences:
    """Absolute differences collected one by one, with the noise they give at any moment (the
    detector's estimate must use only what was known when it decided: see regress.py)."""

    def __init__(self) -> None:
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, diff: float) -> None:
        if math.isfinite(diff):
            insort(self._sorted, abs(diff))

    def remove(self, diff: float) -> None:
        k = bisect_left(self._sorted, abs(diff))
        if k < len(self._sorted) and self._sorted[k] == abs(diff):
            del self._sorted[k]

    def sigma(self, without: float | None = None) -> tuple[float | None, int]:
        """(own sigma, differences it rests on), leaving out one difference (`without`, the one that
        straddles the step under test) if it is among them."""
        values = self._sorted
        skip = None
        if without is not None and math.isfinite(without):
            k = bisect_left(values, abs(without))
            if k < len(values) and values[k] == abs(without):
                skip = k
        m = len(values) - (skip is not None)
        if m == 0:
            return None, 0

        def at(q: int) -> float:  # the q-th value with `skip` left out
            return values[q if skip is None or q < skip else q + 1]

        med = (at((m - 1) // 2) + at(m // 2)) / 2
        return MAD_TO_SIGMA * med / math.sqrt(2), m
