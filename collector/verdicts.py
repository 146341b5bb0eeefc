"""The verdict engine: one comparison of two points per series, decided together.

`kcollect compare` (the CI gate) and the history behind the site (regress.analyse, which asks this
module at every commit what the gate would have said) decide with the same functions on lines built
the same way, so the site and compare cannot disagree: `judge` is `measure` (the numbers and the
families' decisions, over the lines as arrays: Columns) and `verdict_name` (what each line is
called); the history makes the Columns of all its lines once and measures each commit's rows.

A line is one series on both sides: its point before (A) and after (B). Its change is log(B/A),
corrected for the machine's drift, fitted to the lines whose code did not change on the same GPU
and machine: a level (clocks: every line alike) and a time per call (the host's cost of a launch or
a graph replay, which moves a 10 us line by a share a 1 ms line does not see: Drift). Its standard
error comes from the series' run-to-run noise (kcollect.noise: reruns, rechecks and same-code
history, never below the scatter that today's pair of points shows for like series), widened where
a point's own runs disagree; its p-value from the calibrated Student t (noise.p_values). The lines
are then decided in two families at a false-discovery rate Q (Benjamini-Hochberg): the lines that
can fail the gate (ours, code changed or unknown, measured alike on a GPU), and every other line. A
line is a change when its family rejects it AND its corrected change is at least the threshold.

What a significant change is called:
- ours, code changed (or git cannot tell): 'regression' or 'improvement'; only these can fail;
- the kernel's method changed (only how inputs are drawn or what is measured: spec.py, grids):
  'method changed', whoever's series it is;
- the conditions changed (torch, Triton, driver, CUDA, or the peer's own package): 'environment
  changed', and for ours whose code changed too and got slower 'changed with the environment:
  confirm' (shown, and re-measured by --confirm, never dropped);
- code that did not change (every provider but ours, and ours where git says so): 'moved';
- a point whose every run was interrupted: a slowdown of ours is 'partial run: confirm'.
Never compared: a change of timing method or of machine ('timing changed', 'other machine'), a side
disturbed while timed ('unstable'). A newly failing gate is 'failing' (ours: it gates), or 'case
failed' where every provider of the case failed at B (the reference out of memory, say).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import chain
from statistics import median
from typing import Callable, Iterable

import numpy as np

from .noise import DURATION_CLASSES, PRIOR_WEIGHT, Noise, combine, duration_classes, fdr, p_values, typical
from .series import Env, Point, SeriesKey, describe_env_change, device, is_time, made, points_from_rows

MATCH = ("kernel", "mode", "provider", "shape", "dtype")
Q = 0.01  # false-discovery rate of each family of one comparison: an A/A comparison fails at most this often
MIN_REFERENCES = 5  # lines a drift (or a pair-noise floor) needs; with fewer it is taken as 0 (none)
# The drift's time per call is fitted only where this many of its lines are under SHORT_MS (on longer
# ones it is lost in their noise). Between H200 hosts of one machine name the lines' median moved
# 0.0-0.4% while those under 10 us moved 4-7% (lab/results/drift_by_duration_h200.txt)
SHORT_MS = 0.05
MIN_SHORT = 20
FAILING = ("failed", "error")  # a newly failing gate or crash is a regression; 'unavailable' is not
GATING = ("regression", "failing")
CHANGED, UNCHANGED, METHOD, UNKNOWN = "changed", "unchanged", "method", "unknown"
WITH_ENV = "changed with the environment"
MARK = {"regression": "REGRESSION", "failing": "NOW FAILING", "improvement": "faster", "fixed": "fixed",
        "within noise": "no (noise)", "same": "no", "moved": "moved, code unchanged",
        "method changed": "method changed", "unstable": "unstable, not compared",
        "timing changed": "timing method changed", "environment changed": "environment changed",
        WITH_ENV: "changed with the environment: confirm", "partial run": "partial run: confirm",
        "other machine": "other machine", "case failed": "every provider failed", "slower": "slower",
        "faster": "faster", "not confirmed": "not confirmed", "n/a": "-"}
QUIET = ("same", "within noise", "n/a")  # what `compare --only-changed` leaves out


@dataclass(frozen=True)
class Side:
    """One series on one side: its point (None without a time) and what it was measured with."""

    point: Point | None
    status: str  # 'ok', 'unstable', or the latest row's status
    timing: str | None
    gpu: str
    machine: str | None
    partial: bool = False  # its rows come from interrupted or unfinished runs only
    commit: str | None = None  # the commit its rows are of


@dataclass(frozen=True)
class Line:
    key: tuple  # MATCH values
    a: Side
    b: Side
    code: str  # CHANGED, UNCHANGED, METHOD, or UNKNOWN (git could not tell: treated as changed)
    verdict: str
    ours: bool = False  # the provider's code is ours (the row's `ours`)
    noise: Noise | None = None
    change: float | None = None  # b / a - 1, as measured
    corrected: float | None = None  # the change with the machine drift removed
    z: float | None = None  # the corrected change in standard errors
    p: float | None = None
    note: str = ""

    @property
    def gates(self) -> bool:
        """Whether this line fails the gate: ours, code changed (or unknown), on a GPU, regressed or
        newly failing."""
        return (self.verdict in GATING and self.ours and self.code in (CHANGED, UNKNOWN)
                and "cpu" not in (self.a.gpu, self.b.gpu))

    @property
    def series(self) -> SeriesKey:
        return SeriesKey(*self.key, self.b.gpu, self.b.machine, self.b.timing)


@dataclass(frozen=True)
class Drift:
    """A machine's drift between two points of a series, b = a exp(level) + per_call: a share of
    every line's time (clocks) and a time per call, in ms (the host's cost of a launch or a graph
    replay). The history chains the levels of successive commits (regress: not the times per call)."""

    level: float = 0.0
    per_call: float = 0.0

    def at(self, inv_ms):
        """The drift, log(b / a), of lines whose point before took 1 / inv_ms ms (a float or an array)."""
        return _log_drift(self.level, self.per_call, inv_ms)


NO_DRIFT = Drift()


@dataclass(frozen=True)
class Comparison:
    lines: list[Line]
    drift: dict[tuple, Drift]  # (gpu, machine) -> fitted to the lines whose code did not change
    drift_series: dict[tuple, int]
    notes: list[str]


# -- rows -> sides -----------------------------------------------------------------------------------


def sides(rows: Iterable[dict], where_in_key: bool) -> dict[tuple, tuple[Side, bool]]:
    """Rows of one side -> {match key: (Side, ours)}. With where_in_key (a comparison of commits)
    the GPU and machine are part of the key; otherwise (two runs, two GPUs) they are the side's
    attributes. Where a side holds several timing methods of one series, its latest run's counts."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = tuple(r[c] for c in MATCH) + ((device(r), r.get("machine")) if where_in_key else ())
        groups.setdefault(key, []).append(r)
    out = {}
    for key, group in groups.items():
        latest = max(group, key=lambda r: r.get("started_at") or datetime.min)
        group = [r for r in group if r.get("timing") == latest.get("timing") or r.get("status") != "ok"]
        points = points_from_rows(group)
        disturbed = any(r.get("status") == "unstable" or (r.get("status") == "ok" and not is_time(r)) for r in group)
        status = "ok" if points else ("unstable" if disturbed else latest.get("status"))
        partial = all(r.get("run_status", "finished") not in ("finished", None) for r in group)
        side = Side(points[0] if points else None, status, latest.get("timing"), device(latest),
                    latest.get("machine"), partial, latest.get("git_commit"))
        out[key] = (side, any(r.get("ours") for r in group))
    return out


