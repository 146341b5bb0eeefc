"""The regression analysis behind the site: steps per series, their state today (open, recovered,
no longer measured), and changes of measuring conditions (timing method, machine, software), which
are reported as such and never as a change of a kernel.

A series here is (group, kernel, mode, dtype, provider, shape) under one measuring condition (see
site_data.COND_SQL): the points of a series that changed its timing method, machine or software
form one series per condition, so no step can ever span such a change. Where two conditions meet,
the level's move across the boundary is reported, labelled with what changed. Where that move is
small (under the threshold), the later points still say whether an earlier regression is open:
a torch upgrade that left a kernel's time alone does not close its regression.

Pure functions over SiteData's exact trend points. The step detector itself is collector/regress.py,
reached only through `detect_steps` below.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import median
from typing import Any

from .site_data import ENV_FIELDS, SiteData

PERSIST = 3  # points that set a level now (and on each side of a change of conditions)
OURS = "triton"  # our kernels' provider: the regressions a visitor must see first
DEFAULT_THRESHOLD = 0.05  # relative change below which a move across a change of conditions is noise


@dataclass(frozen=True)
class Step:
    kind: str  # 'regression' (slower) or 'improvement' (faster)
    index: int  # the first point after the step
    before_ms: float
    after_ms: float
    change: float  # after / before - 1
    z: float  # the step in standard errors of the difference of the two levels


# -- the one place that calls collector/regress.py -----------------------------------------
# It takes one series' points and answers its steps and its noise (the relative run-to-run spread
# of one point). When regress.py grows an API that keeps "regressed at X, recovered at Y" and
# measures noise per series itself, this adapter is what changes.


def detect_steps(ci: list[int], med: list[float], p20: list[float], p80: list[float],
                 threshold: float | None = None) -> tuple[list[Step], float | None]:
    from . import regress

    points = [regress.Point(commit=str(c), commit_time=None, median_ms=m, p20_ms=lo, p80_ms=hi, runs=1)
              for c, m, lo, hi in zip(ci, med, p20, p80)]
    flags = regress.detect(points, regress.DEFAULT_THRESHOLD if threshold is None else threshold)
    noise = regress.series_noise(points, flags) if len(points) > 1 else None
    return [Step(kind=f.kind, index=f.index, before_ms=f.before_ms, after_ms=f.after_ms, change=f.change,
                 z=f.noise_sigmas) for f in flags], (noise.sigma if noise else None)


# -- one series across its conditions ---------------------------------------------------------


@dataclass
class Base:
    """One (group, kernel, mode, dtype, provider, shape) with all its points, in commit order."""
    gkey: str
    kernel: str
    mode: str
    dtype: str
    provider: str
    shape: str
    ci: list[int]
    med: list[float]
    p20: list[float]
    p80: list[float]
    cond: list[int]

    def key(self, cond: int) -> tuple:
        return (self.gkey, self.kernel, self.mode, self.dtype, self.provider, self.shape, cond)

    def part(self, cond: int) -> list[int]:
        """Indexes of the points measured under one condition."""
        return [j for j, k in enumerate(self.cond) if k == cond]


def bases(data: SiteData):
    """Every GPU series. CPU-interpreter timings are not analysed: they say nothing about speed on a
    GPU, so a flag there is noise."""
    for (gkey, kernel, mode, dtype), providers in data.exact_trends.items():
        if data.group(gkey).kind != "gpu":
            continue
        for provider, shapes in providers.items():
            for shape, (ci, med, p20, p80, cond) in shapes.items():
                yield Base(gkey, kernel, mode, dtype, provider, shape, ci, med, p20, p80, cond)


def _level(values: list[float]) -> float:
    return median(math.log(v) for v in values)


def boundaries(b: Base) -> list[tuple[int, float]]:
    """[(index of the first point under a new condition, relative move of the level there)]: the
    median of up to PERSIST points of the old condition before it against as many of the new one."""
    out = []
    for j in range(1, len(b.ci)):
        if b.cond[j] != b.cond[j - 1]:
            before = [m for m, k in zip(b.med[:j], b.cond[:j]) if k == b.cond[j - 1]][-PERSIST:]
            after = [m for m, k in zip(b.med[j:], b.cond[j:]) if k == b.cond[j]][:PERSIST]
            out.append((j, math.exp(_level(after) - _level(before)) - 1))
    return out


def continued(b: Base, idx: list[int], moves: list[tuple[int, float]], threshold: float) -> list[int]:
    """The indexes of one condition's points, followed by the later points of the series up to the
    first change of conditions that moved the level by the threshold or more."""
    stop = next((j for j, move in moves if j > idx[-1] and abs(move) >= threshold), len(b.ci))
    return idx + list(range(idx[-1] + 1, stop))


# -- flags and their state today -------------------------------------------------------------


def flag_id(key: tuple, commit: str) -> str:
    return hashlib.sha1("|".join(map(str, (*key, commit))).encode()).hexdigest()[:10]


def state(ci: list[int], med: list[float], step: Step, last_ci: int | None) -> tuple[str, int | None]:
    """(state, index where it ended) of one step, given the series' points (continued past its
    condition where that moved nothing): a regression is 'open' while the level now (the median of
    the last PERSIST points) stays on the slow side of halfway between the levels before and after
    it, 'recovered' once it is back on the fast side (from the first point after which it stays
    there), and 'ended' when the series is no longer measured (the latest run of its case has no
    point of it). An improvement is 'held' or 'lost' alike."""
    mid = (math.log(step.before_ms) + math.log(step.after_ms)) / 2
    sign = 1 if step.kind == "regression" else -1
    logs = [math.log(v) for v in med]
    if (median(logs[-PERSIST:]) - mid) * sign <= 0:  # back on the other side of halfway
        return ("recovered" if step.kind == "regression" else "lost"), _back_at(logs, mid, sign, step.index)
    if last_ci is not None and ci[-1] < last_ci:
        return "ended", None
    return ("open" if step.kind == "regression" else "held"), None


def _back_at(logs: list[float], mid: float, sign: int, start: int) -> int:
    """The first point from which the series stays back: after the last window of PERSIST points
    whose median is still on the step's side, the first point that is itself back."""
    stuck = [k for k in range(start, len(logs) - PERSIST + 1) if (median(logs[k:k + PERSIST]) - mid) * sign > 0]
    j = stuck[-1] + 1 if stuck else start
    while j < len(logs) - 1 and (logs[j] - mid) * sign > 0:
        j += 1
    return j


