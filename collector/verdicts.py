"""The verdicts of `kcollect compare`, as pure functions of the two sides' rows (no I/O, no git).

One line per series present on both sides. A change of ours is significant when it exceeds both
the relative threshold and COMPARE_Z standard errors of the difference of the two points, the
standard error coming from the series' run-to-run noise measured from its history (kcollect.noise,
never below what today's pair of runs shows for like series). Before that, the change is corrected
for the machine's drift between the two sides: the median change of the series whose code did not
change (every provider but ours, and ours where git says its kernel was not touched).

What is never a regression, whatever the numbers:
- a series whose code did not change between the two sides (it informs the drift and the noise);
- a change of timing method, environment (torch, Triton, driver, CUDA, peer versions) or machine:
  reported as such;
- a row disturbed while timed (status 'unstable'): not compared;
- a case that failed for every provider at B (the reference out of memory, say): not our kernel's;
- CPU (interpreted) rows: shown, but they never decide the exit status.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from statistics import median
from typing import Callable, Iterable

from .noise import MAD_TO_SIGMA, Noise, duration_class
from .regress import MIN_REFERENCES, Point, SeriesKey, describe_env_change, device, points_from_rows

MATCH = ("kernel", "mode", "provider", "shape", "dtype")
COMPARE_Z = 4.0  # one pair of points and no persistence to lean on: stricter than the history's detector
FAILING = ("failed", "error")  # a newly failing gate or crash is a regression; 'unavailable' is not
GATING = ("regression", "failing")
MARK = {"regression": "REGRESSION", "failing": "NOW FAILING", "improvement": "faster", "fixed": "fixed",
        "within noise": "no (noise)", "same": "no", "moved": "moved, code unchanged",
        "unstable": "unstable, not compared", "timing changed": "timing method changed",
        "environment changed": "environment changed", "other machine": "other machine",
        "case failed": "every provider failed", "slower": "slower", "faster": "faster", "not confirmed": "not confirmed", "n/a": "-"}


@dataclass(frozen=True)
class Side:
    """One series on one side: its point (None without an 'ok' row) and what it was measured with."""

    point: Point | None
    status: str  # 'ok', 'unstable', or the latest row's status
    timing: str | None
    gpu: str
    machine: str | None


@dataclass(frozen=True)
class Line:
    key: tuple  # MATCH values
    a: Side
    b: Side
    code: str  # 'changed', 'unchanged' or 'unknown' (git could not tell: treated as changed)
    verdict: str
    noise: Noise | None = None
    change: float | None = None  # b / a - 1, as measured
    corrected: float | None = None  # the change with the machine drift removed
    z: float | None = None  # the corrected change in standard errors
    note: str = ""

    @property
    def gates(self) -> bool:
        """Whether this line fails the gate: ours (or unknown), on a GPU, regressed or newly failing."""
        return self.verdict in GATING and self.code != "unchanged" and self.a.gpu != "cpu" and self.b.gpu != "cpu"


@dataclass(frozen=True)
class Comparison:
    lines: list[Line]
    drift: float | None  # log b/a of the series whose code did not change (None: too few of them)
    drift_series: int
    notes: list[str]


def sides(rows: Iterable[dict], where_in_key: bool) -> dict[tuple, Side]:
    """Rows of one side -> {match key: Side}. With where_in_key (a comparison of commits) the GPU and
    machine are part of the key; otherwise (two runs, two GPUs) they are the side's attributes. Where a
    side holds several timing methods of one series, its latest run's counts."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = tuple(r[c] for c in MATCH) + ((device(r), r.get("machine")) if where_in_key else ())
        groups.setdefault(key, []).append(r)
    out = {}
    for key, group in groups.items():
        latest = max(group, key=lambda r: r.get("started_at") or datetime.min)
        group = [r for r in group if r.get("timing") == latest.get("timing") or r.get("status") != "ok"]
        points = points_from_rows(group)
        statuses = {r.get("status") for r in group}
        status = "ok" if points else ("unstable" if "unstable" in statuses else latest.get("status"))
        out[key] = Side(points[0] if points else None, status, latest.get("timing"), device(latest),
                        latest.get("machine"))
    return out


def _what_differs(a: Side, b: Side) -> tuple[str, str] | None:
    """(verdict, note) when the two points were not measured alike, else None."""
    if a.timing != b.timing:
        return "timing changed", f"timing {a.timing} -> {b.timing}"
    if (a.gpu, a.machine) != (b.gpu, b.machine):
        return "other machine", f"{a.gpu} {a.machine or ''} -> {b.gpu} {b.machine or ''}".replace("  ", " ")
    if a.point.env and b.point.env and a.point.env != b.point.env:
        return "environment changed", describe_env_change(a.point.env, b.point.env)
    return None


def _drift_and_pair_noise(pairs: list[tuple[Line, float]]) -> tuple[float | None, int, dict[tuple, float]]:
    """From the lines whose code did not change: the median log change (the machine's drift) and,
    per (timing, duration class), the noise their scatter around it implies."""
    if len(pairs) < MIN_REFERENCES:
        return None, len(pairs), {}
    drift = median(d for _, d in pairs)
    by_class: dict[tuple, list[float]] = {}
    for ln, d in pairs:
        by_class.setdefault((ln.a.timing, duration_class(ln.a.point.median_ms)), []).append(abs(d - drift))
    noise = {c: MAD_TO_SIGMA * median(v) / math.sqrt(2) for c, v in by_class.items() if len(v) >= MIN_REFERENCES}
    return drift, len(pairs), noise


