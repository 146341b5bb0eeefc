"""Regression detection over the history: pure functions, no I/O (docs/regressions.md has the long form).

A series is one (kernel, mode, provider, shape, dtype, GPU, machine, timing method), with its `ok`
rows only (an `unstable` row, disturbed while timed, is never a point), in commit order; all runs of
one commit are one point, so an A/A rerun can never look like a step. Everything happens on
log(time), so a 5% slowdown and a 1.05x speed-up are the same distance.

The detector runs through a series point by point, as CI meets the commits, and decides each step
with only the points up to the commit where it decides it. A flag once raised therefore stays raised
however many commits follow, and a short plateau (slower for two or three commits, then reverted)
stays in the history as "regressed at X, recovered at Y".

1. Machine drift: per GPU and machine, each commit's drift is the median, over the series of
   providers that are not ours (their code does not change between our commits), of how far each
   sits from its own recent level; every series is corrected by it, so a clock that sticks slow for
   a few runs moves no series on its own.
2. Noise: each series' run-to-run noise is measured from its own differences up to that commit
   (kcollect.noise), leaning on the pooled noise of like series while its history is short.
3. A step at point j, decided at point i (PERSIST to KMAX points after it): the level after is the
   median of points j..i, the level before the median of up to WINDOW points of the current segment
   before j. It needs all of: |change| at least log(1 + threshold); at least MIN_Z standard errors
   of the difference of the two levels; every point after it beyond the halfway level (all but one
   from four points on), so one outlier is never a step. Of the candidates that pass, the one with
   the largest z is flagged and a new segment starts at it.
4. A change of environment (torch, Triton, driver, CUDA, peer versions) starts a new segment: a move
   across it is flagged with `cause` naming the change, never as the series' own regression. A change
   of timing method or machine is a different series.
5. Status: a flag is 'recovered' once PERSIST points in a row after it are back: nearer the level
   before the step than the level after, and within the threshold of the level before (a revert, a
   fix, or a slow return); else 'open'.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from datetime import datetime
from statistics import median
from typing import Iterable, NamedTuple, Sequence

from .noise import Noise, RunningDifferences, combine, duration_class, pool, sigma_of_differences

OURS = frozenset({"triton"})  # providers whose code is this repository's: every other one is a reference
DEFAULT_THRESHOLD = 0.03
WINDOW = 10  # points before a step that set the level it is measured from
PERSIST = 2  # points a new level must last before it is a step: one outlier never is
KMAX = 5  # a step is decided with at most this many points after it
MIN_Z = 3.0  # step / its standard error; chosen with benchmarks/regress_eval.py on the real history's noise
MIN_REFERENCES = 5  # reference series a commit's drift needs; with fewer it is taken as 0
ENV_FIELDS = ("torch", "triton", "driver", "cuda", "peers")
COLUMNS = ("kernel", "mode", "provider", "shape", "dtype", "status", "median_ms", "p20_ms", "p80_ms", "timing",
           "git_commit", "commit_time", "started_at", "run_id", "device_kind", "gpu_name", "machine") + ENV_FIELDS
QUERY = f"SELECT {', '.join(COLUMNS)} FROM results_v"  # what analyse() needs of each row


class SeriesKey(NamedTuple):
    kernel: str
    mode: str
    provider: str
    shape: str
    dtype: str
    gpu: str  # the GPU's name, or 'cpu' for interpreted rows (never mixed with a GPU's)
    machine: str | None
    timing: str | None  # 'cuda-graph', 'cuda-events' or 'cpu-clock'


@dataclass(frozen=True)
class Point:
    commit: str
    commit_time: datetime | None
    median_ms: float
    p20_ms: float
    p80_ms: float
    runs: int
    env: tuple[tuple[str, str | None], ...] | None = None  # ENV_FIELDS of its runs (None: unknown)
    runs_ms: tuple[float, ...] = ()  # each run's median, when the commit was measured more than once


@dataclass(frozen=True)
class Flag:
    kind: str  # 'regression' (slower) or 'improvement' (faster)
    index: int  # the first point after the step
    before_commit: str
    after_commit: str
    before_ms: float  # the levels either side (medians of up to WINDOW points), corrected for the drift
    after_ms: float
    change: float  # after / before - 1
    noise_sigmas: float  # the step in standard errors of the two levels' difference
    cause: str | None = None  # None: the series' own step; else what else changed ('environment: ...')
    status: str = "open"  # 'open', or 'recovered': later points are back near the level before
    recovered_commit: str | None = None  # the first commit back
    recovered_index: int | None = None
    decided_index: int | None = None  # the point at which the step was decided (index + 1 at best)


@dataclass(frozen=True)
class SeriesResult:
    key: SeriesKey
    points: list[Point]
    noise: Noise  # of one point, from the whole history
    flags: list[Flag]
    drift: tuple[float, ...]  # per point, the machine drift removed (log units; 0.01 ~ 1% slower)
    prior: float | None = None  # the pooled noise of like series it leans on


# -- rows -> points ----------------------------------------------------------------------------------


def device(row: dict) -> str:
    # CPU (interpreted) rows are their own device, so they never meet GPU rows.
    return row.get("gpu_name") or "cpu" if row.get("device_kind") == "cuda" else "cpu"


def series_key(row: dict) -> SeriesKey:
    return SeriesKey(row["kernel"], row["mode"], row["provider"], row["shape"], row["dtype"], device(row),
                     row.get("machine"), row.get("timing"))


def env_of(row: dict) -> tuple[tuple[str, str | None], ...] | None:
    if "torch" not in row:
        return None
    return tuple((f, row.get(f)) for f in ENV_FIELDS)


def describe_env_change(a, b) -> str:
    """'torch 2.11.0 -> 2.12.0, liger-kernel 0.5.2 -> 0.6.0': what differs between two environments."""
    parts = []
    for (name, va), (_, vb) in zip(a or (), b or ()):
        if va == vb:
            continue
        if name == "peers":
            pa, pb = (json.loads(v) if v else {} for v in (va, vb))
            parts += [f"{p} {pa.get(p, 'none')} -> {pb.get(p, 'none')}" for p in sorted(pa.keys() | pb.keys())
                      if pa.get(p) != pb.get(p)]
        else:
            parts.append(f"{name} {va or 'unknown'} -> {vb or 'unknown'}")
    return ", ".join(parts) or "unknown"


def points_from_rows(rows: Iterable[dict]) -> list[Point]:
    """Rows of ONE series (results_v columns) -> one point per commit, in commit order.

    A commit's point is the median of its runs' medians; its band runs from the median of their p20s
    to the median of their p80s, widened to hold every run's median, so disagreeing reruns show as
    spread. Rows without a time (status other than 'ok') are left out; a run without a commit is its
    own point."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        ms = r.get("median_ms")
        if r.get("status", "ok") != "ok" or not ms or not math.isfinite(ms) or ms <= 0:
            continue
        key = r.get("git_commit") or f"run:{str(r.get('run_id', ''))[:8]}"
        groups.setdefault(key, []).append(r)
    points = []
    for commit, runs in groups.items():
        if len(runs) > 1:
            runs.sort(key=lambda r: r.get("started_at") or datetime.min)
        medians = [r["median_ms"] for r in runs]
        p20 = median([r.get("p20_ms") or r["median_ms"] for r in runs])
        p80 = median([r.get("p80_ms") or r["median_ms"] for r in runs])
        times = [r.get("commit_time") for r in runs if r.get("commit_time") is not None]
        points.append((_order_key(runs), Point(
            commit=commit, commit_time=min(times) if times else None, median_ms=median(medians),
            p20_ms=min(p20, *medians), p80_ms=max(p80, *medians), runs=len(runs), env=env_of(runs[-1]),
            runs_ms=tuple(medians) if len(medians) > 1 else ())))
    points.sort(key=lambda kp: kp[0])
    return [p for _, p in points]


