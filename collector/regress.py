"""The history of every series, commit by commit, as the gate met it: the flags the site shows.

Pure functions, no I/O (docs/regressions.md has the long form). The history is walked commit by
commit in commit order, and at each commit X:

1. The gate: every series measured at X and before is one line (its previous point, its point at
   X), and the lines are judged together as verdicts.judge judges them (its measure and
   verdict_name), exactly as `kcollect compare <the previous benchmarked commit> X` does. Each
   line's noise is what the series' history told before X, with X's own reruns and rechecks. A
   significant change is a flag decided at X.
2. Persistence: a step the gate could not tell from noise with one point (a noisy series) is
   looked for again with the KMAX = 2 points after it, by two tests against the median of up to
   WINDOW points of its segment before: the least of the points in standard errors (so one
   outlier, or one flip of a bimodal series, is never a step), and their mean in standard errors
   of the noise without the step's own difference (_joint: the second point's evidence, which the
   least of them throws away); the better of the two, its p-value doubled, under each test's
   calibrated tail, judged with the other series' candidates at the same false-discovery rate.
3. Drift: each commit's machine drift (per GPU and machine, from the lines whose code did not
   change) is chained into a level that every series is corrected by, so that the levels of
   several commits can be compared. Only its level (verdicts.Drift): a commit's lines span
   different intervals where commits measure different kernels, and the time per call fitted to
   them, chained, wandered as a random walk (a 9 us series of the H200's history between +13% and
   -21% while it took 8.2-9.9 us: lab/results/drift_eval.txt); the gate corrects by both.
4. Slides: a level that moved by the threshold over the last SLIDE_SPAN points of a segment (code
   changes included, since each step was too small to flag) is a slow slide, reported as such.

A flag, decided with what was known at its commit, stays raised however many commits follow. It
is 'recovered' once PERSIST points in a row after it are back: nearer the level before than the
level after, and within the threshold of the level before; else 'open'.
"""
from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass, replace
from statistics import median
from typing import Iterable, Protocol, Sequence

import numpy as np

from .noise import (DURATION_CLASSES, JOINT_TAIL, PERSISTENT_TAIL, Noise, RunningDifferences, combine,
                    duration_class, p_values, pool, typical)
from .series import (COLUMNS, QUERY, Point, SeriesKey, at_level, commit_rank, describe_env_change, device, fast_median,
                     group_series, points_from_rows, series_key)
from .verdicts import (METHOD, NO_DRIFT, Q, UNCHANGED, UNKNOWN, WITH_ENV, Columns, Line, Side, decide, env_between,
                       env_change, floor_classes, gating, is_reference, is_same, made, measure, note_of,
                       point_variance, spreads, verdict_name, verdict_of)

__all__ = ["COLUMNS", "QUERY", "Point", "SeriesKey", "describe_env_change", "device", "points_from_rows",
           "series_key", "analyse", "walk", "detect", "detect_all", "Flag", "SeriesResult", "Slide"]

DEFAULT_THRESHOLD = 0.03
WINDOW = 3  # points before a step that set the level persistence measures it from (a level that
# wanders over days would bias a longer one)
LEVELS = 10  # points either side of a flag whose median is the level it reports
PERSIST = 2  # points in a row that make a recovery
KMAX = 2  # a step is looked for with at most this many points after it. Two: with more, a candidate
# can only stand fewer standard errors out than it did with two (the least of more points, against
# the same level), so it would be tried again at a price (the candidates tried multiply its p-value)
# for nothing; on the held-out H100 noise two find more steps within 2 commits than 2..5 did
# (docs/regressions.md)
JOINT_FLOOR = 0.005  # persistence's joint test counts no series as quieter than 0.5%: without the
# step's own difference, the noise of a short quiet history can rest on a few near-equal differences,
# and on the calibration history (the H200's runs) same-code candidates of 1-2% then stood up to
# 11.2 standard errors out (8.4 with the floor; 5.9 with the floor and _joint's rule on the level)
SLIDE_SPAN = 10  # points over which a slow slide is measured
SLIDE_ENDS = 3  # points whose median is each end of a slide
QUIET = ("same", "within noise")  # the gate's verdicts that are no step: a plain line's difference is noise
STEPS = ("regression", "improvement", "moved", "method changed", "environment changed", WITH_ENV, "partial run")
EXPLAINED = ("regression", "improvement", WITH_ENV, "partial run")  # steps our code (may have) made


class CodeChanges(Protocol):
    """What codechange.Repo answers: our code's status for a kernel between two commits (None where
    git cannot tell), and whether its method changed."""

    def status(self, kernel: str, a: str | None, b: str | None) -> str | None: ...

    def method_changed(self, kernel: str, a: str | None, b: str | None) -> bool: ...