# -- judging ----------------------------------------------------------------------------------------


def _evolve(obj, **changes):
    """dataclasses.replace for the frozen Line and Noise (no __post_init__, no cached values): their
    fields copied as they are, without __init__'s checks (the history replaces a million lines)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


def point_variance(p: Point, sigma: float) -> float:
    """Variance of a point's log time: its runs' mean (median from three on) of spread sigma, with
    sigma shrunk towards what its own runs show (PRIOR_WEIGHT against their n - 1): one disturbed
    run of two widens its point instead of moving it alone. Its rechecks widen it too, never narrow
    it: a run whose median and recheck disagree (a bimodal row whose median fell on the rarer
    level: conv1d's 1.03 ms against a recheck and a rerun of 1.11 ms, an A/A pair of an H200 at
    0adeb72) has measured itself as less certain than the series' noise says."""
    n, own, k, rss = p.spread
    var = max((PRIOR_WEIGHT * sigma * sigma + own) / (PRIOR_WEIGHT + n - 1),
              (PRIOR_WEIGHT * sigma * sigma + rss) / (PRIOR_WEIGHT + k))
    return var * (1.0 if n <= 2 else math.pi / 2) / n


def conditions_differ(ln: Line) -> tuple[str, str] | None:
    """(verdict, note) when the two points were not measured by one method on one machine."""
    a, b = ln.a, ln.b
    if a.timing != b.timing:
        return "timing changed", f"timing {a.timing} -> {b.timing}"
    if (a.gpu, a.machine) != (b.gpu, b.machine):
        return "other machine", f"{a.gpu} {a.machine or ''} -> {b.gpu} {b.machine or ''}".replace("  ", " ")
    return None