def _order_key(runs: list[dict]) -> tuple:
    # By commit time, then by when it was measured; a run without a commit time falls back to its start.
    started = [r["started_at"] for r in runs if r.get("started_at") is not None]
    first_start = min(started) if started else datetime.min
    times = [r["commit_time"] for r in runs if r.get("commit_time") is not None]
    return (min(times) if times else first_start, first_start)


# -- one series ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    j: int  # first point after
    i: int  # decided at
    before: float  # log levels
    after: float
    z: float
    cause: str | None = None


def _spread_factor(n: int) -> float:
    # variance of a median of n normal values over that of one value, times n: 1 up to two values
    # (their mean), pi/2 beyond
    return 1.0 if n <= 2 else math.pi / 2


def _test(y: list[float], lo: int, j: int, i: int, sigma: float, log_t: float) -> _Step | None:
    before, after = y[lo:j], y[j:i + 1]
    lb, la = median(before), median(after)
    d = la - lb
    if abs(d) < log_t:
        return None
    se = sigma * math.sqrt(_spread_factor(len(after)) / len(after) + _spread_factor(len(before)) / len(before))
    z = abs(d) / se
    if z < MIN_Z:
        return None
    mid, sign = (la + lb) / 2, math.copysign(1.0, d)
    beyond = sum((v - mid) * sign > 0 for v in after)
    if beyond < (len(after) if len(after) < 4 else len(after) - 1):
        return None
    return _Step(j=j, i=i, before=lb, after=la, z=z)


