"""Run-to-run noise of a benchmark series, and the statistics the verdicts are decided with.

A series' noise is the spread of log(time) of one run of the same code: the relative spread of one
measurement (0.01 = 1%). It is measured from differences between measurements that should agree:

- reruns of one commit (two runs of the same code, maybe on another GPU of the host);
- each row against its recheck (a second, short measurement at the end of its case);
- consecutive points of one segment: same code, same method and same conditions between them.

Two measurements of spread s differ by s*sqrt(2). The spread is the root mean square of the
differences, each counted at most as the 90th percentile of them (WINSOR) and as a factor of 2
(CLIP: beyond, a disturbance, not noise). Every difference of one method and one set of conditions
counts but a step that our code's change explains (regress.py): a series that flips between two
levels at more than a tenth of its commits is that noisy, and the flips count in full, where a
rarer step counts only as much as the series' ordinary differences. Not the median absolute difference: it reads a bimodal
series, whose runs are mostly alike and now and then 20% apart (torch.compile's rebuilt kernels,
launches of a few microseconds), as quiet, and every flip then looks like a step
(docs/regressions.md). A short history says little about its noise, so the
estimate is shrunk towards the pool's: the median noise of the series measured in like conditions
(same GPU, machine and timing method, and the same duration class: launches under 20 us are
noisier). The pool counts as PRIOR_WEIGHT differences.

Even so a standardised difference of the same code is not normal: its tails are those of a Student
t with few degrees of freedom (GATE_TAIL, PERSISTENT_TAIL and JOINT_TAIL, matched to the same-code
changes of the calibration history). The gate's p-value comes from that t, with no more degrees of
freedom than the differences behind the series' noise (honest for a short history; persistence's
from its tails alone, see regress.py), and the lines of one
comparison are decided together at a false-discovery rate (Benjamini-Hochberg), so that the chance
that a comparison of unchanged code fails at all is bounded, not each line's.
"""
from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from itertools import repeat
from dataclasses import dataclass
from statistics import median
from typing import Iterable, Sequence

import numpy as np

SIGMA_FLOOR = 0.001  # 0.1%: identical repeated values must not make every change infinitely significant
PRIOR_WEIGHT = 4  # the pooled estimate counts as this many differences of the series' own
DEFAULT_SIGMA = 0.01  # 1%: a series with no history in a pool with none either
CLIP = math.log(2)  # a difference counts at most as a factor of 2: beyond, a disturbance, not noise
WINSOR = 0.9  # and at most as the 90th percentile of the series' differences (see the module docstring)
DURATION_CLASSES = ((0.02, "under 20 us"), (0.2, "20-200 us"), (math.inf, "over 200 us"))
MAD_TO_SIGMA = 1.482602218505602  # median |x| of a normal sample -> its sigma (1 / Phi^-1(3/4))
# The tails of standardised same-code changes, each a Student t (degrees of freedom, scale) matched
# to the 99th and 99.9th percentiles of |z| on the calibration history (the H200's 109 runs, the
# timing harness's edits counted as method: codechange.HARNESS; `python
# benchmarks/regress_eval.py` prints the fit; docs/regressions.md): ONE point against the one before
# (the gate), whose tail is heavy (a bimodal series flips now and then), and the two points after a
# step that both stay beyond halfway (regress's persistence test), whose tail is close to normal,
# since one flip cannot make it.
GATE_TAIL = (3.02, 0.450)
PERSISTENT_TAIL = (200.0, 0.917)
JOINT_TAIL = (4.04, 0.380)  # persistence's joint test: the mean of the two points after a step
# against the level before, in the series' noise without the step's own difference (regress._joint)

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


def _scale(d: Sequence[float], squares: list[float] | None = None) -> float | None:
    """The root mean square of sorted absolute differences, each held to the WINSOR quantile of
    them and to CLIP, over sqrt(2). `squares`: each difference ** 2, where the caller keeps them
    (the same terms in the same order, summed in C: the history asks a million times)."""
    if not d:
        return None
    cap = min(CLIP, d[min(len(d) - 1, int(WINSOR * len(d)))])
    if squares is None:
        return math.sqrt(sum(min(x, cap) ** 2 for x in d) / len(d) / 2)
    held = bisect_left(d, cap)  # the differences below the cap count as themselves, the rest as it
    # the same terms added in the same order: those below the cap, then the cap's as often as held to it
    return math.sqrt(sum(repeat(cap ** 2, len(d) - held), sum(squares[:held])) / len(d) / 2)


