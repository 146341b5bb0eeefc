"""The site's view of the verdict engine: the flags of every GPU series, their state today, and the
changes of measuring conditions (timing method, machine, software, method of measurement), which are
reported as such and never as a change of a kernel.

The flags are regress.analyse's, the history walked with the same verdicts as `kcollect compare`
(the site and compare cannot disagree: tests/test_replay.py checks it on the committed history).
This module only maps them onto the site's groups, commit indexes and measuring conditions
(site_data.COND_SQL), and adds what a page needs: a regression is 'ended' when its case is no longer
measured, an improvement that brings a series back to where a regression left it 'undoes' it.

A regression of ours (`ours` in a flag) is a step of our code: a provider of ours whose code
changed there (or git could not tell). Steps that something else explains are changes of conditions:
the environment (a move across it is listed with the change, and for ours whose code changed in the
same commit 'our code changed too: confirm'), or the method of measurement (how the inputs are drawn
or what is measured changed in the kernel's spec). Where a series' timing method or machine changes,
its level's move across the boundary is listed as such (boundaries()).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from . import codechange, regress
from .series import full_commits
from .site_data import ENV_FIELDS, SiteData

PERSIST = 3  # points on each side of a change of conditions that set the level there
DEFAULT_THRESHOLD = 0.05  # relative change below which a move across a change of conditions is noise


@dataclass
class Analysis:
    flags: list[dict[str, Any]]  # every step of every GPU series, with its state
    noise: dict[tuple, float | None]  # series key (with condition) -> relative noise
    changes: list[dict[str, Any]]  # series that moved where their measuring condition changed
    events: list[dict[str, Any]]  # changes of condition per commit, counting the series they touched


def flag_id(key: tuple, commit: str) -> str:
    return hashlib.sha1("|".join(map(str, (*key, commit))).encode()).hexdigest()[:10]


def analyse(data: SiteData, thresholds: dict[str, float] | None = None, git_root: str | Path | None = ".") -> Analysis:
    """Flags, noise and changes of conditions of every GPU series. `thresholds`: kernel -> relative
    threshold (regress.DEFAULT_THRESHOLD otherwise); `git_root`: the checkout whose history says
    whose code changed (None: git is not asked, and our code counts as changed at every commit)."""
    code = codechange.Repo(git_root) if git_root is not None else None
    analysed = regress.walk(data.series, data.ours, thresholds, code)
    out = Analysis([], {}, [], [])
    index = _commit_index(data)
    trends = _trend_index(data)
    confirm: dict[tuple, str] = {}
    for key, r in analysed.items():
        if key.gpu == "cpu":  # CPU-interpreter timings say nothing about speed on a GPU
            continue
        gkey = f"cuda:{key.gpu}"
        at = index.get(gkey, {})
        ci = [at.get(p.commit) for p in r.points]
        if any(c is None for c in ci):
            continue
        conds = trends.get((gkey, key.kernel, key.mode, key.dtype, key.provider, key.shape), {})
        for cond in {c for c, (machine, timing) in conds.items() if (machine, timing) == (key.machine, key.timing)}:
            out.noise[(gkey, key.kernel, key.mode, key.dtype, key.provider, key.shape, cond)] = r.noise.sigma
        regressions: list[tuple[float, dict]] = []
        values = [p.median_ms for p in r.points]  # one list for the series' flags (and the cache's pickle)
        # the machine's level at each commit of the series, which the flags' levels are corrected for
        drift = dict(zip(ci, r.drift)) if r.flags else {}
        for f in r.flags:
            cond = next((c for c, mt in conds.items() if mt == (key.machine, key.timing)), None)
            row = _flag(data, key, r, f, ci, gkey, cond, regressions, values)
            row["drift"] = drift
            if f.cause and (f.cause.startswith("environment") or f.cause.startswith("method")):
                if f.cause.startswith("method"):
                    out.changes.append(_method_change(key, f, ci, gkey, data))
                else:
                    confirm[(gkey, key.kernel, key.mode, key.dtype, key.provider, key.shape, ci[f.index])] = (
                        f.cause, row)
                continue
            out.flags.append(row)
    events: dict[tuple, dict[str, Any]] = {}
    threshold_of = (thresholds or {}).get
    for b in bases(data):
        moves = boundaries(b)
        for j, move in moves:
            _change(data, b, j, move, threshold_of(b.kernel, DEFAULT_THRESHOLD), out.changes, events, confirm)
    for cause, row in confirm.values():  # a step the environment explains where the site saw no change of it
        out.changes.append({**{k: row[k] for k in ("gkey", "kernel", "mode", "dtype", "provider", "shape", "before_ci",
                                                   "after_ci", "before_ms", "after_ms", "change", "machine")},
                            "kind": "environment", "what": cause, "ours": "confirm" in cause})
    for ev in events.values():
        ev["kernels"] = sorted(ev["kernels"])
    out.events = sorted(events.values(), key=lambda e: (e["gkey"], -e["ci"], e["kind"]))
    return out


def _commit_index(data: SiteData) -> dict[str, dict[str, int]]:
    """gkey -> commit (as the engine names it, and as stored) -> its index in the group's commits."""
    out: dict[str, dict[str, int]] = {}
    for g in data.groups:
        full = full_commits(c["sha"] for c in g.commits)
        at = out.setdefault(g.key, {})
        for i, c in enumerate(g.commits):
            at[full.get(c["sha"], c["sha"])] = i
            at[c["sha"]] = i
    return out