def _steps(y: list[float], points: Sequence[Point], log_t: float, prior: float | None) -> list[_Step]:
    """The online pass: steps in the order they were decided (see the module docstring)."""
    diffs = RunningDifferences()
    seg, pending, steps = 0, None, []  # pending: (environment boundary, start of the segment before it)
    for i in range(len(y)):
        for a, b in zip(points[i].runs_ms, points[i].runs_ms[1:]):  # reruns of one commit: pure noise
            diffs.add(math.log(b / a))
        if i > 0 and points[i].env != points[i - 1].env and points[i].env and points[i - 1].env:
            pending, seg = (i, seg), i
        elif i > 0:
            diffs.add(y[i] - y[i - 1])
        if pending and i - pending[0] + 1 >= PERSIST:
            b, prev = pending
            sigma = combine(*diffs.sigma(), prior).sigma
            step = _test(y, max(prev, b - WINDOW), b, i, sigma, log_t)
            if step:
                steps.append(replace(step, cause="environment: " + describe_env_change(points[b - 1].env,
                                                                                       points[b].env)))
            if step or i - b + 1 >= KMAX:
                pending = None
        best = None
        for k in range(PERSIST, KMAX + 1):
            j = i - k + 1
            if j <= seg:
                break
            sigma = combine(*diffs.sigma(without=y[j] - y[j - 1]), prior).sigma
            step = _test(y, max(seg, j - WINDOW), j, i, sigma, log_t)
            if step and (best is None or step.z > best.z):
                best = step
        if best:
            steps.append(best)
            diffs.remove(y[best.j] - y[best.j - 1])  # it straddles the step: not noise
            seg = best.j
    return steps


def _recovered(y: list[float], s: _Step, log_t: float) -> int | None:
    """The first point from which PERSIST points in a row are back: nearer the level before the step
    than the level after it, and within the threshold of the level before."""
    sign = 1.0 if s.after > s.before else -1.0
    mid = (s.before + s.after) / 2
    run = 0
    for r in range(s.i + 1, len(y)):
        back = (y[r] - mid) * sign < 0 and (y[r] - s.before) * sign < log_t
        run = run + 1 if back else 0
        if run == PERSIST:
            return r - PERSIST + 1
    return None


