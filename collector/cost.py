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
A kernel's own terms (the two most specific levels) take the rows of its newest run (RECENT_RUNS),
the provider's terms every run's. The fitted terms are committed (`cost_model.json`, written by
`benchmarks/fit_cost.py` from data/runs), so that every machine of a sharded run computes the same
split from the same numbers.

A row's seconds are more than its measurement's warm seconds, and a run's wall time more than its
rows' seconds; each of these parts is fitted apart, per device kind, so that the plan adds each only
where it applies (schedule.unit_cost, schedule.overhead):
- the case's share: what a case spends outside its measurements (inputs, float64 references,
  release; runs.phases), per case of each kernel, spread over the case's measurements as the runner
  spreads it (a case of 2 measurements carries half in each, one of 27 a 27th);
- the cold first calls: a measurement whose provider builds code takes longer in a run whose caches
  were cold (the precompile pass made its builds just before) than in a warm one, per provider,
  from pairs of the same measurement in both kinds of run;
- the precompile pass (precompile.py), `fixed + per_build[kernel] * builds / processes`;
- the start-up (imports, the device's ceilings), the median of wall - precompile - rows' seconds.
The row terms are fitted on the rows' seconds less their case's share and their cold excess: the
seconds of one measurement in a warm run. The kernels' costs (the pass, the share) are drawn toward
a common one where few runs measured them (fit_shrunk). The runs' parts are fitted on one-worker
runs (a pass builds for all of a run's workers at once).
"""
from __future__ import annotations

import functools
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping

MODEL_FILE = Path(__file__).with_name("cost_model.json")
MIN_ROWS = 3
MIN_RUNS = 2  # runs behind a run term (cost.fit_runs)
REACH = 4.0  # a term predicts sizes up to this multiple of the largest it was fitted on
# A kernel's own terms are fitted on the newest run that measured it: how a measurement is made
# changes under the rows (fla's autotuning, 30 s in each of its first rows, moved into the precompile
# pass), and the newest run is what the next one repeats. Chosen by lab/cost_forward.py, each run
# predicted from the runs before it: within 20% of the wall for 10 of the 14 older runs (every run:
# 8), and on the 15 newer ones it never saw 12 (every run: 10); lab/results/cost_forward_2f05988.txt
RECENT_RUNS = 1
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


def fit_runs(runs: Iterable[Mapping]) -> dict[str, dict]:
    """{device: {"startup": [seconds, runs], "precompile": {...}, "share": {...}}} from runs with
    device, wall, precompile_s (0 without a pass), rows_s, shared_s (the measuring pass's inputs,
    references and release), cases ({kernel: cases measured}), procs (the pass's) and builds
    ({kernel: the builds the pass made for it}). The start-up is the median of wall - precompile -
    rows' seconds: a run whose measuring process died and started again (d74bff50: 71.5 s against
    4.7-8.5 s for the others) must not move every run's estimate.

    The pass: `fixed + sum over kernels of per[kernel] * builds / processes`. A build's cost depends
    on the kernel (attention's cost several times a memory-bound kernel's), but a run records one
    time for its whole pass. The share: `sum over kernels of per[kernel] * cases`, the seconds a
    case spends outside its measurements (inputs, float64 references, release), which the runner
    spreads over the case's rows (runner._share_case_seconds): fitted apart, a case of 2 rows
    carries it as a case of 27 does (attention's tiny cases of a65a4214: 0.5 s of inputs each)."""
    by: dict[str, list[Mapping]] = defaultdict(list)
    for r in runs:
        by[r["device"]].append(r)
    out: dict[str, dict] = {}
    for device, mine in sorted(by.items()):
        terms = out.setdefault(device, {})
        rest = [r["wall"] - r["precompile_s"] - r["rows_s"] for r in mine]
        if len(rest) >= MIN_RUNS:
            terms["startup"] = [round(max(0.0, statistics.median(rest)), 3), len(rest)]
        passes = [r for r in mine if r["precompile_s"] and r["procs"]]
        if len(passes) >= MIN_RUNS:
            terms["precompile"] = fit_shrunk([({k: n / r["procs"] for k, n in r["builds"].items()}, r["precompile_s"])
                                              for r in passes], fixed=True)
        shared = [(r["cases"], r["shared_s"]) for r in mine if r.get("cases")]
        if len(shared) >= MIN_RUNS:
            terms["share"] = fit_shrunk(shared, fixed=False)
    return out


def fit_shrunk(points: list[tuple[Mapping[str, float], float]], fixed: bool) -> dict:
    """{"fixed": s, "runs": n, "per": {kernel or "*": [s, runs]}} minimising the squared error of
    `fixed + sum over kernels of per[kernel] * x[kernel]` over (x, seconds) points, one per run,
    every cost >= 0 (fixed 0 unless `fixed`). Most kernels were in one or two runs, several always
    together: each kernel's cost is drawn toward a common one ("*", fitted with them) as if one
    more run, with that kernel's mean x, had measured it at the common cost. A kernel no run
    measured takes the common cost."""
    import numpy as np
    from scipy.optimize import nnls

    kernels = sorted({k for x, _ in points for k, v in x.items() if v})
    # unknowns: fixed, the common cost, each kernel's; a row per run, then one per kernel
    a = np.zeros((len(points) + len(kernels), 2 + len(kernels)))
    b = np.zeros(len(points) + len(kernels))
    for i, (x, seconds) in enumerate(points):
        a[i, 0], b[i] = float(fixed), seconds
        for k, v in x.items():
            if v:
                a[i, 2 + kernels.index(k)] = v
    for j, k in enumerate(kernels):
        mine = [x[k] for x, _ in points if x.get(k)]
        a[len(points) + j, 1], a[len(points) + j, 2 + j] = -sum(mine) / len(mine), sum(mine) / len(mine)
    solution, _ = nnls(a, b)
    per = {k: [round(float(c), 4), sum(bool(x.get(k)) for x, _ in points)] for k, c in zip(kernels, solution[2:])}
    per[ANY] = [round(float(solution[1]), 4), len(points)]
    return {"fixed": round(float(solution[0]), 4) if fixed else 0.0, "runs": len(points), "per": per}


def fit_cold(rows: Iterable[Mapping]) -> dict[str, dict[str, list[float]]]:
    """{device: {provider or "*": [seconds, pairs]}}: how much longer a row whose provider builds
    code takes in a run whose caches were cold (the precompile pass made its builds just before:
    the measuring pass reads them from disk and makes inductor's picks again) than in a warm run.
    Measured on pairs, the same (kernel, provider, mode, shape, dtype) in both kinds of run: the
    mean difference per pair, per provider where MIN_ROWS pairs have it, and over every provider
    ("*") for the others. Rows carry device, kernel, provider, mode, shape, dtype, seconds, builds
    (whether the provider builds code) and cold (whether the run made the pass; None: not known,
    as for a run that left no breakdown)."""
    seen: dict[tuple, dict[bool, list[float]]] = defaultdict(lambda: {True: [], False: []})
    for r in rows:
        if r.get("builds") and r.get("seconds") is not None and r.get("cold") is not None:
            key = (r["device"], r["kernel"], r["provider"], r["mode"], r["shape"], r["dtype"])
            seen[key][bool(r["cold"])].append(float(r["seconds"]))
    diffs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, pair in seen.items():
        if pair[True] and pair[False]:
            diff = sum(pair[True]) / len(pair[True]) - sum(pair[False]) / len(pair[False])
            diffs[key[0]][key[2]].append(diff)
            diffs[key[0]][ANY].append(diff)
    return {device: {p: [round(max(0.0, sum(d) / len(d)), 6), len(d)] for p, d in sorted(by.items())
                     if len(d) >= MIN_ROWS}
            for device, by in sorted(diffs.items())}


def fit(rows: Iterable[Mapping], run_terms: Mapping[str, Mapping] | None = None,
        recent: int | None = None) -> dict[str, list[float]]:
    """{term key: [fixed_s, per_gb_s, rows, largest_gb]} from rows with device ('cuda'/'cpu'),
    kernel, provider, mode, bytes and seconds. With `run_terms` (fit_all's), a row counts as the
    measurement alone in a warm run: less its cold excess where its run was cold (cold) and its
    provider builds (builds), and less its part of its case's share (case_rows: the rows of its
    case in its run); the plan adds both back where they apply (Model.cold, Model.row). `recent`:
    a kernel's own terms (the two most specific levels) from the rows of the newest `recent` runs
    that measured them (rows with run_id and started_at), the general ones from every row."""
    model = Model({}, run_terms)
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    by_run: dict[str, dict] = defaultdict(dict)  # a kernel's term: {run: (its start, its points)}
    for r in rows:
        if r.get("seconds") is None:
            continue
        seconds = float(r["seconds"])
        if r.get("cold") and r.get("builds"):
            seconds -= model.cold(r["device"], {r["provider"]: 1}) or 0.0
        if r.get("case_rows"):
            seconds -= (model.share(r["device"], r["kernel"]) or 0.0) / r["case_rows"]
        point = ((r.get("bytes") or 0) / 1e9, max(0.0, seconds))
        for level, key in enumerate(_keys(r["device"], r["kernel"], r["provider"], r["mode"])):
            if recent and level < 2 and r.get("run_id") is not None:
                by_run[key].setdefault(r["run_id"], (str(r.get("started_at")), []))[1].append(point)
            else:
                groups[key].append(point)
    for key, runs in by_run.items():
        for _, points in sorted(runs.values(), key=lambda v: v[0])[-recent:]:
            groups[key].extend(points)
    return {k: [*(round(x, 6) for x in _fit_line(v)), len(v), round(max(g for g, _ in v), 6)]
            for k, v in sorted(groups.items()) if len(v) >= MIN_ROWS}


def fit_all(rows: list[Mapping], runs: list[Mapping], recent: int | None = None) -> tuple[dict, dict]:
    """(terms, run terms) from rows (fit_cold, then fit) and run records (fit_runs), as committed."""
    run_terms = fit_runs(runs)
    for device, terms in fit_cold(rows).items():
        if terms:
            run_terms.setdefault(device, {})["cold"] = terms
    return fit(rows, run_terms, recent), run_terms


class Model:
    def __init__(self, terms: Mapping[str, list[float]], runs: Mapping[str, Mapping] | None = None):
        self.terms = dict(terms)
        self.runs = dict(runs or {})

    def startup(self, device: str) -> float | None:
        """A run's seconds outside its rows and its precompile pass; None where none was fitted."""
        term = self.runs.get(device, {}).get("startup")
        return None if term is None else term[0]

    def precompile(self, device: str, builds: Mapping[str, int], procs: int) -> float | None:
        """The precompile pass's seconds for `builds` ({kernel: builds}) made by `procs` processes
        (0 when there is no pass); None where none was fitted."""
        if not (sum(builds.values()) and procs):
            return 0.0
        term = self.runs.get(device, {}).get("precompile")
        if term is None:
            return None
        return _sum(term, builds) / procs + term["fixed"]

    def share(self, device: str, kernel: str) -> float | None:
        """The seconds one case of `kernel` spends outside its measurements (fit_runs); None where
        none was fitted."""
        term = self.runs.get(device, {}).get("share")
        return None if term is None else _sum(term, {kernel: 1})

    def cold(self, device: str, builds: Mapping[str, int]) -> float | None:
        """The measuring pass's extra seconds for reading `builds` ({provider: builds}) that a
        precompile pass has just made (fit_cold); None where no pair of runs measured it."""
        term = self.runs.get(device, {}).get("cold", {})
        if not builds:
            return 0.0
        if ANY not in term:
            return None
        return sum(term.get(p, term[ANY])[0] * n for p, n in builds.items())

    def row(self, device: str, kernel: str, provider: str, mode: str, gb: float, case_rows: int) -> float | None:
        """A measurement's estimate with its part of its case's share (`case_rows`: the measurements
        of its case), or None where no term covers it (seconds)."""
        fitted = self.seconds(device, kernel, provider, mode, gb)
        if fitted is None:
            return None
        return fitted + (self.share(device, kernel) or 0.0) / max(1, case_rows)

    def seconds(self, device: str, kernel: str, provider: str, mode: str, gb: float) -> float | None:
        """The fitted estimate, or None where no term covers the measurement (none fitted, or none
        whose rows reach its size: REACH)."""
        for key in _keys(device, kernel, provider, mode):
            term = self.terms.get(key)
            if term is None or (len(term) > 3 and gb > REACH * max(term[3], 1e-6)):
                continue
            return term[0] + term[1] * gb
        return None


def _sum(term: Mapping, counts: Mapping[str, float]) -> float:
    """sum of per[kernel] * count over a fit_shrunk term, the common cost for a kernel it lacks."""
    per = term["per"]
    return sum(per.get(k, per[ANY])[0] * n for k, n in counts.items())


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
