"""Rows of the store -> benchmark series and their points: what the verdict engine reads.

A series is one (kernel, mode, provider, shape, dtype, GPU, machine, timing method): a change of
timing method or of machine starts another series, so it can never look like a step. CPU
(interpreted) rows form series of their own (GPU 'cpu'). A point is one commit of a series: every
run of that commit that timed it. Only rows that are a time count: status 'ok', a positive finite
median, and a recheck that agrees with it by the stability rule (stability.disagrees: rows stored
before that rule was enforced are judged by it here). Lab (A/B) runs are never read.

A point's value is the median of its runs' medians in log time (for two runs, their geometric
mean); how far its runs disagree is kept (`runs_ms`), and the verdicts widen the point's standard
error by it, so one disturbed run of two cannot make a step on its own. A point is `partial` when
every run behind it was interrupted or did not finish.

The conditions a point was measured under (`env`): torch, Triton, driver and CUDA for every series,
and for a provider that is not ours the version of the peer package it runs (the row's `package`).
Rows stored before schema 8 do not say which: QUERY gives them the package their provider ran then
(LEGACY_PACKAGES), so that a baseline's series does not seem to change conditions where the schema
changed; a row read otherwise without it counts every peer's version.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from functools import lru_cache
from typing import Iterable, NamedTuple

from .stability import FLOOR, MAX_SPREAD, disagree, disagrees

STACK = ("torch", "triton", "driver", "cuda")
LAB_GRID = "lab"
FINISHED = "finished"
COLUMNS = ("kernel", "mode", "provider", "shape", "dtype", "status", "median_ms", "p20_ms", "p80_ms", "recheck_ms",
           "timing", "ours", "package", "git_commit", "commit_time", "started_at", "run_id", "run_status",
           "device_kind", "gpu_name", "machine", *STACK, "peers")
# The peer package of each provider that ran one before rows recorded it (schema 8); every other
# provider of those rows ran none ('').
LEGACY_PACKAGES = {"liger": "liger-kernel", "quack": "quack-kernels", "fa4": "flash-attn-4", "fla": "fla-core",
                   "cortex": "cortexcore", "cortex_torch": "cortexcore", "mlstm_kernels": "mlstm-kernels",
                   "xlstm": "xlstm", "xlstm_cuda": "xlstm", "accelerated_scan": "accelerated-scan",
                   "mamba_ssm": "mamba-ssm"}
_LEGACY = ("coalesce(package, CASE WHEN coalesce(ours, false) THEN '' ELSE CASE provider "
           + " ".join(f"WHEN '{p}' THEN '{d}'" for p, d in LEGACY_PACKAGES.items()) + " ELSE '' END END) AS package")
# what the engine needs of each row; lab runs are experiments, never part of a series
QUERY = (f"SELECT {', '.join(_LEGACY if c == 'package' else c for c in COLUMNS)} FROM results_v "
         f"WHERE grid IS DISTINCT FROM '{LAB_GRID}'")


class SeriesKey(NamedTuple):
    kernel: str
    mode: str
    provider: str
    shape: str
    dtype: str
    gpu: str  # the GPU's name, or 'cpu' for interpreted rows (never mixed with a GPU's)
    machine: str | None
    timing: str | None  # 'cuda-graph', 'cuda-events' or 'cpu-clock'


Env = tuple[tuple[str, str | None], ...]


class _once:
    """functools.cached_property without its per-instance lock (Python 3.11 takes one at each first
    read: the history reads two of them on each of 200k points). The value goes into the instance's
    __dict__, which later reads find first."""

    def __init__(self, compute):
        self.compute, self.name = compute, compute.__name__
        self.__doc__ = compute.__doc__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.compute(obj)
        return value


@dataclass(frozen=True)
class Point:
    commit: str
    commit_time: datetime | None
    median_ms: float
    p20_ms: float
    p80_ms: float
    runs: int
    env: Env | None = None  # the conditions of its runs (None: unknown)
    runs_ms: tuple[float, ...] = ()  # each run's median, in the order measured
    rechecks: tuple[float, ...] = ()  # log(median / recheck) of each run that has a recheck
    partial: bool = False  # every run behind it was interrupted or unfinished
    started_at: datetime | None = None  # its first run's start

    @_once  # the history reads each point's spread at two commits
    def spread(self) -> tuple[int, float, int, float]:
        """(runs, sum of squared deviations of their log times from the mean, rechecks, half the sum
        of their squared differences from their runs): what its own measurements show."""
        k, rss = recheck_spread(self.rechecks)
        if len(self.runs_ms) < 2:  # one time (most points): the arithmetic below, without its lists
            x = math.log(self.runs_ms[0] if self.runs_ms else self.median_ms)
            return 1, (x - x) ** 2, k, rss
        logs = [math.log(v) for v in self.runs_ms] or [math.log(self.median_ms)]
        mean = sum(logs) / len(logs)
        return len(logs), sum((x - mean) ** 2 for x in logs), k, rss

    @_once  # the history reads them three times: its priors, its pool and the walk
    def within(self) -> tuple[float, ...]:
        """The differences inside the point: its reruns, and each run against its recheck."""
        if len(self.runs_ms) < 2:  # most points: one run (asked for each point three times)
            return self.rechecks
        return tuple([math.log(b / a) for a, b in zip(self.runs_ms, self.runs_ms[1:])]) + self.rechecks


_POINT_FIELDS = [f.name for f in fields(Point)]


def made(cls, **values):
    """cls(**values) for a frozen dataclass without __post_init__ (Point, verdicts' Line and Side),
    its defaults filled in, without __init__'s setattr per field (the history makes one of each per
    point: half its time)."""
    obj = object.__new__(cls)
    obj.__dict__.update(_defaults(cls), **values)
    return obj


def at_level(p: Point, median_ms: float) -> Point:
    """dataclasses.replace(p, median_ms=median_ms, runs_ms=()), without __init__'s setattr per
    field: a point at a level, without its runs (nothing it computed once is kept)."""
    return made(Point, **{**{f: p.__dict__[f] for f in _POINT_FIELDS}, "median_ms": median_ms, "runs_ms": ()})


@lru_cache(maxsize=None)
def _defaults(cls) -> dict:
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def device(row: dict) -> str:
    # CPU (interpreted) rows are their own device, so they never meet GPU rows.
    return row.get("gpu_name") or "cpu" if row.get("device_kind") == "cuda" else "cpu"


def series_key(row: dict) -> SeriesKey:
    return SeriesKey(row["kernel"], row["mode"], row["provider"], row["shape"], row["dtype"], device(row),
                     row.get("machine"), row.get("timing"))


def is_time(row: dict) -> bool:
    """Whether a row is a time: 'ok', a positive finite median, no disagreeing recheck."""
    ms = row.get("median_ms")
    return (row.get("status") == "ok" and ms is not None and math.isfinite(ms) and ms > 0
            and not disagrees(row))


def canonical(distribution: str) -> str:
    """A distribution's name as the environment's peers list it ('liger_kernel' -> 'liger-kernel'):
    rows name the peer by what importlib's packages_distributions reports, which is the wheel's
    own spelling (PEP 503: case and runs of -, _ and . do not count)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _peers(text: str | None) -> dict[str, str]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def env_of(row: dict) -> Env | None:
    """The conditions a row was measured under (see the module docstring); equal conditions are one
    object, which the history compares by identity first."""
    if "torch" not in row:
        return None
    env = tuple((f, row.get(f)) for f in STACK)
    package = row.get("package")
    if not row.get("ours") and package is None:  # not recorded: every peer's version counts
        env += (("peers", row.get("peers")),)
    elif not row.get("ours") and package:
        name = canonical(package)
        env += ((name, _peers(row.get("peers")).get(name)),)
    return _ENVS.setdefault(env, env)