def _flags(points: Sequence[Point], y: list[float], steps: list[_Step], log_t: float) -> list[Flag]:
    """Flags in point order, each with its status (see _recovered). The levels either side are the
    medians of up to WINDOW points of the segments around the step, so they sharpen as points
    arrive; whether there is a step, where, and its z are what was decided."""
    flags = []
    steps = sorted(steps, key=lambda s: s.j)
    bounds = [0] + [s.j for s in steps] + [len(y)]
    for q, s in enumerate(steps):
        rec = _recovered(y, s, log_t)
        before = median(y[max(bounds[q], s.j - WINDOW):s.j])
        after = median(y[s.j:min(bounds[q + 2], s.j + WINDOW)])
        before_ms, after_ms = math.exp(before), math.exp(after)
        flags.append(Flag(kind="regression" if s.after > s.before else "improvement", index=s.j,
                          before_commit=points[s.j - 1].commit, after_commit=points[s.j].commit,
                          before_ms=before_ms, after_ms=after_ms, change=after_ms / before_ms - 1,
                          noise_sigmas=round(s.z, 2), cause=s.cause,
                          status="open" if rec is None else "recovered",
                          recovered_commit=points[rec].commit if rec is not None else None,
                          recovered_index=rec, decided_index=s.i))
    return flags


def _log_times(points: Sequence[Point], drift: Sequence[float] | None) -> list[float]:
    y = [math.log(p.median_ms) for p in points]
    return [v - d for v, d in zip(y, drift)] if drift is not None else y


def detect(points: Sequence[Point], threshold: float = DEFAULT_THRESHOLD, prior: float | None = None,
           drift: Sequence[float] | None = None) -> list[Flag]:
    """Steps in one series (points in commit order), earliest first. `prior`: the pooled noise the
    series leans on while short (default noise.DEFAULT_SIGMA); `drift`: per point, the machine drift
    to remove (log units)."""
    if len(points) < PERSIST + 1:
        return []
    y = _log_times(points, drift)
    log_t = math.log1p(threshold)
    return _flags(points, y, _steps(y, points, log_t, prior), log_t)


def own_differences(points: Sequence[Point], flags: Sequence[Flag] = (), drift: Sequence[float] | None = None
                    ) -> list[float]:
    """The differences that measure a series' noise: consecutive points with no flagged step and no
    change of environment between them, and reruns of one commit."""
    y = _log_times(points, drift)
    cuts = {f.index for f in flags}
    out = [y[i] - y[i - 1] for i in range(1, len(points))
           if i not in cuts and points[i].env == points[i - 1].env]
    for p in points:
        out += [math.log(b / a) for a, b in zip(p.runs_ms, p.runs_ms[1:])]
    return out


def series_noise(points: Sequence[Point], flags: Sequence[Flag] = (), prior: float | None = None,
                 drift: Sequence[float] | None = None) -> Noise:
    diffs = own_differences(points, flags, drift)
    return combine(sigma_of_differences(diffs), len(diffs), prior)


def noise_until(result: SeriesResult, end: int) -> Noise:
    """A series' noise as known from its points before index `end` (compare uses the points before
    the later of its two commits, so that the change it judges is not taken for noise)."""
    return series_noise(result.points[:end], [f for f in result.flags if f.index < end], result.prior,
                        result.drift[:end])


# -- every series -------------------------------------------------------------------------------------


def pool_key(key: SeriesKey, points: Sequence[Point]) -> tuple:
    return (key.gpu, key.machine, key.timing, duration_class(median(p.median_ms for p in points)))


def pooled_noise(series: dict[SeriesKey, list[Point]], ours: frozenset[str] = OURS) -> dict[tuple, float]:
    """{pool key: the median noise of the reference series in it} (see kcollect.noise). Only the
    providers that are not ours: their code does not change between our commits, so their
    differences are noise, where ours may hold the steps being looked for."""
    estimates = []
    for key, points in series.items():
        if points and key.provider not in ours:
            diffs = own_differences(points)
            estimates.append((pool_key(key, points), sigma_of_differences(diffs), len(diffs)))
    return pool(estimates)