def _trend_index(data: SiteData) -> dict[tuple, dict[int, tuple]]:
    """(gkey, kernel, mode, dtype, provider, shape) -> {condition id: (machine, timing)}."""
    out: dict[tuple, dict[int, tuple]] = {}
    for (gkey, kernel, mode, dtype), providers in data.exact_trends.items():
        for provider, shapes in providers.items():
            for shape, (_, _, _, _, cond) in shapes.items():
                out[(gkey, kernel, mode, dtype, provider, shape)] = {
                    c: (data.conditions[c]["machine"], data.conditions[c]["timing"]) for c in set(cond)}
    return out


def _flag(data: SiteData, key, r: regress.SeriesResult, f: regress.Flag, ci: list[int], gkey: str, cond,
          regressions: list, values: list[float]) -> dict[str, Any]:
    last_ci = data.last_ci.get((gkey, key.kernel, key.shape, key.dtype))
    ended = f.status == "open" and last_ci is not None and ci[-1] < last_ci
    if f.kind == "regression":
        state = "recovered" if f.status == "recovered" else ("ended" if ended else "open")
    else:
        state = "lost" if f.status == "recovered" else "held"
    commits = data.group(gkey).commits
    row = {"id": flag_id((gkey, *key[:5], cond), commits[ci[f.index]]["sha"]), "kind": f.kind, "state": state,
           "ours": r.ours and f.cause is None, "mine": r.ours, "gkey": gkey, "kernel": key.kernel, "mode": key.mode,
           "dtype": key.dtype, "provider": key.provider, "shape": key.shape, "cond": cond, "machine": key.machine,
           "timing": key.timing, "before_ci": ci[f.index - 1], "after_ci": ci[f.index],
           "end_ci": ci[f.recovered_index] if f.recovered_index is not None else None, "before_ms": f.before_ms,
           "after_ms": f.after_ms, "change": f.change, "z": f.noise_sigmas, "noise": r.noise.sigma,
           "values": values, "step_at": f.index, "undoes": None, "cause": f.cause,
           "by_gate": f.by_gate, "decided_ci": ci[f.decided_index], "p": f.p}
    mid = (math.log(f.before_ms) + math.log(f.after_ms)) / 2
    if f.kind == "regression":
        regressions.append((mid, row))
    else:  # an improvement back to where the series was before a regression is its fix
        row["undoes"] = next((reg["after_ci"] for reg_mid, reg in reversed(regressions)
                              if math.log(f.after_ms) <= reg_mid), None)
    return row