@dataclass(frozen=True)
class Flag:
    kind: str  # 'regression' (slower) or 'improvement' (faster)
    index: int  # the first point after the step
    before_commit: str
    after_commit: str
    before_ms: float  # the levels either side (medians of up to LEVELS points), corrected for the drift
    after_ms: float
    change: float  # after / before - 1
    noise_sigmas: float  # the step in standard errors
    cause: str | None = None  # None: the series' own step; else what else changed (see _cause)
    status: str = "open"  # 'open', or 'recovered': later points are back near the level before
    recovered_commit: str | None = None  # the first commit back
    recovered_index: int | None = None
    decided_index: int | None = None  # the point at which it was decided (index: by the gate)
    verdict: str = ""  # the verdict that raised it (verdicts.MARK)
    code: str | None = None  # our code between the points either side of the step (verdicts.CHANGED, ...)
    p: float | None = None  # the p-value it was decided with (the gate's, or persistence's times its candidates)

    @property
    def by_gate(self) -> bool:
        """Decided at its own commit, as `compare` decides it; else found later, with more points."""
        return self.decided_index == self.index


@dataclass(frozen=True)
class Slide:
    """A slow slide: the level moved by `change` from `start_commit` to `end_commit`, with no flag."""

    start_index: int
    end_index: int
    start_commit: str
    end_commit: str
    change: float
    z: float


@dataclass(frozen=True)
class SeriesResult:
    key: SeriesKey
    points: list[Point]
    noise: Noise  # of one run, from the whole history
    flags: list[Flag]
    drift: tuple[float, ...]  # per point, the machine drift removed (log units; 0.01 ~ 1% slower)
    prior: float | None = None  # the pooled noise of like series it leans on
    ours: bool = False
    noise_at: tuple[Noise, ...] = ()  # per point: the noise its line was judged with
    noise_before: tuple[Noise, ...] = ()  # per point: what the history before it told
    lines: tuple[Line | None, ...] = ()  # per point: the gate's judged line ending there (None: the first)
    slides: tuple[Slide, ...] = ()  # per point where a slide ended there


def noise_until(result: SeriesResult, end: int) -> Noise:
    """A series' noise as the gate knew it at point `end` (its reruns and rechecks included)."""
    return result.noise_at[min(end, len(result.noise_at) - 1)]


# -- pooled noise -----------------------------------------------------------------------------------


def pool_key(key: SeriesKey, points: Sequence[Point]) -> tuple:
    return (key.gpu, key.machine, key.timing, duration_class(fast_median([p.median_ms for p in points])))


def priors(series: dict[SeriesKey, list[Point]], ours: set[SeriesKey]) -> dict[SeriesKey, float | None]:
    """{series: the noise its own estimate is shrunk towards}: the typical difference of the same
    series on the other machines of its GPU model (a kernel's noise is its own: a bimodal one is
    bimodal on every host), itself shrunk towards the pool of like references (pooled_noise); the
    pool alone where it has none. Typical (the median difference), not the series' own estimate: a
    whole history, steps and all, is read here."""
    history = {key: differences(points) for key, points in series.items()}
    keys = {key: pool_key(key, points) for key, points in series.items()}
    pooled = pooled_noise(series, ours, history, keys)
    siblings: dict[tuple, list[tuple[SeriesKey, list[float]]]] = {}
    for key, diffs in history.items():
        siblings.setdefault(key._replace(machine=None), []).append((key, diffs))
    out = {}
    for key in series:
        pool_sigma = pooled.get(keys[key])
        diffs = [d for other, ds in siblings[key._replace(machine=None)] if other != key for d in ds]
        out[key] = combine(typical(diffs), len(diffs), pool_sigma).sigma if diffs else pool_sigma
    return out


def pooled_noise(series: dict[SeriesKey, list[Point]], ours: set[SeriesKey],
                 history: dict[SeriesKey, list[float]] | None = None, keys: dict[SeriesKey, tuple] | None = None
                 ) -> dict[tuple, float]:
    """{pool key: the median noise of the reference series in it}: providers that are not ours,
    whose code does not change between our commits, each the typical difference over its whole
    history in one environment. `history`, `keys`: each series' differences() and pool_key(), where
    the caller has them."""
    estimates = []
    for key, points in series.items():
        if key not in ours and points:
            diffs = history[key] if history is not None else differences(points)
            estimates.append((keys[key] if keys is not None else pool_key(key, points), typical(diffs), len(diffs)))
    return pool(estimates)


def differences(points: Sequence[Point]) -> list[float]:
    """Every difference a whole history shows: inside each point, and between consecutive points
    measured in one environment (steps and all)."""
    diffs = [d for p in points for d in p.within]
    diffs += [math.log(b.median_ms / a.median_ms) for a, b in zip(points, points[1:]) if a.env == b.env]
    return diffs


# -- the walk -----------------------------------------------------------------------------------------