def _judge(ln: Line, drift: float | None, pair_noise: dict[tuple, float], log_t: float, across: bool) -> Line:
    a, b = ln.a.point, ln.b.point
    d = math.log(b.median_ms / a.median_ms)
    ln = replace(ln, change=math.expm1(d))
    if across:  # two GPUs: which is faster, by the threshold alone
        return replace(ln, verdict="same" if abs(d) < log_t else ("slower" if d > 0 else "faster"))
    differs = _what_differs(ln.a, ln.b)
    if differs:
        return replace(ln, verdict=differs[0], note=differs[1])
    dc = d - (drift or 0.0)
    sigma = max(ln.noise.sigma if ln.noise else 0.0,
                pair_noise.get((ln.a.timing, duration_class(a.median_ms)), 0.0)) or None
    z = abs(dc) / (sigma * math.sqrt(1 / a.runs + 1 / b.runs)) if sigma else math.inf
    ln = replace(ln, corrected=math.expm1(dc), z=z, noise=replace(ln.noise, sigma=sigma) if ln.noise and sigma else ln.noise)
    if abs(dc) < log_t:
        return replace(ln, verdict="same")
    if z < COMPARE_Z:
        return replace(ln, verdict="within noise")
    if ln.code == "unchanged":
        return replace(ln, verdict="moved")
    return replace(ln, verdict="regression" if dc > 0 else "improvement")


def compare(a_rows: list[dict], b_rows: list[dict], threshold: float, where_in_key: bool,
            noise_of: Callable[[SeriesKey], Noise | None], code_changed: Callable[[str, str], bool | None],
            across: bool = False) -> Comparison:
    """The series present on both sides, with their verdicts. `noise_of(series key)`: the series'
    noise from its history (None: unknown); `code_changed(kernel, provider)`: whether that provider's
    code for that kernel changed between the sides (None: cannot tell); `across`: the sides are two
    GPUs, so changes are 'slower'/'faster' and nothing gates."""
    sa, sb = sides(a_rows, where_in_key), sides(b_rows, where_in_key)
    lines: list[Line] = []
    unchanged: list[tuple[Line, float]] = []
    for key in sorted(sa.keys() & sb.keys(), key=lambda k: tuple(str(x) for x in k)):
        a, b = sa[key], sb[key]
        changed = code_changed(key[0], key[2])
        code = "unknown" if changed is None else ("changed" if changed else "unchanged")
        noise = noise_of(SeriesKey(*key[:5], b.gpu, b.machine, b.timing))
        ln = Line(key=key[:5], a=a, b=b, code=code, verdict="n/a", noise=noise)
        if a.point and b.point and not across and code == "unchanged" and not _what_differs(a, b):
            unchanged.append((ln, math.log(b.point.median_ms / a.point.median_ms)))
        lines.append(ln)
    drift, n_drift, pair_noise = _drift_and_pair_noise(unchanged)
    log_t = math.log1p(threshold)
    # cases (kernel, mode, shape, dtype on one GPU) where some provider still has a time at B, or
    # that have one provider only: a failure there is that provider's; where every one of several
    # failed, the case did (out of memory in the reference, say), which says nothing of our kernel
    providers: dict[tuple, int] = {}
    for ln in lines:
        providers[_case(ln)] = providers.get(_case(ln), 0) + 1
    alive = {_case(ln) for ln in lines if ln.b.point} | {c for c, n in providers.items() if n < 2}
    out = []
    for ln in lines:
        if "unstable" in (ln.a.status, ln.b.status):
            ln = replace(ln, verdict="unstable")
        elif ln.a.point and ln.b.point:
            ln = _judge(ln, drift, pair_noise, log_t, across)
        elif ln.a.point and ln.b.status in FAILING:
            ln = replace(ln, verdict="failing" if _case(ln) in alive else "case failed")
        elif ln.b.point and ln.a.status in FAILING:
            ln = replace(ln, verdict="fixed")
        out.append(ln)
    return Comparison(out, drift, n_drift, _notes(out, drift, n_drift))


def _case(ln: Line) -> tuple:
    return (ln.key[0], ln.key[1], ln.key[3], ln.key[4], ln.b.gpu, ln.b.machine)


def _notes(lines: list[Line], drift: float | None, n: int) -> list[str]:
    notes = []
    if drift is not None:
        notes.append(f"machine drift {math.expm1(drift):+.2%} (median of {n} series whose code did not change); "
                     "changes of ours are corrected for it")
    envs = sorted({ln.note for ln in lines if ln.verdict == "environment changed"})
    if envs:
        notes.append(f"environment changed ({'; '.join(envs)}): its series are reported as such, never as "
                     "a regression; `--confirm` measures both commits here in one environment")
    cpu = sum(ln.a.gpu == "cpu" for ln in lines)
    if cpu:
        notes.append(f"{cpu} CPU (interpreted) series are shown but never decide the exit status")
    return notes
