"""Run-to-run noise of a benchmark series, and the statistics the verdicts are decided with.

A series' noise is the spread of log(time) of one run of the same code: the relative spread of one
measurement (0.01 = 1%). It is measured from differences between measurements that should agree:

- reruns of one commit (two runs of the same code, maybe on another GPU of the host);
- each row against its recheck (a second, short measurement at the end of its case);
- consecutive points of one segment: same code, same method and same conditions between them.

Two measurements of spread s differ by s*sqrt(2). The spread is the root mean square of the
differences, each clipped at CLIP times their median (the calibration below chose it over the median
absolute difference, which reads a bimodal series, whose runs are mostly alike and sometimes 20%
apart, as quiet: see docs/regressions.md). A short history says little about its noise, so the
estimate is shrunk towards the pool's: the median noise of the series measured in like conditions
(same GPU, machine and timing method, and the same duration class: launches under 20 us are
noisier). The pool counts as PRIOR_WEIGHT differences.

Even so a standardised difference of the same code is not normal: its tails are those of a Student
t with few degrees of freedom (TAIL_DF and TAIL_SCALE, fitted to the same-code differences of the
calibration history). A verdict's p-value comes from that t, with no more degrees of freedom than
the differences behind the series' noise (honest for a short history), and the lines of one
comparison are decided together at a false-discovery rate (Benjamini-Hochberg), so that the chance
that a comparison of unchanged code fails at all is bounded, not each line's.
"""
from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass
from statistics import median
from typing import Iterable, Sequence

import numpy as np
from scipy.stats import t as student_t

SIGMA_FLOOR = 0.001  # 0.1%: identical repeated values must not make every change infinitely significant
PRIOR_WEIGHT = 4  # the pooled estimate counts as this many differences of the series' own
DEFAULT_SIGMA = 0.01  # 1%: a series with no history in a pool with none either
CLIP = 4.0  # a difference counts at most this many times the median difference (one wild rerun)
DURATION_CLASSES = ((0.02, "under 20 us"), (0.2, "20-200 us"), (math.inf, "over 200 us"))
# The tail of standardised same-code differences: Student t with TAIL_DF degrees of freedom, scaled
# by TAIL_SCALE. Fitted (maximum likelihood) on the calibration history: see docs/regressions.md
# and `python benchmarks/regress_eval.py --calibrate`.
TAIL_DF = 3.0
TAIL_SCALE = 0.6


@dataclass(frozen=True)
class Noise:
    """The noise of one run of a series, in log(time) (about a relative spread)."""

    sigma: float
    n: int  # differences of the series' own history behind it (0: the pool's value alone)
    pooled: float | None  # the pool's value it leans on (None: no pool, DEFAULT_SIGMA was used)

    @property
    def percent(self) -> float:
        return 100 * self.sigma

    @property
    def df(self) -> float:
        """Degrees of freedom of a t-test with this noise: its differences and the pool's weight."""
        return self.n + PRIOR_WEIGHT


def sigma_of_differences(diffs: Iterable[float]) -> float | None:
    """The noise of one measurement from differences of pairs of them; None when there are none."""
    d = sorted(abs(x) for x in diffs if math.isfinite(x))
    return _scale(d)


def _scale(d: Sequence[float]) -> float | None:
    """The clipped root mean square of sorted absolute differences, over sqrt(2)."""
    if not d:
        return None
    m = len(d)
    cap = CLIP * (d[(m - 1) // 2] + d[m // 2]) / 2
    if cap <= 0:
        return 0.0
    return math.sqrt(sum(min(x, cap) ** 2 for x in d) / m / 2)


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


def p_values(z: Sequence[float], df: Sequence[float]) -> list[float]:
    """Two-sided p-values of standardised differences under the calibrated tail, each with at most
    its df degrees of freedom (one vectorised call: the history asks for thousands)."""
    if not len(z):
        return []
    za = np.abs(np.asarray(z, dtype=float)) / TAIL_SCALE
    dfa = np.minimum(TAIL_DF, np.maximum(np.asarray(df, dtype=float), 1.0))
    return [float(p) for p in np.where(np.isfinite(za), 2 * student_t.sf(np.nan_to_num(za, posinf=0.0), dfa), 0.0)]


def fdr(pvalues: Sequence[float], q: float) -> list[bool]:
    """Benjamini-Hochberg at false-discovery rate q: which hypotheses are rejected. When every
    hypothesis is true, the chance of rejecting any is at most q."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    cut = 0
    for rank, i in enumerate(order, 1):
        if pvalues[i] <= q * rank / m:
            cut = rank
    rejected = [False] * m
    for i in order[:cut]:
        rejected[i] = True
    return rejected


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
        """Drop one difference found, later, to straddle a step (it was change, not noise)."""
        k = bisect_left(self._sorted, abs(diff))
        if k < len(self._sorted) and self._sorted[k] == abs(diff):
            del self._sorted[k]

    def sigma(self, without: float | None = None) -> tuple[float | None, int]:
        """(own sigma, differences it rests on), leaving out one difference (`without`: the one that
        straddles the step under test) if it is among them."""
        values = self._sorted
        if without is not None and math.isfinite(without):
            k = bisect_left(values, abs(without))
            if k < len(values) and values[k] == abs(without):
                values = values[:k] + values[k + 1:]
        return _scale(values), len(values)

    def values(self) -> list[float]:
        return list(self._sorted)