def env_change(ln: Line) -> str | None:
    return env_between(ln.a.point.env, ln.b.point.env)


def env_between(ea: Env | None, eb: Env | None) -> str | None:
    """What changed between two points' conditions (None: nothing, or unknown)."""
    return describe_env_change(ea, eb) if ea is not eb and ea and eb and ea != eb else None


def log_change(ln: Line) -> float:
    return math.log(ln.b.point.median_ms / ln.a.point.median_ms)


@dataclass
class Columns:
    """Timed lines as arrays: what judging them reads but their noise. `where`: each line's (gpu,
    machine), an index into `wheres`; `klass`: its noise-floor class (gpu, machine, timing, and
    the duration class of its point before), numbered from 0 to `classes`; `reference`: a line of
    the drift (code unchanged, conditions alike); spreads: each point's Point.spread; `gates`:
    can_gate. The history makes one of all its lines and judges each commit's rows of it (take),
    so that a commit costs numpy operations, not objects."""

    logs: np.ndarray  # log_change
    where: np.ndarray
    klass: np.ndarray
    reference: np.ndarray
    spread_a: np.ndarray  # (lines, 4): Point.spread
    spread_b: np.ndarray
    gates: np.ndarray
    wheres: list[tuple]
    classes: int
    inv: np.ndarray  # 1 / the point before's median (ms): what the drift's time per call scales by

    def take(self, rows: np.ndarray) -> "Columns":
        return Columns(self.logs[rows], self.where[rows], self.klass[rows], self.reference[rows],
                       self.spread_a[rows], self.spread_b[rows], self.gates[rows], self.wheres, self.classes,
                       self.inv[rows])


def floor_classes(timed: list[int], a_ms: list[float]) -> np.ndarray:
    """Each line's noise-floor class from its number among the (gpu, machine, timing) met (`timed`)
    and its point before's median: one number per (gpu, machine, timing, duration class)."""
    return np.array(timed, dtype=np.int64) * len(DURATION_CLASSES) + duration_classes(np.array(a_ms, dtype=float))


def columns(lines: list[Line], envs: list[str | None], logs: list[float]) -> Columns:
    """The Columns of timed lines, with each line's env_change and log_change."""
    wheres: dict[tuple, int] = {}
    timed: dict[tuple, int] = {}
    where, timing = [], []
    for ln in lines:
        w = (ln.b.gpu, ln.b.machine)
        where.append(wheres.setdefault(w, len(wheres)))
        timing.append(timed.setdefault((*w, ln.a.timing), len(timed)))
    return Columns(np.array(logs, dtype=float), np.array(where, dtype=np.int64),
                   floor_classes(timing, [ln.a.point.median_ms for ln in lines]),
                   np.array([is_reference(ln.code, env) for ln, env in zip(lines, envs)], dtype=bool),
                   spreads([ln.a.point for ln in lines]), spreads([ln.b.point for ln in lines]),
                   np.array([can_gate(ln, env) for ln, env in zip(lines, envs)], dtype=bool), list(wheres),
                   len(timed) * len(DURATION_CLASSES),
                   1.0 / np.array([ln.a.point.median_ms for ln in lines], dtype=float))


