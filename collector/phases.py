"""Where a run's wall time goes, recorded per run (runs.phases, JSON {phase: seconds}).

The timed GPU work of a full grid was once 1.6% of its wall time; the rest was compile, graph
capture, references, correctness calls and Python. Each run keeps the breakdown so that overhead
is seen, not guessed, and `kcollect run` prints it at the end (`breakdown` gives the records for
`kcollect summary` as well).
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Any, Iterator

# In the order they are printed; "other" is the wall time no phase claimed (Python, bookkeeping).
PHASES = {
    "precompile": "builds made ahead in parallel processes, before anything is measured (cold caches)",
    "setup": "imports, environment, the device's ceilings",
    "inputs": "random inputs of each case",
    "reference": "float64 reference answers (once per case)",
    "first_call": "first call of each provider: torch.compile and Triton builds, autotuning",
    "check": "relative error against the reference",
    "capture": "CUDA-graph capture",
    "timing": "timed calls, warm-up and peak memory",
    "recheck": "the second, short measurement of each row (and re-measurements)",
    "recheck_fresh": "of which fresh calls and their captures, for rows whose measured call was not kept",
    "release": "freeing each case's memory and compiled graphs",
    "store": "writing rows to DuckDB",
    "timed_work": "of which device work: reps x median of every timed row",
}
# parts of other phases ("timed_work" of "timing" and "recheck", "recheck_fresh" of "recheck"),
# shown for scale, not added to the total
NOT_WALL = {"timed_work", "recheck_fresh"}


class Phases:
    """Seconds per phase. `with phases("timing"): ...` adds the block's wall time."""

    def __init__(self, started: float | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.started = time.perf_counter() if started is None else started

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def merge(self, other: dict[str, float]) -> None:
        for name, s in other.items():
            self.add(name, s)

    def total(self) -> dict[str, float]:
        """The phases with "wall" (since start) and "other" (wall minus every phase) added."""
        wall = time.perf_counter() - self.started
        claimed = sum(s for n, s in self.seconds.items() if n not in NOT_WALL)
        return {**self.seconds, "other": max(0.0, wall - claimed), "wall": wall}

    def to_json(self) -> str:
        return json.dumps({k: round(v, 3) for k, v in self.total().items()}, sort_keys=True)


def breakdown(phases_json: str | None) -> list[dict[str, Any]]:
    """Records {phase, seconds, share, what} of a run's `phases` column, in PHASES order, with
    "other" and "wall" last; share is of the wall time. [] for a run without a breakdown."""
    if not phases_json:
        return []
    secs = json.loads(phases_json)
    wall = secs.get("wall") or sum(v for k, v in secs.items() if k not in NOT_WALL) or 1.0
    order = [p for p in PHASES if p in secs] + [p for p in secs if p not in PHASES and p not in ("other", "wall")]
    order += [p for p in ("other", "wall") if p in secs]
    what = {**PHASES, "other": "Python and bookkeeping no phase claimed", "wall": "the run's wall time"}
    return [dict(phase=p, seconds=secs[p], share=secs[p] / wall, what=what.get(p, "")) for p in order]


def lines(phases_json: str | None) -> list[str]:
    """The breakdown as aligned text lines (the end of `kcollect run`)."""
    out = []
    for r in breakdown(phases_json):
        out.append(f"  {r['phase']:<11} {r['seconds']:8.1f} s  {100 * r['share']:5.1f}%  {r['what']}")
    return out


def of_lifetime(phases_json: str | None, lifetime: float) -> dict[str, float]:
    """The breakdown of a process that died, from its last report (at the end of its last whole
    case), over the `lifetime` its parent saw: what it did after that report, its last case
    included, counts as "other"."""
    secs = {k: v for k, v in json.loads(phases_json or "{}").items() if k not in ("other", "wall")}
    claimed = sum(v for k, v in secs.items() if k not in NOT_WALL)
    return {**secs, "other": max(0.0, lifetime - claimed), "wall": lifetime}


def combined(phases_json: str | None, earlier: list[dict[str, float]]) -> str | None:
    """One run's breakdown over every process that measured it: the last one's (phases_json)
    plus those of the processes that died before it (of_lifetime's)."""
    if not earlier:
        return phases_json
    total: dict[str, float] = {}
    for part in [*earlier, json.loads(phases_json or "{}")]:
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    return json.dumps({k: round(v, 3) for k, v in total.items()}, sort_keys=True)