_ENVS: dict[Env, Env] = {}  # every condition met, once (a handful)


@lru_cache(maxsize=4096)  # the history asks of the same few pairs of conditions at every commit
def describe_env_change(a: Env | None, b: Env | None) -> str:
    """'torch 2.11.0 -> 2.12.0, liger-kernel 0.5.2 -> 0.6.0': what differs between two conditions."""
    da, db = dict(a or ()), dict(b or ())
    parts = []
    for name in dict.fromkeys([*da, *db]):
        va, vb = da.get(name), db.get(name)
        if va == vb:
            continue
        if name == "peers":
            pa, pb = _peers(va), _peers(vb)
            parts += [f"{p} {pa.get(p, 'none')} -> {pb.get(p, 'none')}" for p in sorted(pa.keys() | pb.keys())
                      if pa.get(p) != pb.get(p)]
        else:
            parts.append(f"{name} {va or 'none'} -> {vb or 'none'}")
    return ", ".join(parts) or "unknown"


def fast_median(values: Iterable[float]) -> float:
    """statistics.median, the same arithmetic without its checks (the history takes millions)."""
    data = sorted(values)
    n = len(data)
    return data[n // 2] if n % 2 else (data[n // 2 - 1] + data[n // 2]) / 2


def points_from_rows(rows: Iterable[dict]) -> list[Point]:
    """Rows of ONE series -> one point per commit, in commit order (then by when measured). Rows
    that are no time (is_time) are left out; a run without a commit is its own point. The band runs
    from the median of the runs' p20s to the median of their p80s, widened to hold every run's
    median, so disagreeing runs show as spread."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if is_time(r):
            groups.setdefault(r.get("git_commit") or f"run:{str(r.get('run_id', ''))[:8]}", []).append(r)
    points = []
    for commit, runs in groups.items():
        if len(runs) > 1:
            runs.sort(key=lambda r: r.get("started_at") or datetime.min)
        points.append(make_point(commit, [r["median_ms"] for r in runs], [r.get("p20_ms") for r in runs],
                                 [r.get("p80_ms") for r in runs], [r.get("recheck_ms") for r in runs],
                                 [r.get("commit_time") for r in runs], [r.get("started_at") for r in runs],
                                 [r.get("run_status", FINISHED) not in (FINISHED, None) for r in runs],
                                 env_of(runs[-1])))
    points.sort(key=order_key)
    return points


def make_point(commit: str, medians: list[float], p20s: list, p80s: list, rechecks: list, commit_times: list,
               starts: list, unfinished: list[bool], env: Env | None) -> Point:
    """One point from its runs' values, in the order measured (None where a run lacks one;
    `unfinished`: whether each run was interrupted or did not finish)."""
    if len(medians) == 1:
        return one_run(commit, medians[0], p20s[0], p80s[0], rechecks[0], commit_times[0], starts[0], unfinished[0],
                       env)
    p20 = fast_median([a or m for a, m in zip(p20s, medians)])
    p80 = fast_median([a or m for a, m in zip(p80s, medians)])
    times = [t for t in commit_times if t is not None]
    starts = [t for t in starts if t is not None]
    # the median in log time (for two runs, their geometric mean), and from the same logarithms the
    # `spread` and `within` that Point computes on first use (the history reads both of every point)
    logs = [math.log(v) for v in medians]
    mean = sum(logs) / len(logs)
    rechecks = tuple(math.log(m / r) for m, r in zip(medians, rechecks) if (r or 0) > 0)
    point = object.__new__(Point)  # made() of every field, without its defaults to fill in
    point.__dict__.update(
        commit=commit, commit_time=min(times) if times else None, median_ms=math.exp(fast_median(logs)),
        p20_ms=min(p20, *medians), p80_ms=max(p80, *medians), runs=len(medians), env=env, runs_ms=tuple(medians),
        rechecks=rechecks, partial=all(unfinished), started_at=min(starts) if starts else None,
        within=tuple([math.log(b / a) for a, b in zip(medians, medians[1:])]) + rechecks,
        spread=(len(logs), sum((x - mean) ** 2 for x in logs), *recheck_spread(rechecks)))
    return point


def one_run(commit: str, m: float, p20: float | None, p80: float | None, recheck: float | None, commit_time,
            start, unfinished: bool, env: Env | None) -> Point:
    """make_point of one run (most points): the same values, without their lists; with the
    `within` and `spread` that Point computes on first use (the history reads both of every point),
    from the same numbers."""
    x = math.log(m)
    rechecks = (math.log(m / recheck),) if (recheck or 0) > 0 else ()
    point = object.__new__(Point)  # made() of every field, without its defaults to fill in
    point.__dict__.update(commit=commit, commit_time=commit_time, median_ms=math.exp(x), p20_ms=min(p20 or m, m),
                          p80_ms=max(p80 or m, m), runs=1, env=env, runs_ms=(m,), rechecks=rechecks,
                          partial=bool(unfinished), started_at=start, within=rechecks,
                          spread=(1, (x - x) ** 2, *recheck_spread(rechecks)))
    return point


def recheck_spread(rechecks: tuple[float, ...]) -> tuple[int, float]:
    """(count, half the sum of squares) of a point's recheck differences: each is two measurements of
    one run, whose variance it estimates with one degree of freedom (verdicts.point_variance)."""
    return len(rechecks), sum(d * d for d in rechecks) / 2


def order_key(p: Point) -> tuple:
    """Commit order: by commit time, then by when it was first measured (a run without a commit
    time falls back to its start)."""
    first = p.started_at or datetime.min
    return (p.commit_time or first, first, p.commit)


def full_commits(commits: Iterable[str | None]) -> dict[str, str]:
    """{commit as stored: the commit it stands for}: a short SHA (older runs stored 7 characters) is
    the one longer SHA it begins, where there is exactly one, so that both are one commit."""
    known = {c for c in commits if c}
    out = {}
    for c in known:
        longer = [k for k in known if len(k) > len(c) and k.startswith(c)] if len(c) < 40 else []
        out[c] = longer[0] if len(longer) == 1 else c
    return out


def group_series(rows: Iterable[dict]) -> tuple[dict[SeriesKey, list[Point]], set[SeriesKey]]:
    """Rows -> ({series key: its points}, the keys of our providers' series)."""
    rows = list(rows)
    full = full_commits(r.get("git_commit") for r in rows)
    groups: dict[SeriesKey, list[dict]] = {}
    ours = set()
    for r in rows:
        if r.get("git_commit") in full and full[r["git_commit"]] != r["git_commit"]:
            r = {**r, "git_commit": full[r["git_commit"]]}
        key = series_key(r)
        groups.setdefault(key, []).append(r)
        if r.get("ours"):
            ours.add(key)
    return {k: pts for k, g in groups.items() if (pts := points_from_rows(g))}, ours


def commit_rank(series: Iterable[list[Point]]) -> dict[str, int]:
    """{commit: its place in the one commit order of every series} (see order_key)."""
    when: dict[str, tuple] = {}
    for points in series:
        for p in points:
            key = order_key(p)
            when[p.commit] = min(when.get(p.commit, key), key)
    return {c: n for n, c in enumerate(sorted(when, key=when.get))}


# group_series of the rows of QUERY on a long history, with the store doing the grouping: each row
# keyed by hashes of its series, commit (as stored) and conditions, so that Python makes no object
# per row but its numbers (rows as dicts cost more than the analysis of them).
DEVICE_SQL = "CASE WHEN device_kind = 'cuda' THEN coalesce(nullif(gpu_name, ''), 'cpu') ELSE 'cpu' END"
_CODED = f"""(SELECT *, {DEVICE_SQL} AS gpu, coalesce(ours, false) AS is_ours,
               coalesce(nullif(git_commit, ''), 'run:' || left(run_id, 8)) AS raw_commit FROM ({QUERY}))"""
_KEY = "hash(kernel, mode, provider, shape, dtype, gpu, machine, timing)"
_ENV = "hash(torch, triton, driver, cuda, is_ours, package, peers)"
_VALUES = f"""SELECT {_KEY} AS skey, {_ENV} AS ekey, hash(raw_commit) AS ckey, is_ours,
    coalesce(status = 'ok', false) AS ok, coalesce(device_kind = 'cuda', false) AS on_cuda,
    coalesce(run_status <> 'finished', false) AS unfinished, median_ms, p20_ms, p80_ms, recheck_ms, commit_time,
    started_at FROM {_CODED}"""


def _distinct(con, what: str, columns: str) -> dict:
    """{hash: the values it stands for}; raises LookupError where two differ (a collision)."""
    out: dict = {}
    for h, *values in con.execute(f"SELECT DISTINCT {what}, {columns} FROM {_CODED}").fetchall():
        if out.setdefault(h, values) != values:
            raise LookupError(h)
    return out


def _surely_agree(ms, recheck, spread, cuda):
    """The rows (arrays) that stability.disagree finds in agreement with their recheck, where numpy's
    logarithms, which may differ from math's in their last bits, could not say otherwise: steady,
    and their log ratio below the tolerance by far more than that. The others are asked of disagree()."""
    import numpy as np

    steady = ~cuda | (spread <= MAX_SPREAD)
    tolerance = np.log1p(np.maximum(np.where(cuda, FLOOR["cuda"], FLOOR["cpu"]), 2 * np.minimum(spread, MAX_SPREAD)))
    return (recheck > 0) & steady & (np.abs(np.log(ms / recheck)) < tolerance - 1e-9)


def group_store(con) -> tuple[dict[SeriesKey, list[Point]], set[SeriesKey], list[str]]:
    """group_series(the rows of QUERY) read from a DuckDB connection: (series, ours, the rows' git
    commits as stored)."""
    import numpy as np

    try:
        keys = {h: SeriesKey(*k) for h, k in _distinct(con, _KEY, "kernel, mode, provider, shape, dtype, gpu, "
                                                        "machine, timing").items()}
        envs = {h: env_of(dict(zip(("torch", "triton", "driver", "cuda", "ours", "package", "peers"), e)))
                for h, e in _distinct(con, _ENV, "torch, triton, driver, cuda, is_ours, package, peers").items()}
        stored = _distinct(con, "hash(raw_commit)", "raw_commit, coalesce(git_commit, '') <> ''")
    except LookupError:  # two values of one hash: never seen, but then grouped row by row
        rows = [dict(zip(COLUMNS, r)) for r in con.execute(QUERY).fetchall()]
        return (*group_series(rows), [r["git_commit"] for r in rows if r["git_commit"]])
    git = [raw for raw, is_git in stored.values() if is_git]
    full = full_commits(git)
    name = {h: full.get(raw, raw) if is_git else raw for h, (raw, is_git) in stored.items()}
    cols = con.execute(_VALUES).fetchnumpy()

    def data(col: str):
        return np.ma.getdata(cols[col])

    def present(col: str):
        return ~np.ma.getmaskarray(cols[col])

    ms, recheck = data("median_ms").astype(float), data("recheck_ms").astype(float)
    ours = {keys[h] for h in np.unique(data("skey")[data("is_ours").astype(bool)]).tolist()}
    with np.errstate(invalid="ignore"):
        time = data("ok").astype(bool) & present("median_ms") & np.isfinite(ms) & (ms > 0)
        judged = np.flatnonzero(time & present("recheck_ms") & (recheck != 0))  # is_time's recheck rule
    banded = present("p20_ms") & present("p80_ms")
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = np.where(banded, (data("p80_ms").astype(float) - data("p20_ms").astype(float)) / ms, 0.0)
        on_cuda = data("on_cuda")[judged].astype(bool)
        asked = judged[~_surely_agree(ms[judged], recheck[judged], spread[judged], on_cuda)]
    bad = [disagree(*v, "cuda" if c else None) for *v, c in zip(
        ms[asked].tolist(), recheck[asked].tolist(), cols["p20_ms"][asked].tolist(),
        cols["p80_ms"][asked].tolist(), data("on_cuda")[asked].tolist())]
    time[asked[np.asarray(bad, dtype=bool)]] = False
    rows = np.flatnonzero(time)
    # one number per series, in the order the store returns them (as group_series keeps them: the
    # walk over them in that order takes a sixth less time than in the order of their hashes), and
    # per commit (after full_commits); the rows of each point in the order they started
    _, first, series_of = np.unique(data("skey")[rows], return_index=True, return_inverse=True)
    series_of = np.argsort(np.argsort(first))[series_of]
    commit_names = sorted(set(name.values()))
    number = {c: n for n, c in enumerate(commit_names)}
    chash, cinv = np.unique(data("ckey")[rows], return_inverse=True)
    commit_of = np.asarray([number[name[h]] for h in chash.tolist()], dtype=np.int64)[cinv]
    started = np.where(present("started_at"), data("started_at").view(np.int64), np.iinfo(np.int64).min)[rows]
    order = np.lexsort((started, commit_of, series_of))  # stable: rows of one start keep the store's order
    s_sorted, c_sorted = series_of[order], commit_of[order]
    first = np.flatnonzero(np.r_[True, (s_sorted[1:] != s_sorted[:-1]) | (c_sorted[1:] != c_sorted[:-1])]).tolist()
    order = rows[order]
    v = {c: cols[c][order].tolist() for c in ("skey", "ekey", "median_ms", "p20_ms", "p80_ms", "recheck_ms",
                                              "commit_time", "started_at", "unfinished")}
    c_list = c_sorted.tolist()
    series: dict[SeriesKey, list[Point]] = {}
    med, p20, p80, rc, ct, st, unf = (v[c] for c in ("median_ms", "p20_ms", "p80_ms", "recheck_ms", "commit_time",
                                                     "started_at", "unfinished"))
    for a, b in zip(first, first[1:] + [len(order)]):
        commit, env = commit_names[c_list[a]], envs[v["ekey"][b - 1]]
        series.setdefault(keys[v["skey"][a]], []).append(
            one_run(commit, med[a], p20[a], p80[a], rc[a], ct[a], st[a], unf[a], env) if b - a == 1 else
            make_point(commit, med[a:b], p20[a:b], p80[a:b], rc[a:b], ct[a:b], st[a:b], unf[a:b], env))
    for points in series.values():
        points.sort(key=order_key)
    return series, ours, git