def machine_drift(series: dict[SeriesKey, list[Point]], ours: frozenset[str] = OURS) -> dict[tuple, dict[str, float]]:
    """{(gpu, machine): {commit: drift}}. Commit by commit, each reference series (a provider not in
    `ours`) says how far its point sits from the median of its up to WINDOW previous points in the
    same environment, those corrected by the drift already found for their commits (so a clock stuck
    slow for several commits in a row does not become the level the next commits are measured
    against); the commit's drift is the median of what they say, or 0 where fewer than
    MIN_REFERENCES say anything. Like the detector, it uses only earlier commits."""
    out: dict[tuple, dict[str, float]] = {}
    groups: dict[tuple, list[list[Point]]] = {}
    for key, points in series.items():
        if key.provider not in ours:
            groups.setdefault((key.gpu, key.machine), []).append(points)
    for group, members in groups.items():
        at_commit: dict[str, list[tuple[int, int]]] = {}  # commit -> (member, point index)
        when: dict[str, tuple] = {}  # commit -> its place: by commit time, else by its index in a series
        for m, points in enumerate(members):
            for i, p in enumerate(points):
                at_commit.setdefault(p.commit, []).append((m, i))
                when[p.commit] = min(when.get(p.commit, (True,)), (p.commit_time is None, p.commit_time or i))
        order = sorted(at_commit, key=lambda c: when[c])
        corrected = [[math.nan] * len(points) for points in members]
        drift = out.setdefault(group, {})
        for commit in order:
            said = []
            for m, i in at_commit[commit]:
                points, y = members[m], corrected[m]
                start = i
                while start > 0 and i - start < WINDOW and points[start - 1].env == points[i].env:
                    start -= 1
                if start < i:
                    said.append(math.log(points[i].median_ms) - median(y[start:i]))
            drift[commit] = median(said) if len(said) >= MIN_REFERENCES else 0.0
            for m, i in at_commit[commit]:
                corrected[m][i] = math.log(members[m][i].median_ms) - drift[commit]
    return out


def group_series(rows: Iterable[dict]) -> dict[SeriesKey, list[Point]]:
    groups: dict[SeriesKey, list[dict]] = {}
    for r in rows:
        if r.get("status") == "ok":
            groups.setdefault(series_key(r), []).append(r)
    return {k: pts for k, g in groups.items() if (pts := points_from_rows(g))}


def analyse(rows: Iterable[dict], thresholds: dict[str, float] | None = None,
            ours: frozenset[str] = OURS) -> dict[SeriesKey, SeriesResult]:
    """Rows of results_v (at least COLUMNS) -> every series' points, noise, drift and flags.
    `thresholds`: kernel -> relative threshold (DEFAULT_THRESHOLD otherwise)."""
    series = group_series(rows)
    pooled = pooled_noise(series, ours)
    drifts = machine_drift(series, ours)
    thresholds = thresholds or {}
    out = {}
    for key, points in series.items():
        per_commit = drifts.get((key.gpu, key.machine), {})
        drift = tuple(per_commit.get(p.commit, 0.0) for p in points)
        prior = pooled.get(pool_key(key, points))
        flags = detect(points, thresholds.get(key.kernel, DEFAULT_THRESHOLD), prior, drift)
        out[key] = SeriesResult(key=key, points=points, noise=series_noise(points, flags, prior, drift),
                                flags=flags, drift=drift, prior=prior)
    return out


def detect_all(rows: Iterable[dict], thresholds: dict[str, float] | None = None) -> dict[SeriesKey, list[Flag]]:
    """{series key: flags} for the series with at least one flag (analyse() has everything)."""
    return {k: r.flags for k, r in analyse(rows, thresholds).items() if r.flags}