def _method_change(key, f: regress.Flag, ci: list[int], gkey: str, data: SiteData) -> dict[str, Any]:
    return {"kind": "method", "what": "how the inputs are drawn or what is measured changed (the kernel's spec)",
            "gkey": gkey, "kernel": key.kernel, "mode": key.mode, "dtype": key.dtype, "provider": key.provider,
            "shape": key.shape, "before_ci": ci[f.index - 1], "after_ci": ci[f.index], "before_ms": f.before_ms,
            "after_ms": f.after_ms, "change": f.change, "machine": key.machine, "ours": False}


# -- changes of timing method, machine or software across a series' conditions -----------------------


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
    cond: list[int]


def bases(data: SiteData):
    """Every GPU series as the site's trends hold it (CPU-interpreter timings are not analysed)."""
    for (gkey, kernel, mode, dtype), providers in data.exact_trends.items():
        if data.group(gkey).kind != "gpu":
            continue
        for provider, shapes in providers.items():
            for shape, (ci, med, _, _, cond) in shapes.items():
                yield Base(gkey, kernel, mode, dtype, provider, shape, ci, med, cond)


def _level(values: list[float]) -> float:
    return median(math.log(v) for v in values)


def boundaries(b: Base) -> list[tuple[int, float]]:
    """[(index of the first point under a new condition, relative move of the level there)]: the
    median of up to PERSIST points of the old condition before it against as many of the new one."""
    out = []
    for j in range(1, len(b.ci)):
        if b.cond[j] != b.cond[j - 1]:
            before, after = _around(b, j)
            out.append((j, math.exp(_level(after) - _level(before)) - 1))
    return out


def _around(b: Base, j: int) -> tuple[list[float], list[float]]:
    """The values of up to PERSIST points of the old condition before j and of the new one from j,
    in point order: found by walking out from j (a long history has many changes of condition)."""
    old, new = b.cond[j - 1], b.cond[j]
    before = []
    for k in range(j - 1, -1, -1):
        if len(before) == PERSIST:
            break
        if b.cond[k] == old:
            before.append(b.med[k])
    after = []
    for k in range(j, len(b.cond)):
        if len(after) == PERSIST:
            break
        if b.cond[k] == new:
            after.append(b.med[k])
    return before[::-1], after


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


def _change(data: SiteData, b: Base, j: int, move: float, threshold: float, changes: list, events: dict,
            confirm: dict) -> None:
    """Counts one series' change of conditions in its event, and lists the series where its level
    moved by the threshold or more (or where the engine found a slowdown of ours whose code changed
    in the same commit: 'confirm')."""
    kind, text = describe(data.conditions[b.cond[j - 1]], data.conditions[b.cond[j]])
    ev = events.setdefault((b.gkey, b.ci[j], kind, text), {
        "gkey": b.gkey, "ci": b.ci[j], "before_ci": b.ci[j - 1], "kind": kind, "what": text,
        "series": 0, "moved": 0, "kernels": set()})
    # the latest commit before the change that any of its series was measured at, whatever order
    # the series come in (the first series' own one made the event differ between builds)
    ev["before_ci"] = max(ev["before_ci"], b.ci[j - 1])
    ev["series"] += 1
    ev["kernels"].add(b.kernel)
    cause = confirm.pop((b.gkey, b.kernel, b.mode, b.dtype, b.provider, b.shape, b.ci[j]), ("",))[0]
    if abs(move) < threshold and "confirm" not in cause:
        return
    ev["moved"] += 1
    before, after = _around(b, j)
    what = text + ("; our code changed in the same commit: changed with the environment, confirm"
                   if "confirm" in cause else "")
    changes.append({"kind": kind, "what": what, "gkey": b.gkey, "kernel": b.kernel, "mode": b.mode,
                    "dtype": b.dtype, "provider": b.provider, "shape": b.shape, "before_ci": b.ci[j - 1],
                    "after_ci": b.ci[j], "before_ms": math.exp(_level(before)), "after_ms": math.exp(_level(after)),
                    "change": move, "machine": data.conditions[b.cond[j]]["machine"], "ours": "confirm" in cause})