@dataclass
class _State:
    """One series during the walk."""

    points: list[Point]
    ours: bool
    prior: float | None
    diffs: RunningDifferences
    y: list[float]  # log times, corrected for the drift as it became known
    cuts: list[int]  # indexes where a segment starts: flags, and changes of method or conditions (a
    # change of our code too small to flag does not start one: the level either side is one level)
    added: dict[int, float]  # index -> the difference with the point before, where it counted as noise
    steps: list[tuple]  # (j, i, z, verdict, code, cause, p)
    code: list[str | None]  # per point: our code since the point before (None: the first)
    noise_at: list[Noise]
    before: list[int]  # per point: the length of diffs.log before it (see _noise_before)
    slides: list[Slide]
    row: int = 0  # the walk's Columns row of the line ending at point i is row + i
    first: int = 0  # the place of its first point in the walk's y
    where: int = 0  # its (gpu, machine) in the walk's list of them
    log_t: float = 0.0  # log1p of its kernel's threshold

    def cut_before(self, j: int) -> int:
        """The last cut before index j (cuts are kept sorted; the first is 0)."""
        return self.cuts[max(bisect_left(self.cuts, j) - 1, 0)]

    def noise(self) -> Noise:
        return self.diffs.noise(self.prior)


class _Later(Sequence):
    """A tuple of a SeriesResult made when first read (the site reads neither its lines nor its
    noise_before): make(*args)."""

    def __init__(self, make, *args):
        self._make, self._args, self._value = make, args, None

    def _all(self) -> tuple:
        if self._value is None:
            self._value = self._make(*self._args)
            self._make = self._args = None
        return self._value

    def __getitem__(self, k):
        return self._all()[k]

    def __len__(self) -> int:
        return len(self._all())

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other)

    def __repr__(self) -> str:
        return repr(self._all())


def _noise_before(s: _State) -> tuple[Noise, ...]:
    """Each point's noise before it (its reruns and rechecks not yet counted), replayed from the log."""
    diffs, out, done = RunningDifferences(), [], 0
    for mark in s.before:
        for added, x in s.diffs.log[done:mark]:
            diffs.extend(x) if added else diffs.remove(x)
        done = mark
        out.append(diffs.noise(s.prior))
    return tuple(out)


class _Commit:
    """One commit's members (series, its state, the index of its point there) and where the walk's
    arrays hold them: each point in the walk's y (`at`), its series' first point (`first`), and the
    Columns rows of the lines ending there (`rows`, for the members `judged`: all but first points)."""

    def __init__(self, members: list[tuple[SeriesKey, _State, int]]):
        self.members = members
        self.at = np.array([s.first + i for _, s, i in members], dtype=np.int64)
        self.first = np.array([s.first for _, s, _ in members], dtype=np.int64)
        self.where = np.array([s.where for _, s, _ in members], dtype=np.int64)
        self.log_t = np.array([s.log_t for _, s, _ in members])
        self.judged = [(s, i) for _, s, i in members if i]
        self.rows_list = [s.row + i for s, i in self.judged]
        self.rows = np.array(self.rows_list, dtype=np.int64)
        self.at_judged = np.array([s.first + i for s, i in self.judged], dtype=np.int64)

    def plan(self, plain: np.ndarray) -> "_Commit":
        """With `plain` (per line of the walk: no change of conditions or method) of its lines."""
        self.plain = plain[self.rows].tolist()
        return self