def is_reference(code: str, env: str | None) -> bool:
    """A line the machine drift is measured on: code unchanged, conditions alike (env: its env_change)."""
    return code == UNCHANGED and not env


def spreads(points: list[Point]) -> np.ndarray:
    return np.fromiter(chain.from_iterable([p.spread for p in points]), dtype=float,
                       count=4 * len(points)).reshape(-1, 4)


def machine_drift(c: Columns) -> tuple[dict[tuple, Drift], dict[tuple, int], dict[tuple, float]]:
    """Per (gpu, machine): the Drift fitted to the lines whose code and conditions did not change
    (only with MIN_REFERENCES of them); the count; and per noise-floor class (Columns.klass) the
    noise their typical scatter around it implies (a floor for like series: today's points may be
    noisier than the history)."""
    ref = np.flatnonzero(c.reference)
    drift, count, floor = {}, {}, {}
    where = c.where[ref]
    for w in _first_seen(where):
        rows = ref[where == w]
        count[c.wheres[w]] = len(rows)
        if len(rows) < MIN_REFERENCES:
            continue
        d = drift[c.wheres[w]] = fit_drift(c.logs[rows], c.inv[rows])
        scatter, klass = c.logs[rows] - d.at(c.inv[rows]), c.klass[rows]
        for k in _first_seen(klass):
            if (klass == k).sum() >= MIN_REFERENCES:
                floor[k] = typical(scatter[klass == k].tolist())
    return drift, count, floor


def fit_drift(logs: np.ndarray, inv: np.ndarray) -> Drift:
    """The Drift of reference lines (log changes, 1 / their point before's ms): the ratios b / a =
    share + per_call / a by least absolute deviations, one coefficient at a time (a few rounds
    settle it), robust to the few lines that moved on their own. The time per call only with
    MIN_SHORT lines under SHORT_MS; else the median change."""
    level = median(logs.tolist())
    if int((inv > 1.0 / SHORT_MS).sum()) < MIN_SHORT:
        return Drift(level)
    ratio, share = np.exp(logs), math.exp(level)
    per_call = 0.0
    for _ in range(3):
        per_call = _weighted_median((ratio - share) / inv, inv)  # min sum |r - p x| = sum x |r / x - p|
        share = median((ratio - per_call * inv).tolist())
    return Drift(math.log(share), per_call) if share > 0 else Drift(level)