def typical(diffs: Iterable[float]) -> float | None:
    """The spread of one measurement that most differences show (the median absolute difference,
    scaled to a normal sigma): for a floor, which one wild series must not raise for all."""
    d = sorted(abs(x) for x in diffs if math.isfinite(x))
    if not d:
        return None
    return MAD_TO_SIGMA * (d[(len(d) - 1) // 2] + d[len(d) // 2]) / 2 / math.sqrt(2)


def combine(own: float | None, n: int, pooled: float | None) -> Noise:
    """A series' own estimate from n differences, shrunk towards the pool's (in variance)."""
    prior = DEFAULT_SIGMA if pooled is None else pooled
    if own is None or n == 0:
        sigma = prior
    else:
        sigma = math.sqrt((n * own * own + PRIOR_WEIGHT * prior * prior) / (n + PRIOR_WEIGHT))
    noise = object.__new__(Noise)  # Noise(...) without the frozen __init__'s setattr per field (a million)
    noise.__dict__.update(sigma=max(sigma, SIGMA_FLOOR), n=n, pooled=pooled)
    return noise


def duration_class(median_ms: float) -> str:
    for limit, name in DURATION_CLASSES:
        if median_ms < limit:
            return name
    return DURATION_CLASSES[-1][1]


def duration_classes(median_ms: np.ndarray) -> np.ndarray:
    """duration_class of each median, as its index in DURATION_CLASSES."""
    limits = np.array([limit for limit, _ in DURATION_CLASSES])
    return np.minimum(np.searchsorted(limits, median_ms, side="right"), len(limits) - 1)


def pool(estimates: Iterable[tuple[tuple, float | None, int]], min_differences: int = 3) -> dict[tuple, float]:
    """{pool key: pooled sigma} from (pool key, own sigma, differences) of many series: the median of
    the series with at least `min_differences` behind their own estimate."""
    by_key: dict[tuple, list[float]] = {}
    for key, sigma, n in estimates:
        if sigma is not None and n >= min_differences:
            by_key.setdefault(key, []).append(sigma)
    return {k: max(median(v), SIGMA_FLOOR) for k, v in by_key.items()}


def p_values(z: Sequence[float], df: Sequence[float], tail: tuple[float, float] = GATE_TAIL) -> list[float]:
    """Two-sided p-values of standardised differences under a calibrated tail, each with at most its
    df degrees of freedom (one vectorised call: the history asks for thousands)."""
    if not len(z):
        return []
    # here: an unchanged site rebuild never needs scipy's import; stdtr(df, -x) is what
    # scipy.stats.t(df).sf(x) computes, without scipy.stats' import (a second of a build)
    from scipy.special import stdtr

    za = np.abs(np.asarray(z, dtype=float)) / tail[1]
    dfa = np.minimum(tail[0], np.maximum(np.asarray(df, dtype=float), 1.0))
    return np.where(np.isfinite(za), 2 * stdtr(dfa, -np.nan_to_num(za, posinf=0.0)), 0.0).tolist()


def fdr(pvalues: Sequence[float], q: float) -> list[bool]:
    """Benjamini-Hochberg at false-discovery rate q: which hypotheses are rejected. When every
    hypothesis is true, the chance of rejecting any is at most q."""
    m = len(pvalues)
    if not m:
        return []
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p, kind="stable")  # as sorted(): ties in their order
    below = np.flatnonzero(p[order] <= q * np.arange(1, m + 1) / m)  # q * rank / m, as Python computes it
    rejected = np.zeros(m, dtype=bool)
    if len(below):
        rejected[order[:below[-1] + 1]] = True
    return rejected.tolist()


class RunningDifferences:
    """Absolute differences collected one by one, with the noise they give at any moment (the
    detector's estimate must use only what was known when it decided: see regress.py)."""

    def __init__(self) -> None:
        # arrays of doubles, not lists of floats: the history keeps thousands of them, and the noise
        # reads each whole at every point (a list's floats lie all over the memory)
        self._sorted = array("d")
        self._squares = array("d")  # each ** 2, in the same order
        self._sigma: tuple[float | None, int] | None = None  # sigma() until the next change
        self._noise: tuple[float | None, Noise] | None = None  # (prior, noise()) until the next change
        self.log: list[tuple] = []  # what came and went, in order ((True, diffs) or (False, diff)): the
        # noise of an earlier moment can be made again (regress: each point's noise before it)

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, diff: float) -> None:
        """extend((diff,)) without its loop (the history adds one at each point of every series)."""
        self.log.append((True, (diff,)))
        if math.isfinite(diff):
            a = abs(diff)
            k = bisect_right(self._sorted, a)
            self._sorted.insert(k, a)
            self._squares.insert(k, a ** 2)
            self._sigma = self._noise = None

    def extend(self, diffs: Iterable[float]) -> None:
        """add() each of diffs (a point's reruns and rechecks: one call)."""
        self.log.append((True, diffs))
        values, squares = self._sorted, self._squares
        for diff in diffs:
            if math.isfinite(diff):
                a = abs(diff)
                k = bisect_right(values, a)
                values.insert(k, a)
                squares.insert(k, a ** 2)
                self._sigma = self._noise = None

    def remove(self, diff: float) -> None:
        """Drop one difference found, later, to be a step (change, not noise)."""
        self.log.append((False, diff))
        k = bisect_left(self._sorted, abs(diff))
        if k < len(self._sorted) and self._sorted[k] == abs(diff):
            del self._sorted[k], self._squares[k]
            self._sigma = self._noise = None

    def noise(self, prior: float | None) -> Noise:
        """combine(*sigma(), prior): the same object until a difference comes or goes."""
        if self._noise is None or self._noise[0] is not prior:
            self._noise = (prior, combine(*self.sigma(), prior))
        return self._noise[1]

    def noise_without(self, diff: float, prior: float | None) -> Noise:
        """noise(prior) as it would be without one of its differences (that of a candidate step:
        a step is no noise of the series)."""
        k = bisect_left(self._sorted, abs(diff))
        if not (k < len(self._sorted) and self._sorted[k] == abs(diff)):
            return self.noise(prior)
        d, squares = self._sorted[:k] + self._sorted[k + 1:], self._squares[:k] + self._squares[k + 1:]
        return combine(_scale(d, list(squares)), len(d), prior)

    def sigma(self) -> tuple[float | None, int]:
        """(own sigma, differences it rests on)."""
        if self._sigma is None:
            self._sigma = _scale(self._sorted, self._squares), len(self._sorted)
        return self._sigma