@dataclass
class Analysis:
    flags: list[dict[str, Any]]  # every step of every GPU series, with its state
    noise: dict[tuple, float | None]  # series key (with condition) -> relative noise
    changes: list[dict[str, Any]]  # series that moved where their measuring condition changed
    events: list[dict[str, Any]]  # changes of condition per commit, counting the series they touched


def analyse(data: SiteData, thresholds: dict[str, float] | None = None) -> Analysis:
    thresholds = thresholds or {}  # kernel -> relative threshold; the store does not hold them yet
    out = Analysis([], {}, [], [])
    events: dict[tuple, dict[str, Any]] = {}
    for b in bases(data):
        threshold = thresholds.get(b.kernel, DEFAULT_THRESHOLD)
        moves = boundaries(b)
        for cond in dict.fromkeys(b.cond):
            idx = b.part(cond) if moves else list(range(len(b.ci)))
            pick = (lambda arr: [arr[j] for j in idx]) if moves else (lambda arr: arr)
            steps, out.noise[b.key(cond)] = detect_steps(pick(b.ci), pick(b.med), pick(b.p20), pick(b.p80),
                                                         thresholds.get(b.kernel))
            if steps:
                out.flags += _flags(data, b, cond, steps, out.noise[b.key(cond)],
                                    continued(b, idx, moves, threshold) if moves else idx)
        for j, move in moves:
            _change(data, b, j, move, threshold, out.changes, events)
    for ev in events.values():
        ev["kernels"] = sorted(ev["kernels"])
    out.events = sorted(events.values(), key=lambda e: (e["gkey"], -e["ci"], e["kind"]))
    return out