def drift_at(drifts: list[Drift], where: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Each line's drift: drifts[where] at its 1 / ms."""
    return _log_drift(np.array([d.level for d in drifts])[where], np.array([d.per_call for d in drifts])[where], inv)


def _log_drift(level, per_call, inv):
    """log(exp(level) + per_call * inv), elementwise (the level itself where there is no time per call)."""
    if not np.any(per_call):
        return level + 0.0 * inv
    return np.log(np.maximum(np.exp(level) + per_call * inv, 1e-9))


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def _first_seen(ids: np.ndarray) -> list[int]:
    """The distinct values of ids in the order they first occur (the order the lines came in)."""
    values, first = np.unique(ids, return_index=True)
    return values[np.argsort(first)].tolist()


@dataclass
class Measured:
    """What judge decides of Columns with each line's noise: the drift, each line's noise (raised
    to its class's floor), corrected log change, z, p-value and significance."""

    drift: dict[tuple, Drift]
    count: dict[tuple, int]
    noises: list[Noise]
    dc: list[float]
    z: list[float]
    p: list[float]
    significant: list[bool]


def measure(c: Columns, noises: list[Noise], q: float, across: bool = False) -> Measured:
    """Each line's change (see the module docstring) and its family's decision at rate q. numpy's
    +, -, *, / and sqrt round as Python's do (the same floats as line by line); log and expm1 stay
    math's, in the callers."""
    drift, count, floor = ({}, {}, {}) if across else machine_drift(c)
    sigma = np.array([n.sigma for n in noises], dtype=float)
    if floor:
        low = np.array([floor.get(k, 0.0) for k in range(c.classes)])[c.klass]
        raised = np.flatnonzero(low > sigma).tolist()
        if raised:
            noises = list(noises)
            for i in raised:
                noises[i] = _evolve(noises[i], sigma=float(low[i]))
            sigma[raised] = low[raised]
    fitted = [drift.get(w, NO_DRIFT) for w in c.wheres] or [NO_DRIFT]
    dc = c.logs - drift_at(fitted, c.where, c.inv)
    var = _variances(c.spread_a, sigma) + _variances(c.spread_b, sigma)
    z = (dc / np.sqrt(var)).tolist()
    ps = p_values(z, np.array([n.n for n in noises], dtype=float) + PRIOR_WEIGHT)  # each Noise.df
    return Measured(drift, count, noises, dc.tolist(), z, ps, decide(ps, z, c.gates, q))


def decide(ps: list[float], z: list[float], gates: np.ndarray, q: float) -> list[bool]:
    """Which lines are significant, from their two-sided p-values and signs. The gate's family (`gates`)
    asks two one-sided questions, which lines got slower and which faster, each over the whole family
    at q/2: Benjamini-Hochberg's bar rises with its rejections, so one question must not lower the
    other's (a commit's many real speed-ups would pass a slowdown of noise: H200, fb7d83b -> 5b9bd58,
    57 improvements let a +5.5% of a 20 us series through, within the range of its 16 runs before,
    0.0200-0.0226 ms). With every line unchanged either way stays within q, and a lone change is decided
    as before. The other lines are one two-sided family at q."""
    p, sign = np.asarray(ps, dtype=float), np.sign(np.asarray(z, dtype=float))
    significant = np.zeros(len(p), dtype=bool)
    family = np.flatnonzero(gates)
    for way in (1.0, -1.0):
        one = np.where(sign[family] == way, p[family] / 2, 1 - p[family] / 2)
        significant[family] |= np.array(fdr(one.tolist(), q / 2), dtype=bool).reshape(-1)
    rest = np.flatnonzero(~np.asarray(gates, dtype=bool))
    significant[rest] = fdr(p[rest].tolist(), q)
    return significant.tolist()


def _variances(spreads: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """point_variance of each point (its spread), with its sigma, in the same operations."""
    n, own, k, rss = spreads[:, 0], spreads[:, 1], spreads[:, 2], spreads[:, 3]
    prior = PRIOR_WEIGHT * sigma * sigma
    var = np.maximum((prior + own) / (PRIOR_WEIGHT + n - 1), (prior + rss) / (PRIOR_WEIGHT + k))
    return var * np.where(n <= 2, 1.0, math.pi / 2) / n


def can_gate(ln: Line, env: str | None | bool = False) -> bool:
    """The family whose lines can fail the gate: ours, code changed or unknown, measured alike
    (one method, machine and environment) on a GPU, both points from runs that finished. `env`:
    its env_change, where the caller has it."""
    return gating(ln.ours, ln.code, ln.b.gpu, env_change(ln) if env is False else env,
                  ln.a.point.partial or ln.b.point.partial)


def gating(ours: bool, code: str, gpu: str, env: str | None, partial: bool) -> bool:
    """can_gate of a line's facts (partial: either point is from unfinished runs only)."""
    return ours and code in (CHANGED, UNKNOWN) and gpu != "cpu" and not env and not partial


def verdict_of(ln: Line, significant: bool, log_t: float) -> Line:
    """The line with its verdict, from its corrected change, whether its family found it
    significant, and what changed (see the module docstring); the history's persistence test names
    its steps with it too."""
    return _named(_evolve(ln), significant, log_t, env_change(ln))


def _named(ln: Line, significant: bool, log_t: float, env: str | None) -> Line:
    """verdict_of, written into a line just made (no one else holds it yet: judge makes a
    million), env its env_change."""
    ln.__dict__.update(note=note_of(ln.note, env, ln.code), verdict=verdict_name(
        ln.corrected, significant, log_t, env, ln.code, ln.ours, ln.a.point.partial or ln.b.point.partial))
    return ln


def note_of(note: str, env: str | None, code: str) -> str:
    """A line's note with what else changed (env: its env_change)."""
    return "; ".join(x for x in (note, env and f"environment: {env}",
                                 code == METHOD and "method changed (inputs, what is measured or how it is timed)") if x)


def verdict_name(corrected: float, significant: bool, log_t: float, env: str | None, code: str, ours: bool,
                 partial: bool) -> str:
    """The verdict of a line (see the module docstring) from its facts: its corrected change,
    whether its family found it significant, its threshold's log1p, what else changed, its code,
    whether it is ours, and whether either point is from unfinished runs only."""
    if is_same(corrected, log_t):
        return "same"
    dc = math.log1p(corrected)
    if not significant:
        return "within noise"
    slower = dc > 0
    if code == METHOD:
        return "method changed"
    if env:
        mine = ours and code in (CHANGED, UNKNOWN) and slower
        return WITH_ENV if mine else "environment changed"
    if not ours or code == UNCHANGED:
        return "moved"
    if partial and slower:
        return "partial run"
    return "regression" if slower else "improvement"


def is_same(corrected: float, log_t: float) -> bool:
    """A corrected change below the threshold (log_t: its log1p), whatever its significance."""
    return abs(math.log1p(corrected)) < log_t


def judge(lines: list[Line], threshold_of: Callable[[str], float], q: float = Q,
          across: bool = False) -> Comparison:
    """Every line's verdict (see the module docstring). `threshold_of(kernel)`: its relative
    threshold; `across`: the sides are two GPUs, so changes are 'slower'/'faster' by the threshold
    alone and nothing gates."""
    alive = None  # _alive(lines), where a line is newly failing
    timed = [i for i, ln in enumerate(lines) if ln.a.point and ln.b.point and "unstable" not in (ln.a.status, ln.b.status)
             and (across or not conditions_differ(ln))]
    envs = [env_change(lines[i]) for i in timed]  # each asked once: every step below reads them
    logs = [log_change(lines[i]) for i in timed]
    default = combine(None, 0, None)  # no history: the default noise, and few degrees of freedom
    m = measure(columns([lines[i] for i in timed], envs, logs), [lines[i].noise or default for i in timed], q, across)
    out = list(lines)
    for k, i in enumerate(timed):
        out[i] = _evolve(lines[i], change=math.expm1(logs[k]), corrected=math.expm1(m.dc[k]), z=m.z[k],
                         noise=m.noises[k], p=m.p[k])
    env_of = dict(zip(timed, envs))
    significant = dict(zip(timed, m.significant))
    drift, count = m.drift, m.count
    log_ts: dict[str, float] = {}  # kernel -> log1p(its threshold)
    for i, ln in enumerate(out):
        if ln.key[0] not in log_ts:
            log_ts[ln.key[0]] = math.log1p(threshold_of(ln.key[0]))
        log_t = log_ts[ln.key[0]]
        if i in significant:  # out[i] was made above: named where it lies
            out[i] = (_named(ln, significant[i], log_t, env_of[i]) if not across else
                      replace(ln, verdict="same" if abs(math.log1p(ln.change)) < log_t else
                              ("slower" if ln.change > 0 else "faster")))
        elif "unstable" in (ln.a.status, ln.b.status):
            out[i] = replace(ln, verdict="unstable")
        elif ln.a.point and ln.b.point:
            verdict, note = conditions_differ(ln)
            out[i] = replace(ln, verdict=verdict, note=note, change=math.expm1(log_change(ln)))
        elif ln.a.point and ln.b.status in FAILING:
            failing = "partial run" if ln.b.partial else "failing"
            alive = _alive(lines) if alive is None else alive
            out[i] = replace(ln, verdict=failing if _case(ln) in alive else "case failed")
        elif ln.b.point and ln.a.status in FAILING:
            out[i] = replace(ln, verdict="fixed")
    return Comparison(out, drift, count, _notes(out, drift, count))


def _alive(lines: list[Line]) -> set[tuple]:
    """The cases where some provider still has a time at B, or with one provider only: a failure
    there is that provider's; where every one of several failed, the case did (the reference out of
    memory)."""
    cases = [_case(ln) for ln in lines]
    providers: dict[tuple, int] = {}
    for case in cases:
        providers[case] = providers.get(case, 0) + 1
    return {case for case, ln in zip(cases, lines) if ln.b.point} | {c for c, n in providers.items() if n < 2}


def _case(ln: Line) -> tuple:
    return (ln.key[0], ln.key[1], ln.key[3], ln.key[4], ln.b.gpu, ln.b.machine)


def _notes(lines: list[Line], drift: dict[tuple, Drift], count: dict[tuple, int]) -> list[str]:
    notes = []
    for (gpu, machine), d in sorted(drift.items(), key=lambda kv: str(kv[0])):
        where = f" on {gpu}" + (f" ({machine})" if machine else "") if len(drift) > 1 else ""
        per_call = (f" and {d.per_call * 1000:+.2f} us a call ({math.expm1(d.at(100.0)):+.2%} at 10 us)"
                    if d.per_call else "")
        notes.append(f"machine drift{where} {math.expm1(d.level):+.2%}{per_call} (fitted to "
                     f"{count[(gpu, machine)]} series whose code did not change); changes are corrected for it")
    envs = sorted({env_change(ln) for ln in lines if ln.verdict in ("environment changed", WITH_ENV)})
    if envs:
        notes.append(f"environment changed ({'; '.join(envs)}): a move of those series is the environment's; a "
                     "slowdown of ours whose code changed too is shown 'changed with the environment: confirm'; "
                     "`--confirm` measures both commits here in one environment")
    partial = sum(ln.b.partial or ln.a.partial for ln in lines)
    if partial:
        notes.append(f"{partial} series come from runs that were interrupted or did not finish (partial runs): "
                     "a slowdown there is shown 'partial run: confirm' and never fails on its own")
    cpu = sum(ln.a.gpu == "cpu" for ln in lines)
    if cpu:
        notes.append(f"{cpu} CPU (interpreted) series are shown but never decide the exit status")
    return notes


def compare(a_rows: list[dict], b_rows: list[dict], threshold_of: Callable[[str], float], where_in_key: bool,
            noise_of: Callable[[SeriesKey], Noise | None], code_of: Callable[[str, bool, str | None, str | None], str],
            across: bool = False, q: float = Q) -> Comparison:
    """The series present on both sides, with their verdicts. `noise_of(series key)`: the series'
    noise from its history (None: unknown); `code_of(kernel, ours, commit a, commit b)`: CHANGED,
    UNCHANGED, METHOD or UNKNOWN for that provider's code of that kernel between the sides
    (regress.code_status)."""
    sa, sb = sides(a_rows, where_in_key), sides(b_rows, where_in_key)
    lines = []
    for key in sorted(sa.keys() & sb.keys(), key=lambda k: tuple(str(x) for x in k)):
        (a, ours_a), (b, ours_b) = sa[key], sb[key]
        ours = ours_a or ours_b
        code = code_of(key[0], ours, a.commit, b.commit)
        noise = noise_of(SeriesKey(*key[:5], b.gpu, b.machine, b.timing))
        lines.append(Line(key=key[:5], a=a, b=b, code=code, verdict="n/a", ours=ours, noise=noise))
    return judge(lines, threshold_of, q, across)