class _Walk:
    def __init__(self, series: dict[SeriesKey, list[Point]], ours: set[SeriesKey], thresholds: dict[str, float],
                 code: CodeChanges | None, q: float):
        self.thresholds, self.code, self.q = thresholds, code, q
        prior = priors(series, ours)
        self.state = {k: _State(pts, k in ours, prior[k], RunningDifferences(), [], [0], {},
                                [], [], [], [], []) for k, pts in series.items()}
        self.level: dict[tuple, float] = {}  # (gpu, machine) -> the chained drift so far
        self.record: list | None = None  # persistence candidates, kept for the calibration
        self.commit_drift: dict[tuple, dict[str, float]] = {}
        self._log_t: dict[str, float] = {}

    def threshold_of(self, kernel: str) -> float:
        return self.thresholds.get(kernel, DEFAULT_THRESHOLD)

    def log_t(self, kernel: str) -> float:
        """log1p(threshold_of(kernel)), computed once per kernel."""
        if kernel not in self._log_t:
            self._log_t[kernel] = math.log1p(self.threshold_of(kernel))
        return self._log_t[kernel]

    def run(self) -> None:
        rank = commit_rank(s.points for s in self.state.values())
        at: dict[str, list[tuple[SeriesKey, _State, int]]] = {}
        for key, s in self.state.items():
            s.points.sort(key=lambda p: rank[p.commit])  # one commit order for every series
            for i, p in enumerate(s.points):
                at.setdefault(p.commit, []).append((key, s, i))  # its state too: a key's hash is 8 strings
        self._lines()
        for commit in sorted(at, key=rank.get):
            self.commit(commit, _Commit(at[commit]).plan(self.plain))

    def _lines(self) -> None:
        """What judging each line of the history (a series' two consecutive points) reads but its
        noise, as verdicts.Columns (built series by series here as verdicts.columns builds it line
        by line): each commit judges its rows of that table. The lines themselves (Line, Side) are
        made only when a SeriesResult's are read (_Later): the site never reads them."""
        wheres: dict[tuple, int] = {}
        timed: dict[tuple, int] = {}
        envs, logs, where, timing, a_ms, points, a_idx, log_ms, gates, refs, codes = ([] for _ in range(11))
        for key, s in self.state.items():
            pts = s.points
            n = len(pts) - 1
            s.row = len(logs) - 1  # the line ending at point i is row s.row + i
            s.code = [None] + [code_status(self.code, key.kernel, s.ours, a.commit, b.commit)
                               for a, b in zip(pts, pts[1:])]
            ms = [p.median_ms for p in pts]
            logs += [math.log(b / a) for a, b in zip(ms, ms[1:])]  # log_change
            env = [env_between(a.env, b.env) for a, b in zip(pts, pts[1:])]
            envs += env
            gates += [gating(s.ours, code, key.gpu, e, a.partial or b.partial)
                      for code, e, a, b in zip(s.code[1:], env, pts, pts[1:])]
            refs += [is_reference(code, e) for code, e in zip(s.code[1:], env)]
            codes += s.code[1:]
            s.where = wheres.setdefault((key.gpu, key.machine), len(wheres))
            s.log_t = self.log_t(key.kernel)
            where += [s.where] * n
            timing += [timed.setdefault((key.gpu, key.machine, key.timing), len(timed))] * n
            a_ms += ms[:-1]
            s.first = len(points)  # its points' place in `points` (and self.y)
            a_idx += range(s.first, s.first + n)  # each line's point before
            points += pts
            log_ms += [math.log(m) for m in ms]
        spread, a_idx = spreads(points), np.array(a_idx, dtype=np.int64)
        self.envs, self.logs = envs, logs
        self.plain = np.array([not e and code != METHOD for e, code in zip(envs, codes)], dtype=bool)
        self.judgements: list[tuple] = []  # each commit's (rows, verdicts, corrected, z, p, noises)
        self.judged: list[list] | None = None  # per line: [verdict, corrected, z, p, noise], from them
        self.y = np.zeros(len(points))  # every series' s.y, where persistence and slides look first
        self.log_ms = np.array(log_ms)  # each point's log time, and the machines' levels, make its y
        self.wheres = list(wheres)
        self.columns = Columns(np.array(logs, dtype=float), np.array(where, dtype=np.int64),
                               floor_classes(timing, a_ms),
                               np.array(refs, dtype=bool), spread[a_idx], spread[a_idx + 1],
                               np.array(gates, dtype=bool), list(wheres), len(timed) * len(DURATION_CLASSES),
                               1.0 / np.array(a_ms, dtype=float))

    def _made_lines(self, key: SeriesKey, s: _State) -> tuple[Line | None, ...]:
        """The series' lines as the gate judged them (None before its first point)."""
        if self.judged is None:
            self.judged = [[]] * len(self.logs)
            for rows, *values in self.judgements:
                for r, *v in zip(rows, *values):
                    self.judged[r] = v
        sides = [_side(key, p) for p in s.points]
        out: list[Line | None] = [None]
        for i in range(1, len(sides)):
            r, code = s.row + i, s.code[i]
            verdict, corrected, z, p, noise = self.judged[r]
            out.append(made(Line, key=key[:5], a=sides[i - 1], b=sides[i], code=code, verdict=verdict, ours=s.ours,
                            noise=noise, change=math.expm1(self.logs[r]), corrected=corrected, z=z, p=p,
                            note=note_of("", self.envs[r], code)))
        return tuple(out)

    def commit(self, commit: str, c: _Commit) -> None:
        noises = []
        for key, s, i in c.members:
            p, diffs = s.points[i], s.diffs
            s.before.append(len(diffs.log))
            if p.within:  # else nothing came that the noise is made of
                diffs.extend(p.within)
            noise = diffs.noise(s.prior)
            s.noise_at.append(noise)
            if i:
                noises.append(noise)
        m = measure(self.columns.take(c.rows), noises, self.q)
        for group in {self.wheres[w] for w in c.where.tolist()}:
            self.level[group] = self.level.get(group, 0.0) + m.drift.get(group, NO_DRIFT).level
            self.commit_drift.setdefault(group, {})[commit] = self.level[group]
        y = self.log_ms[c.at] - np.array([self.level.get(w, 0.0) for w in self.wheres])[c.where]
        self.y[c.at] = y
        for (_, s, _), v in zip(c.members, y.tolist()):
            s.y.append(v)
        corrected = [math.expm1(x) for x in m.dc]
        verdicts = ["same" if is_same(x, s.log_t) else verdict_name(
            x, sig, s.log_t, self.envs[r], s.code[i], s.ours, s.points[i - 1].partial or s.points[i].partial)
            for x, sig, (s, i), r in zip(corrected, m.significant, c.judged, c.rows_list)]
        self.judgements.append((c.rows_list, verdicts, corrected, m.z, m.p, m.noises))
        noise = (self.y[c.at_judged] - self.y[c.at_judged - 1]).tolist()  # each line's difference
        for k, (s, i) in enumerate(c.judged):
            if c.plain[k] and verdicts[k] in QUIET:  # the common case of _gate, without its call
                s.added[i] = noise[k]
                s.diffs.add(noise[k])
            else:
                self._gate(s, i, verdicts[k], m.z[k], s.code[i], m.p[k], self.envs[c.rows_list[k]])
        self._persistence(self._stepped(self._moved(c, KMAX + WINDOW, 2)))
        self._slides(self._moved(c, SLIDE_SPAN, 2 * SLIDE_ENDS), len(c.members))

    def _moved(self, c: _Commit, span: int, least: int) -> list[tuple[SeriesKey, _State, int]]:
        """The members with `least` points before this one whose last `span` points (as many as
        there are) are log_t apart or more: a step or a slide needs that (every window persistence
        and slides read lies in them), so the others are not looked at (all are for the calibration)."""
        y = self.y[np.maximum(c.at[:, None] - np.arange(span), c.first[:, None])]
        keep = (c.at - c.first >= least) & ((y.max(axis=1) - y.min(axis=1) >= c.log_t) | (self.record is not None))
        return [c.members[k] for k in np.flatnonzero(keep).tolist()]

    def _stepped(self, members: list[tuple[SeriesKey, _State, int]]) -> list[tuple[SeriesKey, _State, int]]:
        """The members where _candidate can find a step: where, for some point j it tries, the
        medians of the points before j and from j differ by log_t or more (the same windows and
        medians, of all members at once), so that the others are not looked at (all are for the
        calibration)."""
        if self.record is not None or not members:
            return members
        i = np.array([m[2] for m in members])
        first = np.maximum.reduce([np.ones_like(i), i - KMAX + 1, np.array([s.cuts[-1] for _, s, _ in members]),
                                   np.array([s.steps[-1][0] + 1 if s.steps else 0 for _, s, _ in members])])
        at = np.array([s.first for _, s, _ in members])  # the series' first point in self.y
        log_t = np.array([s.log_t for _, s, _ in members])
        found = np.zeros(len(members), dtype=bool)
        for back in range(1, KMAX):  # j = i - back
            tried = np.flatnonzero(i - back >= first)
            j, start, end = i[tried] - back, at[tried], at[tried] + i[tried] + 1
            cuts = [members[k][1].cut_before(x) for k, x in zip(tried.tolist(), j.tolist())]
            lo = np.maximum(np.array(cuts, dtype=np.int64), j - WINDOW)
            found[tried] |= np.abs(self._medians(start + j, end) - self._medians(start + lo, start + j)) >= log_t[tried]
        return [members[k] for k in np.flatnonzero(found).tolist()]

    def _medians(self, start: np.ndarray, stop: np.ndarray) -> np.ndarray:
        """fast_median of self.y[start:stop] for each row (one to a few points each)."""
        n = stop - start
        idx = start[:, None] + np.arange(int(n.max(initial=1)))
        y = np.where(idx < stop[:, None], self.y[np.minimum(idx, len(self.y) - 1)], np.inf)
        y.sort(axis=1)
        rows = np.arange(len(n))
        upper, lower = y[rows, n // 2], y[rows, np.maximum(n // 2 - 1, 0)]
        return np.where(n % 2 == 1, upper, (lower + upper) / 2)

    def _gate(self, s: _State, i: int, verdict: str, z: float, code: str, p: float, env: str | None) -> None:
        """The gate's verdict on the line ending at point i: a step, a cut, or a difference of noise."""
        if verdict in STEPS:
            s.steps.append((i, i, z, verdict, code, _cause(verdict, env, s.ours), p))
            insort(s.cuts, i)
        elif env or code == METHOD:
            insort(s.cuts, i)
        if not (env or code == METHOD or verdict in EXPLAINED):
            # one method and one set of conditions, and no step that our code explains: their
            # difference tells the noise (a flip of a bimodal series too, flagged or not)
            s.added[i] = s.y[i] - s.y[i - 1]
            s.diffs.add(s.added[i])

    def _persistence(self, members: list[tuple[SeriesKey, _State, int]]) -> None:
        found = []
        for key, s, i in members:
            best = self._candidate(key, s, i)
            if best:
                found.append((key, s, i, best))
        # the calibrated tail alone, not capped by the differences behind each series' noise: on the
        # calibration history the candidates of series with a short history are no heavier-tailed
        # than the others (benchmarks/regress_eval.py prints both), and the cap cost most steps
        # of the first commits of a series
        ps = [min(1.0, f[3][5] * f[3][6]) for f in found]
        # a candidate's line is the gate's line at its point j at other levels: its family is that one's
        gates = [self.columns.gates[s.row + best[0]] for _, s, _, best in found]
        for k, rejected in enumerate(decide(ps, [f[3][1] for f in found], np.array(gates, dtype=bool), self.q)):
            if not rejected:
                continue
            key, s, i, (j, z, noise, lb, la, _, _) = found[k]
            ln = self._step(key, s, j, z, noise, lb, la)
            s.steps.append((j, i, ln.z, ln.verdict, ln.code, _cause(ln.verdict, env_change(ln), ln.ours), ps[k]))
            insort(s.cuts, j)
            if ln.verdict in EXPLAINED and j in s.added:  # our code's step, found late: not noise
                s.diffs.remove(s.added.pop(j))

    def _candidate(self, key: SeriesKey, s: _State, i: int) -> tuple[int, Line, int] | None:
        """The best step of one series decided at point i with 2..KMAX points after it: (its index,
        its line named as the gate would name it, the candidates tried)."""
        # every cut and step so far is at a point met, so at i or before; steps come in the order of
        # their index (a candidate starts after the last step, and the gate's is at i)
        last_cut, last_step = s.cuts[-1], s.steps[-1][0] if s.steps else -1
        first = max(1, i - KMAX + 1, last_cut, last_step + 1)
        if first >= i:
            return None
        log_t = self.log_t(key.kernel)
        window = s.y[max(s.cut_before(first), first - WINDOW):i + 1]  # every point the medians below read
        if self.record is None and max(window) - min(window) < log_t:
            return None  # no two medians within it can be log_t apart (the answer without the work)
        best, tried = None, 0
        noise = s.noise()
        for j in range(first, i):
            # from last_cut on, the points after j are all one code and one condition, with no step
            lo = max(s.cut_before(j), j - WINDOW)
            before, after = s.y[lo:j], s.y[j:i + 1]
            tried += 1
            lb, la = fast_median(before), fast_median(after)
            if self.record is None and abs(la - lb) < log_t:
                continue  # too small to be a step (z is computed below only for the calibration's record)
            sign = math.copysign(1.0, la - lb)
            # every point after the step stands beyond the level before: the least of them, each in
            # standard errors of that point (its runs: a point of several runs is surer) against
            # that level (one flip of a noisy series cannot make it, which is why its tail is so
            # much lighter than the gate's)
            var_before = _factor(len(before)) / len(before) ** 2 * sum(
                point_variance(p, noise.sigma) for p in s.points[lo:j])
            dev = [(s.y[k] - lb) * sign for k in range(j, i + 1)]
            z = sign * max(0.0, min(d / math.sqrt(point_variance(s.points[k], noise.sigma) + var_before)
                                    for k, d in zip(range(j, i + 1), dev)))
            z2 = sign * _joint(s, j, i, lo, dev)
            if self.record is not None:  # the calibration's null: same code over the window
                self.record.append((key, s.ours, j, i, z, s.code[lo + 1:i + 1], noise.n, z2))
            if abs(la - lb) < log_t or (z == 0 and z2 == 0):
                continue
            p, decided = _persistence_p(z, z2)
            if best is None or p < best[5]:
                best = (j, decided, noise, lb, la, p)
        return None if best is None else (*best, tried)

    def _step(self, key: SeriesKey, s: _State, j: int, z: float, noise: Noise, lb: float, la: float) -> Line:
        """A persistent step's line at j, from level lb to la, named as the gate would name it."""
        a, b = at_level(s.points[j - 1], math.exp(lb)), at_level(s.points[j], math.exp(la))
        ln = made(Line, key=key[:5], a=_side(key, a), b=_side(key, b), code=s.code[j] or UNKNOWN, verdict="n/a",
                  ours=s.ours, noise=noise, change=math.expm1(la - lb), corrected=math.expm1(la - lb), z=z)
        return verdict_of(ln, True, s.log_t)

    def _slides(self, members: list[tuple[SeriesKey, _State, int]], n: int) -> None:
        """Slides ending at one commit's members (of n series measured there): the level of the last
        SLIDE_ENDS points of a segment of SLIDE_SPAN points at most against its first ones (the
        medians of all members at once)."""
        if not members:
            return
        i = np.array([m[2] for m in members])
        lo = np.maximum([s.cuts[-1] for _, s, _ in members], i - SLIDE_SPAN + 1)  # the last cut: at a point met
        at = np.array([s.first for _, s, _ in members])  # the series' first point in self.y
        long = np.flatnonzero(i - lo + 1 >= 2 * SLIDE_ENDS + 1)
        i, lo, at = i[long], lo[long], at[long]
        d = self._medians(at + i - SLIDE_ENDS + 1, at + i + 1) - self._medians(at + lo, at + lo + SLIDE_ENDS)
        log_t = np.array([members[k][1].log_t for k in long.tolist()])
        tests, moved = [], np.flatnonzero(np.abs(d) >= log_t).tolist()
        long, lo, d = long.tolist(), lo.tolist(), d.tolist()
        for k in moved:
            _, s, end = members[long[k]]
            noise = s.noise_at[end]
            z = d[k] / (noise.sigma * math.sqrt(2 * _factor(SLIDE_ENDS) / SLIDE_ENDS))
            tests.append((s, lo[k], end, d[k], z, noise.df))
        ps = p_values([t[4] for t in tests], [t[5] for t in tests], PERSISTENT_TAIL)
        for (s, lo, i, d, z, _), p in zip(tests, ps):
            if p * n <= self.q:  # Bonferroni over the series of the commit
                s.slides.append(Slide(lo, i, s.points[lo].commit, s.points[i].commit, math.expm1(d), z))

    def results(self) -> dict[SeriesKey, SeriesResult]:
        out = {}
        for key, s in self.state.items():
            level = self.commit_drift[(key.gpu, key.machine)]
            drift = tuple([level[p.commit] for p in s.points])
            flags = _flags(s, self.threshold_of(key.kernel))
            out[key] = SeriesResult(key=key, points=s.points, noise=s.noise(),
                                    flags=flags, drift=drift, prior=s.prior, ours=s.ours, noise_at=tuple(s.noise_at),
                                    noise_before=_Later(_noise_before, s), lines=_Later(self._made_lines, key, s),
                                    slides=tuple(s.slides))
        return out


def code_status(code: CodeChanges | None, kernel: str, ours: bool, a: str | None, b: str | None) -> str:
    """A provider's code of a kernel from commit a to b: ours as git says (UNKNOWN where it cannot
    tell); any other provider's never changes, but its method may (spec.py, grids)."""
    if a is not None and a == b:
        return UNCHANGED
    if code is None:
        return UNKNOWN if ours else UNCHANGED
    if ours:
        status = code.status(kernel, a, b)
        return UNKNOWN if status is None else status
    return METHOD if code.method_changed(kernel, a, b) else UNCHANGED


def _side(key: SeriesKey, p: Point) -> Side:
    return made(Side, point=p, status="ok", timing=key.timing, gpu=key.gpu, machine=key.machine, partial=p.partial,
                commit=p.commit)


def _factor(n: int) -> float:
    # variance of a median of n normal values over that of one value, times n: 1 up to two values
    # (their mean), pi/2 beyond
    return 1.0 if n <= 2 else math.pi / 2


def _joint(s: _State, j: int, i: int, lo: int, dev: list[float]) -> float:
    """Persistence's joint test of a step at j: the mean of the points after it (to i) against the
    level of the WINDOW points before (from lo), in standard errors of the series' noise without the
    step's own difference (a step is no noise of the series: counted, it hides itself in a short
    history), that noise held to JOINT_FLOOR. 0 where it does not apply: a point after stands less
    than half that mean beyond the level (one flip is no step), or the points before are fewer than
    WINDOW or span the threshold or half that mean (no level to measure a step from: a series just
    after a cut, a wild one, a slow slide)."""
    mean = sum(dev) / len(dev)
    before = s.y[lo:j]
    if (j - lo < WINDOW or mean <= 0 or min(dev) < mean / 2
            or max(before) - min(before) >= min(s.log_t, mean / 2)):
        return 0.0
    noise = s.diffs.noise_without(s.added[j], s.prior) if j in s.added else s.noise()
    sigma = max(noise.sigma, JOINT_FLOOR)
    var_after = sum(point_variance(s.points[k], sigma) for k in range(j, i + 1)) / len(dev) ** 2
    var_before = _factor(j - lo) / (j - lo) ** 2 * sum(point_variance(p, sigma) for p in s.points[lo:j])
    return mean / math.sqrt(var_after + var_before)


def _persistence_p(z: float, z2: float) -> tuple[float, float]:
    """(a candidate's p-value, the z that decided it): the smaller of its two tests' (the least
    point's and the joint mean's), each under its own calibrated tail, times the two tests tried."""
    least, = p_values([z], [math.inf], PERSISTENT_TAIL)
    joint, = p_values([z2], [math.inf], JOINT_TAIL)
    return min(1.0, 2 * min(least, joint)), (z if least <= joint else z2)


def _cause(verdict: str, env: str | None, ours: bool) -> str | None:
    """What else changed where a series stepped (a line's verdict, env_change and ours): None when
    it is the series' own step (ours whose code changed, or a reference's move)."""
    if verdict == WITH_ENV:
        return f"environment: {env}; our code changed too: confirm"
    if verdict == "environment changed":
        return f"environment: {env}"
    if verdict == "method changed":
        return "method: how the inputs are drawn or what is measured changed"
    if verdict == "partial run":
        return "partial run: confirm"
    if verdict == "moved" and ours:
        return "our code did not change"
    return None


def _recovered(y: list[float], i: int, before: float, after: float, log_t: float, up: bool) -> int | None:
    """The first point from which PERSIST points in a row are back: nearer the level before the step
    than the level after it, and within the threshold of the level before. `up`: the step was a
    regression, whose way back is down even where its levels, as the machine's drift is estimated
    again with later commits, no longer say so (after below before)."""
    sign = 1.0 if up else -1.0
    mid = (before + after) / 2
    run = 0
    for r in range(i + 1, len(y)):
        back = (y[r] - mid) * sign < 0 and (y[r] - before) * sign < log_t
        run = run + 1 if back else 0
        if run == PERSIST:
            return r - PERSIST + 1
    return None


def _flags(s: _State, threshold: float) -> list[Flag]:
    """Flags in point order, each with its status. The levels either side are the medians of up to
    LEVELS points of the segments around the step (between flags), so they sharpen as points arrive;
    whether there is a step, where, and its z are what was decided."""
    flags = []
    steps = sorted(s.steps)
    bounds = [0] + [st[0] for st in steps] + [len(s.y)]
    log_t = math.log1p(threshold)
    for q, (j, i, z, verdict, code, cause, p) in enumerate(steps):
        before = median(s.y[max(bounds[q], j - LEVELS):j])
        after = median(s.y[j:min(bounds[q + 2], j + LEVELS)])
        rec = _recovered(s.y, i, before, median(s.y[j:i + 1]), log_t, z > 0)  # with the levels it was decided on
        before_ms, after_ms = math.exp(before), math.exp(after)
        flags.append(Flag(kind="regression" if z > 0 else "improvement", index=j,
                          before_commit=s.points[j - 1].commit, after_commit=s.points[j].commit,
                          before_ms=before_ms, after_ms=after_ms, change=after_ms / before_ms - 1,
                          noise_sigmas=round(abs(z), 2) if math.isfinite(z) else math.inf, cause=cause,
                          status="open" if rec is None else "recovered",
                          recovered_commit=s.points[rec].commit if rec is not None else None,
                          recovered_index=rec, decided_index=i, verdict=verdict, code=code, p=p))
    return flags


# -- entry points -----------------------------------------------------------------------------------


def analyse(rows: Iterable[dict], thresholds: dict[str, float] | None = None, code: CodeChanges | None = None,
            q: float = Q) -> dict[SeriesKey, SeriesResult]:
    """Rows of results_v (at least COLUMNS, e.g. `store.query(QUERY)`) -> every series' points,
    noise, drift, gate verdicts, flags and slides. `thresholds`: kernel -> relative threshold
    (DEFAULT_THRESHOLD otherwise); `code`: whose code changed between two commits (a
    codechange.Repo; None: git is not asked, and our code counts as changed at every commit)."""
    series, ours = group_series(rows)
    return walk(series, ours, thresholds, code, q)


def walk(series: dict[SeriesKey, list[Point]], ours: set[SeriesKey], thresholds: dict[str, float] | None = None,
         code: CodeChanges | None = None, q: float = Q, record: list | None = None) -> dict[SeriesKey, SeriesResult]:
    """analyse() on series already made of points (the evaluation plants steps in them). `record`:
    a list that receives every persistence candidate (series, ours, j, i, z, code statuses of its
    window, differences behind its noise), for the calibration."""
    w = _Walk({k: list(v) for k, v in series.items()}, set(ours), thresholds or {}, code, q)
    w.record = record
    w.run()
    return w.results()


def detect(points: Sequence[Point], threshold: float = DEFAULT_THRESHOLD, prior: float | None = None,
           drift: Sequence[float] | None = None, ours: bool = True, q: float = Q) -> list[Flag]:
    """The flags of one series on its own (points in commit order): its own noise, shrunk towards
    `prior`; `drift` (log units, per point) is removed first; `q`: the false-discovery rate (a
    series alone is a family of one: Q / n is how one of n lines of a commit is judged)."""
    if drift is not None:
        points = [replace(p, median_ms=p.median_ms * math.exp(-d),
                          runs_ms=tuple(v * math.exp(-d) for v in p.runs_ms)) for p, d in zip(points, drift)]
    key = SeriesKey("k", "fwd", "ours" if ours else "ref", "s", "dtype", "gpu", None, "cuda-graph")
    w = _Walk({key: list(points)}, {key} if ours else set(), {"k": threshold}, None, q)
    if prior is not None:
        w.state[key].prior = prior
    w.run()
    return w.results()[key].flags


def detect_all(rows: Iterable[dict], thresholds: dict[str, float] | None = None,
               code: CodeChanges | None = None) -> dict[SeriesKey, list[Flag]]:
    """{series key: flags} for the series with at least one flag (analyse() has everything)."""
    return {k: r.flags for k, r in analyse(rows, thresholds, code).items() if r.flags}
