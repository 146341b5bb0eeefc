"""The cost model: the seconds one (kernel, mode, provider) measurement takes, fitted on the stored
runs' own per-row seconds (results.seconds: the measurement, its recheck and its share of the case's
inputs, references and release).

Each term is `fixed + per_gb * GB moved`, fitted by least squares (the estimate of a whole run is a
sum, so it must be right on average, not in the median), at four levels from the most specific:
(device, kernel, provider, mode), (device, kernel, provider), (device, provider, mode),
(device, provider). A measurement takes the most specific term fitted on at least MIN_ROWS rows
whose rows reach within REACH x of its size: a line fitted on three tiny shapes said 1485 s for a
0.4 GB one (rtu, cortex_torch fwd, slope 3683 s/GB from rows under 0.001 GB) and made the plan of
the full grid 6 hours; beyond its reach a more general term, or the plan's constants, answer.
The fitted terms are committed (`cost_model.json`, written by `benchmarks/fit_cost.py` from
data/runs), so that every machine of a sharded run computes the same split from the same numbers.

A run's wall time is more than its rows' seconds: the precompile pass before it (precompile.py) and
its start-up (imports, the device's ceilings). Those are fitted per device kind on the finished
runs' breakdowns (runs.phases): the start-up as the mean of wall - precompile - rows' seconds, the
pass as `fixed + per_build * builds / processes` (builds: the plan's units that build code, all of
them in a run that made the pass: its caches were cold), both on one-worker runs.
"""
from __future__ import annotations

import functools
import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping

MODEL_FILE = Path(__file__).with_name("cost_model.json")
MIN_ROWS = 3
MIN_RUNS = 2  # runs behind a run term (cost.fit_runs)
REACH = 4.0  # a term predicts sizes up to this multiple of the largest it was fitted on
ANY = "*"


def _keys(device: str, kernel: str, provider: str, mode: str) -> list[str]:
    """The terms a measurement may take, most specific first."""
    return ["|".join(k) for k in ((device, kernel, provider, mode), (device, kernel, provider, ANY),
                                  (device, ANY, provider, mode), (device, ANY, provider, ANY))]


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(fixed, per_gb) >= 0 minimising the squared error of seconds over (gb, seconds) points."""
    n = len(points)
    mean_g = sum(g for g, _ in points) / n
    mean_s = sum(s for _, s in points) / n
    var_g = sum((g - mean_g) ** 2 for g, _ in points)
    slope = sum((g - mean_g) * (s - mean_s) for g, s in points) / var_g if var_g > 0 else 0.0
    if slope <= 0:
        return mean_s, 0.0
    fixed = mean_s - slope * mean_g
    if fixed < 0:  # through the origin instead
        return 0.0, sum(g * s for g, s in points) / sum(g * g for g, _ in points)
    return fixed, slope


def fit_runs(runs: Iterable[Mapping]) -> dict[str, dict[str, list[float]]]:
    """{device: {"startup": [seconds, runs], "precompile": [fixed_s, per_build_s, runs]}} from runs
    with device, wall, precompile_s (0 without a pass), rows_s, builds and procs (the pass's)."""
    by: dict[str, list[Mapping]] = defaultdict(list)
    for r in runs:
        by[r["device"]].append(r)
    out: dict[str, dict[str, list[float]]] = {}
    for device, mine in sorted(by.items()):
        terms = out.setdefault(device, {})
        rest = [r["wall"] - r["precompile_s"] - r["rows_s"] for r in mine]
        if len(rest) >= MIN_RUNS:
            terms["startup"] = [round(max(0.0, sum(rest) / len(rest)), 3), len(rest)]
        points = [(r["builds"] / r["procs"], r["precompile_s"]) for r in mine if r["precompile_s"] and r["procs"]]
        if len(points) >= MIN_RUNS:
            terms["precompile"] = [*(round(x, 4) for x in _fit_line(points)), len(points)]
    return out


def fit(rows: Iterable[Mapping]) -> dict[str, list[float]]:
    """{term key: [fixed_s, per_gb_s, rows, largest_gb]} from rows with device ('cuda'/'cpu'),
    kernel, provider, mode, bytes and seconds."""
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r.get("seconds") is None:
            continue
        point = ((r.get("bytes") or 0) / 1e9, float(r["seconds"]))
        for key in _keys(r["device"], r["kernel"], r["provider"], r["mode"]):
            groups[key].append(point)
    return {k: [*(round(x, 6) for x in _fit_line(v)), len(v), round(max(g for g, _ in v), 6)]
            for k, v in sorted(groups.items()) if len(v) >= MIN_ROWS}


class Model:
    def __init__(self, terms: Mapping[str, list[float]], runs: Mapping[str, Mapping] | None = None):
        self.terms = dict(terms)
        self.runs = dict(runs or {})

    def startup(self, device: str) -> float | None:
        """A run's seconds outside its rows and its precompile pass; None where none was fitted."""
        term = self.runs.get(device, {}).get("startup")
        return None if term is None else term[0]

    def precompile(self, device: str, builds: int, procs: int) -> float | None:
        """The precompile pass's seconds for `builds` made by `procs` processes (0 when there is no
        pass); None where none was fitted."""
        if not (builds and procs):
            return 0.0
        term = self.runs.get(device, {}).get("precompile")
        return None if term is None else term[0] + term[1] * builds / procs

    def seconds(self, device: str, kernel: str, provider: str, mode: str, gb: float) -> float | None:
        """The fitted estimate, or None where no term covers the measurement (none fitted, or none
        whose rows reach its size: REACH)."""
        for key in _keys(device, kernel, provider, mode):
            term = self.terms.get(key)
            if term is None or (len(term) > 3 and gb > REACH * max(term[3], 1e-6)):
                continue
            return term[0] + term[1] * gb
        return None


@functools.cache
def committed() -> Model:
    """The model committed beside this module (empty if there is none)."""
    try:
        data = json.loads(MODEL_FILE.read_text())
    except FileNotFoundError:
        return Model({})
    return Model(data["terms"], data.get("runs"))


def save(terms: Mapping[str, list[float]], runs: Mapping[str, Mapping], fitted_on: Mapping,
         path: Path = MODEL_FILE) -> None:
    data = {"fitted_on": fitted_on, "terms": terms, "runs": runs}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