def _flags(data: SiteData, b: Base, cond: int, steps: list[Step], noise: float | None,
           ext: list[int]) -> list[dict[str, Any]]:
    """The flags of one series' steps; `ext`: the indexes of its points, continued (see above)."""
    ci, med = [b.ci[j] for j in ext], [b.med[j] for j in ext]
    last_ci = data.last_ci.get((b.gkey, b.kernel, b.shape, b.dtype))
    commits = data.group(b.gkey).commits
    out, regressions = [], []
    for step in steps:
        st, end = state(ci, med, step, last_ci)
        before, after = ci[step.index - 1], ci[step.index]
        f = {"id": flag_id(b.key(cond), commits[after]["sha"]), "kind": step.kind, "state": st,
             "ours": b.provider == OURS, "gkey": b.gkey, "kernel": b.kernel, "mode": b.mode, "dtype": b.dtype,
             "provider": b.provider, "shape": b.shape, "cond": cond, "machine": data.conditions[cond]["machine"],
             "timing": data.conditions[cond]["timing"], "before_ci": before, "after_ci": after,
             "end_ci": ci[end] if end is not None else None, "before_ms": step.before_ms,
             "after_ms": step.after_ms, "change": step.change, "z": step.z, "noise": noise,
             "values": med, "step_at": step.index, "undoes": None}
        mid = (math.log(step.before_ms) + math.log(step.after_ms)) / 2
        if step.kind == "regression":
            regressions.append((mid, f))
        else:  # an improvement back to where the series was before a regression is its fix
            f["undoes"] = next((r["after_ci"] for r_mid, r in reversed(regressions)
                                if math.log(step.after_ms) <= r_mid), None)
        out.append(f)
    return out


# -- changes of measuring conditions ----------------------------------------------------------


def describe(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, str]:
    """(kind, text) of what differs between two conditions: 'method', 'machine' or 'environment'."""
    if a["timing"] != b["timing"]:
        return "method", f"timing method {a['timing'] or '?'} → {b['timing'] or '?'}"
    if a["machine"] != b["machine"]:
        return "machine", f"machine {a['machine'] or '(not recorded)'} → {b['machine'] or '(not recorded)'}"
    parts = [f"{f} {a[f] or '?'} → {b[f] or '?'}" for f in ENV_FIELDS if a[f] != b[f]]
    pa, pb = a["peers"], b["peers"]
    parts += [f"{p} {pa.get(p, '(none)')} → {pb.get(p, '(none)')}" for p in sorted(set(pa) | set(pb))
              if pa.get(p) != pb.get(p)]
    return "environment", ", ".join(parts) or "environment"


def _change(data: SiteData, b: Base, j: int, move: float, threshold: float, changes: list, events: dict) -> None:
    """Counts one series' change of conditions in its event, and lists the series where its level
    moved by the threshold or more."""
    kind, text = describe(data.conditions[b.cond[j - 1]], data.conditions[b.cond[j]])
    ev = events.setdefault((b.gkey, b.ci[j], kind, text), {
        "gkey": b.gkey, "ci": b.ci[j], "before_ci": b.ci[j - 1], "kind": kind, "what": text,
        "series": 0, "moved": 0, "kernels": set()})
    ev["series"] += 1
    ev["kernels"].add(b.kernel)
    if abs(move) < threshold:
        return
    ev["moved"] += 1
    before = [m for m, k in zip(b.med[:j], b.cond[:j]) if k == b.cond[j - 1]][-PERSIST:]
    after = [m for m, k in zip(b.med[j:], b.cond[j:]) if k == b.cond[j]][:PERSIST]
    changes.append({"kind": kind, "what": text, "gkey": b.gkey, "kernel": b.kernel, "mode": b.mode,
                    "dtype": b.dtype, "provider": b.provider, "shape": b.shape, "before_ci": b.ci[j - 1],
                    "after_ci": b.ci[j], "before_ms": math.exp(_level(before)), "after_ms": math.exp(_level(after)),
                    "change": move, "machine": data.conditions[b.cond[j]]["machine"]})
