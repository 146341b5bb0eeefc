"""What the site shows, read from the store: device groups, the commit order of each group with the
commits' metadata, the latest run of every kernel, trend series with the conditions each point was
measured under, sparkline series, environments, and the lab (A/B) runs.

Queries and aggregation only: no HTML here and no kernel import (the site reads the store alone).
Heavy lifting (per-commit aggregation over the whole history) stays inside DuckDB so that a long
history costs one pass over the results table, not a Python loop per row.

A device group is one GPU model (environments.gpu_name) or the CPU interpreter. CPU/interpreted
rows form their own group and are never aggregated together with GPU rows. Lab runs (grid 'lab':
A/B studies of configs) are kept out of every group: they are experiments, not the product's history.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from . import series
from .names import MODES, plain
from .store import Store

CPU_LABEL = "CPU (Triton interpreter)"
SPARK_POINTS = 40  # a sparkline is ~110 px wide: more points only add bytes to the overview
LAB_GRID = "lab"
ENV_FIELDS = ("driver", "cuda", "torch", "triton", "python")

# Runs with their device group (gkey) and the index of their commit within that group (ci).
# Commits are ordered by commit time, then by their first run's start; a run outside git counts as
# its own commit.
RUNS_CTE = f"""
WITH rk AS (
  SELECT u.*, e.device_kind, e.gpu_name, e.driver, e.cuda, e.torch, e.triton, e.python, e.peers,
         e.device_kind || ':' || CASE WHEN e.device_kind = 'cpu' THEN '' ELSE coalesce(e.gpu_name, '?') END AS gkey,
         coalesce(u.git_commit, 'run:' || left(u.run_id, 8)) AS commit,
         coalesce(u.commit_time, u.started_at) AS ctime
  FROM runs u JOIN environments e USING (env_id) WHERE u.grid IS DISTINCT FROM '{LAB_GRID}'),
cm AS (
  SELECT gkey, commit, min(ctime) AS ctime, min(started_at) AS first_start,
         row_number() OVER (PARTITION BY gkey ORDER BY min(ctime), min(started_at), commit) - 1 AS ci
  FROM rk GROUP BY gkey, commit),
rc AS (SELECT rk.* EXCLUDE (ctime), cm.ci, cm.ctime FROM rk JOIN cm USING (gkey, commit))
"""

# A digest of the engine's rows, computed by the store (milliseconds, where pickling the rows in
# Python takes seconds): their count and the exclusive or of each row's hash. Rows are unique by
# their key, so no two cancel; any changed value changes it.
HISTORY_DIGEST = f"SELECT count(*) AS n, bit_xor(hash({', '.join(series.COLUMNS)})) AS h FROM ({series.QUERY})"

# The same of the trends' points (kc_points, unique by series, commit and condition), from which
# exact_trends are made: a key for them without reading them back in Python.
POINTS_DIGEST = ("SELECT count(*) AS n, bit_xor(hash(gkey, kernel, mode, dtype, provider, shape, ci, cond, med, p20, "
                 "p80)) AS h FROM kc_points")

# Providers that run on the stack alone (ours, as each row says, eager torch and its variants,
# torch.compile): a peer package's version is part of the measuring conditions only for the peers.
STACK_PROVIDER = "(coalesce(ours, false) OR provider = 'torch' OR provider LIKE 'torch\\_%' ESCAPE '\\' OR provider = 'compile')"

# What a point was measured under: the machine, the timing method and the software. Two points
# with different conditions are two series; a step between them is a change of conditions, never a
# change of the kernel. DuckDB's hash tells NULL apart from every value.
COND_SQL = f"hash(rc.machine, r.timing, rc.driver, rc.cuda, rc.torch, rc.triton, rc.python, CASE WHEN {STACK_PROVIDER.replace('provider', 'r.provider')} THEN NULL ELSE rc.peers END)"


def sig(col: str, digits: int = 4) -> str:
    """SQL rounding of a positive column to `digits` significant digits: the trend files carry
    thousands of numbers, and 4 digits is well below run-to-run noise."""
    return (f"CASE WHEN {col} > 0 THEN round({col}, {digits - 1} - CAST(floor(log10({col})) AS INTEGER)) "
            f"ELSE {col} END")


def slug(text: str, taken: set[str]) -> str:
    """A file-name and URL-safe id for text, unique within taken (which it joins). Names come from
    the data, so nothing here may let one escape its folder or collide with another."""
    base = re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-_")[:40] or "x"
    out = base if base not in taken else f"{base}-{hashlib.sha1(text.encode()).hexdigest()[:6]}"
    while out in taken:
        out += "x"
    taken.add(out)
    return out


@dataclass
class Group:
    key: str  # 'cuda:<gpu name>' or 'cpu:'
    id: str  # slug, used in URLs (filters) and file names
    label: str
    kind: str  # 'gpu' or 'cpu'
    # in order: sha, short, date, time (datetime), subject, author, url, runs
    commits: list[dict[str, Any]] = field(default_factory=list)
    latest: dict[str, Any] | None = None  # the group's latest run
    kernels: list[str] = field(default_factory=list)
    machines: list[str] = field(default_factory=list)


@dataclass
class SiteData:
    groups: list[Group]
    kernels: list[str]  # every kernel with rows, sorted
    kernel_info: dict[str, dict[str, Any]]  # kernel -> baseline, bound, unit
    providers: list[str]  # every provider, baseline-like names first
    modes: list[str]
    dtypes: list[str]
    latest: dict[tuple[str, str], list[dict[str, Any]]]  # (gkey, kernel) -> rows of its latest run
    # (gkey, kernel, mode, dtype) -> provider -> shape -> [commit indexes, median, p20, p80, condition ids]
    trends: dict[tuple[str, str, str, str], dict[str, dict[str, list]]]  # 4 significant digits
    exact_trends: dict[tuple[str, str, str, str], dict[str, dict[str, list]]]  # as measured
    conditions: dict[int, dict[str, Any]]  # condition id -> machine, timing, env fields, peers
    last_ci: dict[tuple[str, str, str, str], int]  # (gkey, kernel, shape, dtype) -> its latest run's commit index
    sparks: dict[tuple[str, str, str, str, str], list[float]]  # (gkey, kernel, provider, mode|*, dtype|*) -> values
    environments: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    lab: list[dict[str, Any]] = field(default_factory=list)  # lab runs, newest first, each with its rows
    run_ci: dict[str, int] = field(default_factory=dict)  # run id -> the index of its commit in its group
    # the verdict engine's series of every row it reads (series.QUERY: no lab run), for site_flags:
    # {series key: points}, and the keys of our providers' series (series.group_series)
    series: dict[series.SeriesKey, list[series.Point]] = field(default_factory=dict)
    ours: set[series.SeriesKey] = field(default_factory=set)
    history_commits: list[str] = field(default_factory=list)  # the git commits of those rows, as stored
    history_digest: tuple = ()  # HISTORY_DIGEST of those rows: the analysis cache's key (site_cache)
    trends_digest: tuple = ()  # POINTS_DIGEST of the exact trends' points: part of that key

    def group(self, key: str) -> Group:
        return next(g for g in self.groups if g.key == key)


DTYPE_ORDER = ("bfloat16", "float16", "float32")
PROVIDER_ORDER = ("triton", "torch", "compile", "liger")


def _ordered(values, preferred) -> list[str]:
    values = set(values)
    return [v for v in preferred if v in values] + sorted(values - set(preferred))


def load(store: Store) -> SiteData:
    runs = store.query(RUNS_CTE + """
        SELECT rc.run_id, rc.env_id, rc.gkey, rc.device_kind, rc.gpu_name, rc.commit, rc.ci, rc.ctime,
               rc.started_at, rc.finished_at, rc.status, rc.grid, rc.copy_gbps, rc.matmul_tflops, rc.git_dirty,
               rc.machine, rc.commit_subject, rc.commit_author, rc.commit_url, rc.shard, rc.device_index,
               count(r.run_id) AS n_rows, count(*) FILTER (WHERE r.status = 'ok') AS n_ok,
               count(*) FILTER (WHERE r.status IN ('failed', 'error')) AS n_bad,
               count(*) FILTER (WHERE r.status = 'unstable') AS n_unstable
        FROM rc LEFT JOIN results r USING (run_id) GROUP BY ALL ORDER BY rc.started_at DESC""")
    groups = _groups(runs)
    latest = _latest(store)
    for (gkey, kernel) in latest:
        next(g for g in groups if g.key == gkey).kernels.append(kernel)
    for g in groups:
        g.kernels.sort()
    kinfo = {}
    for (gkey, kernel), rows in sorted(latest.items()):
        r = rows[0]
        kinfo.setdefault(kernel, {"baseline": r["baseline"], "bound": r["bound"],
                                  "unit": "TFLOP/s" if r["bound"] == "compute" else "GB/s"})
    kernels = sorted(kinfo)
    all_rows = [r for rows in latest.values() for r in rows]
    trends, exact_trends, conditions, trends_digest = _trends(store)
    run_ci = {r["run_id"]: r["ci"] for r in runs}
    engine, ours, commits = series.group_store(store.con)
    return SiteData(
        groups=groups, kernels=kernels, kernel_info=kinfo,
        providers=_ordered({r["provider"] for r in all_rows}, PROVIDER_ORDER),
        modes=_ordered({r["mode"] for r in all_rows}, MODES),
        dtypes=_ordered({r["dtype"] for r in all_rows}, DTYPE_ORDER),
        latest=latest, trends=trends, exact_trends=exact_trends, conditions=conditions,
        last_ci={(*key, r["shape"], r["dtype"]): run_ci[r["run_id"]] for key, rows in latest.items() for r in rows},
        sparks=_sparks(store), environments=_environments(store), runs=runs, lab=_lab(store), run_ci=run_ci,
        series=engine, ours=ours, history_commits=commits,
        history_digest=tuple(store.query(HISTORY_DIGEST)[0].values()), trends_digest=trends_digest)


def _groups(runs: list[dict[str, Any]]) -> list[Group]:
    by_key: dict[str, Group] = {}
    taken: set[str] = set()
    # GPUs by name, the CPU interpreter last: it is the least interesting and never mixed in.
    keys = sorted({r["gkey"] for r in runs}, key=lambda k: (k.startswith("cpu:"), k))
    for key in keys:
        kind, _, name = key.partition(":")
        label = CPU_LABEL if kind == "cpu" else name
        by_key[key] = Group(key=key, id=slug("cpu-interpreter" if kind == "cpu" else name, taken),
                            label=label, kind="cpu" if kind == "cpu" else "gpu")
    commits: dict[str, dict[int, dict]] = {k: {} for k in keys}
    for r in runs:  # newest first
        g = by_key[r["gkey"]]
        if g.latest is None or (r["ci"], r["started_at"]) > (g.latest["ci"], g.latest["started_at"]):
            g.latest = r
        if r["machine"] and r["machine"] not in g.machines:
            g.machines.append(r["machine"])
        c = commits[r["gkey"]].setdefault(r["ci"], {
            "sha": r["commit"], "short": r["commit"][:8], "runs": 0,
            "date": r["ctime"].strftime("%Y-%m-%d %H:%M") if r["ctime"] else "", "time": r["ctime"],
            "subject": None, "author": None, "url": None})
        c["runs"] += 1
        for k in ("subject", "author", "url"):  # any run of the commit that recorded it
            c[k] = c[k] or r["commit_" + k]
    for key, g in by_key.items():
        g.commits = [commits[key][i] for i in sorted(commits[key])]
        g.machines.sort()
    return list(by_key.values())


LATEST_COLUMNS = ("kernel, mode, provider, shape, dims, dtype, baseline, bound, status, error, rel_err, tolerance, "
                  "timing, median_ms, p20_ms, p80_ms, reps, bytes, flops, seq, gbps, tflops, frac_of_peak, "
                  "copy_gbps, matmul_tflops, run_id, git_commit, started_at, machine, config, peak_mem_bytes, "
                  "recheck_ms, clock_mhz, mean_ms, std_ms, min_ms, p99_ms, max_ms, tokens, ours")
# times and rates, with the latency distribution beside the median (p99 and max: rows since schema 4)
TIME_COLUMNS = ("median_ms", "p20_ms", "p80_ms", "gbps", "tflops", "frac_of_peak", "recheck_ms",
                "mean_ms", "std_ms", "min_ms", "p99_ms", "max_ms")
FLOAT_COLUMNS = (*TIME_COLUMNS, "rel_err")


def _clean(r: dict[str, Any]) -> dict[str, Any]:
    """Non-finite numbers become None, and so does every time of a row that did not pass the gate
    or was disturbed: no page, chart or data file can show it as a speed."""
    for k in FLOAT_COLUMNS:
        if r.get(k) is not None and not math.isfinite(r[k]):
            r[k] = None
    if r["status"] != "ok":
        for k in TIME_COLUMNS:
            r[k] = None
    r["error"] = plain(r.get("error"))  # rows stored before runner._error_text dropped colour codes
    return r


def _latest(store: Store) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The rows of each (group, kernel): each (case, mode, provider) from the latest run that
    measured it. A run of part of the grid (--where, --provider, --mode, or stopped early) hides
    none of the others: the H200's A/A runs of ours and eager alone had made eager 'the best other'
    (ours 8x) where the latest full run had Liger and torch.compile ahead of it. Rows of a case may
    so come from different runs of one GPU; each keeps its run."""
    # the latest run of each: its commit, then its start (a run without one starts first); an
    # aggregate, where a window over every row sorts them all (three times the time)
    rows = store.query(RUNS_CTE + f""",
        lk AS (SELECT rc.gkey, r.kernel, r.shape, r.dtype, r.mode, r.provider, max(rc.ci) AS ci,
                      arg_max(r.run_id, (rc.ci, coalesce(rc.started_at, '-infinity'::TIMESTAMP))) AS run_id
               FROM results r JOIN rc USING (run_id) GROUP BY ALL)
        SELECT lk.gkey, {', '.join('v.' + c.strip() for c in LATEST_COLUMNS.split(','))}
        FROM lk JOIN results_v v USING (run_id, kernel, shape, dtype, mode, provider)
        ORDER BY lk.gkey, v.kernel, lk.ci DESC, v.started_at DESC, v.seq""")
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["gkey"], r["kernel"]), []).append(_clean(r))
    return out


def _trends(store: Store) -> tuple[dict, dict, dict[int, dict[str, Any]], tuple]:
    """Per series, one point per commit and measuring condition, as regress.points_from_rows makes
    it: the median of the commit's runs' medians (repeated runs of a commit are repeated
    measurements of it), with a band from the median of their p20s to the median of their p80s,
    widened to hold every run's median. Only rows that passed the correctness gate and were steady
    have times; a failed or unstable commit is a gap, never a point.
    Returns (rounded for the data files, exact for the regression analysis), both keyed
    (gkey, kernel, mode, dtype) -> provider -> shape -> [commit indexes, median, p20, p80, condition
    ids], the conditions by id (small integers, in a stable order), and POINTS_DIGEST of the points."""
    store.con.execute("CREATE OR REPLACE TEMP TABLE kc_points AS " + RUNS_CTE + f"""
        SELECT rc.gkey, r.kernel, r.mode, r.dtype, r.provider, r.shape, rc.ci, {COND_SQL} AS cond,
               median(r.median_ms) AS med,
               least(median(coalesce(r.p20_ms, r.median_ms)), min(r.median_ms)) AS p20,
               greatest(median(coalesce(r.p80_ms, r.median_ms)), max(r.median_ms)) AS p80
        FROM results r JOIN rc USING (run_id)
        WHERE r.status = 'ok' AND r.median_ms > 0 AND isfinite(r.median_ms)
        GROUP BY ALL""")
    conditions, code = _conditions(store)
    # the points in one sorted read, cut into series by their counts (per-series lists built in
    # the store sort every list again: twice the time)
    key = "gkey, kernel, mode, dtype, provider, shape"
    series_rows = store.con.execute(f"SELECT {key}, count(*) FROM kc_points GROUP BY ALL ORDER BY {key}").fetchall()
    cols = store.con.execute(f"""
        SELECT ci, cond, {sig('med')}, {sig('p20')}, {sig('p80')}, med, p20, p80 FROM kc_points
        ORDER BY {key}, ci, cond""").fetchnumpy()
    ci_all, cond_all, med, p20, p80, emed, ep20, ep80 = (col.tolist() for col in cols.values())
    rounded: dict = {}
    exact: dict = {}
    a = 0
    for gkey, kernel, mode, dtype, provider, shape, n in series_rows:
        b = a + n
        ci, cond = ci_all[a:b], [code[c] for c in cond_all[a:b]]
        rounded.setdefault((gkey, kernel, mode, dtype), {}).setdefault(provider, {})[shape] = [
            ci, med[a:b], p20[a:b], p80[a:b], cond]
        exact.setdefault((gkey, kernel, mode, dtype), {}).setdefault(provider, {})[shape] = [
            ci, emed[a:b], ep20[a:b], ep80[a:b], cond]
        a = b
    digest = tuple(store.query(POINTS_DIGEST)[0].values())
    store.con.execute("DROP TABLE kc_points")
    return rounded, exact, conditions, digest


def _conditions(store: Store) -> tuple[dict[int, dict[str, Any]], dict[int, int]]:
    """The measuring conditions that occur, numbered in a stable order; and hash -> number."""
    rows = store.query(RUNS_CTE + f"""
        SELECT DISTINCT {COND_SQL} AS hash, rc.machine, r.timing, {', '.join('rc.' + f for f in ENV_FIELDS)},
               CASE WHEN {STACK_PROVIDER.replace('provider', 'r.provider')} THEN NULL ELSE rc.peers END AS peers
        FROM results r JOIN rc USING (run_id)
        WHERE r.status = 'ok' AND r.median_ms > 0 AND isfinite(r.median_ms)""")
    rows.sort(key=lambda r: tuple(str(r[k]) for k in ("machine", "timing", *ENV_FIELDS, "peers")))
    conditions, code = {}, {}
    for i, r in enumerate(rows):
        code[r.pop("hash")] = i
        r["peers"] = _peers(r["peers"])
        conditions[i] = r
    return conditions, code


def _peers(text: str | None) -> dict[str, str]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _sparks(store: Store) -> dict[tuple[str, str, str, str, str], list[float]]:
    """Median fraction of the measured ceiling per commit, for each overview cell: over every
    mode, shape and dtype of a kernel (mode = dtype = '*'), and per (mode, dtype)."""
    cur = store.con.execute(RUNS_CTE + """
        SELECT gkey, kernel, provider, coalesce(mode, '*'), coalesce(dtype, '*'), list(f ORDER BY ci)
        FROM (SELECT rc.gkey, v.kernel, v.provider, v.mode, v.dtype, rc.ci, median(v.frac_of_peak) AS f
              FROM results_v v JOIN rc USING (run_id)
              WHERE v.status = 'ok' AND isfinite(v.frac_of_peak)
              GROUP BY GROUPING SETS ((rc.gkey, v.kernel, v.provider, rc.ci),
                                      (rc.gkey, v.kernel, v.provider, v.mode, v.dtype, rc.ci)))
        GROUP BY ALL""")
    return {tuple(row[:5]): downsample(row[5], SPARK_POINTS) for row in cur.fetchall()}


def downsample(values: list[float], n: int) -> list[float]:
    """Bucket means: keeps a step visible (taking every k-th point could skip it)."""
    if len(values) <= n:
        return list(values)
    out = []
    for i in range(n):
        chunk = values[i * len(values) // n:(i + 1) * len(values) // n]
        out.append(sum(chunk) / len(chunk))
    return out


def _environments(store: Store) -> list[dict[str, Any]]:
    envs = store.query(RUNS_CTE + """
        SELECT e.*, rc.gkey, count(rc.run_id) AS n_runs, min(rc.started_at) AS first_run,
               max(rc.started_at) AS last_run, list(DISTINCT rc.machine) FILTER (WHERE rc.machine IS NOT NULL) AS machines,
               median(rc.copy_gbps) AS copy_med, min(rc.copy_gbps) AS copy_min, max(rc.copy_gbps) AS copy_max,
               median(rc.matmul_tflops) AS mm_med, min(rc.matmul_tflops) AS mm_min, max(rc.matmul_tflops) AS mm_max
        FROM environments e JOIN rc USING (env_id)
        GROUP BY ALL ORDER BY rc.gkey, last_run DESC""")
    for e in envs:
        e["peers"] = _peers(e["peers"])
        e["machines"] = sorted(e["machines"] or [])
    return envs


def _lab(store: Store) -> list[dict[str, Any]]:
    """Lab runs (A/B studies), newest first, each with its rows: whatever such runs exist."""
    runs = store.query(f"""
        SELECT u.run_id, u.started_at, u.status, u.git_commit, u.commit_subject, u.commit_url, u.machine,
               u.copy_gbps, u.matmul_tflops, u.config AS run_config, e.gpu_name, e.device_kind
        FROM runs u JOIN environments e USING (env_id) WHERE u.grid = '{LAB_GRID}' ORDER BY u.started_at DESC""")
    if not runs:
        return []
    rows = store.query(f"""
        SELECT {LATEST_COLUMNS} FROM results_v WHERE grid = '{LAB_GRID}' ORDER BY run_id, seq""")
    by_run: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append(_clean(r))
    for run in runs:
        run["rows"] = by_run.get(run["run_id"], [])
    return runs


# -- aggregation over the latest rows (pure functions, also used by the tests) ----------------


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def annotate(rows: list[dict[str, Any]], baseline: str | None = None) -> list[dict[str, Any]]:
    """Adds, to each row of one run of one kernel, its rate (GB/s or TFLOP/s), its speedup over the
    baseline (the rows' own, or `baseline`) and over the best other provider. Only rows that passed
    the gate and were steady get either; the others keep None, so a failed or unstable provider can
    never show a speed."""
    by_case: dict[tuple[str, str, str], dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault((r["mode"], r["shape"], r["dtype"]), {})[r["provider"]] = r
    for r in rows:
        ok = r["status"] == "ok" and r["median_ms"]
        r["rate"] = (r["tflops"] if r["bound"] == "compute" else r["gbps"]) if ok else None
        r["tokens_per_s"] = r["tokens"] * 1e3 / r["median_ms"] if ok and r.get("tokens") else None
        r["vs_base"] = r["vs_best"] = None
        r["vs_base_mixed"] = r["vs_best_mixed"] = None
        if not ok:
            continue
        peers = by_case[(r["mode"], r["shape"], r["dtype"])]
        base = peers.get(baseline or r["baseline"])
        if base and base["status"] == "ok" and base["median_ms"]:
            r["vs_base"] = base["median_ms"] / r["median_ms"]
            r["vs_base_mixed"] = _mixed(r, base)
        others = [p for n, p in peers.items() if n != r["provider"] and p["status"] == "ok" and p["median_ms"]]
        if others:
            best = min(others, key=lambda p: p["median_ms"])
            r["vs_best"] = best["median_ms"] / r["median_ms"]
            r["vs_best_mixed"] = _mixed(r, best)
    return rows


def _mixed(r: dict[str, Any], other: dict[str, Any]) -> str | None:
    """A note when two rows were timed by different methods (a provider that CUDA graphs cannot
    capture is timed with events, which include host overhead): their ratio is not like for like."""
    a, b = r.get("timing"), other.get("timing")
    if a and b and a != b:
        return f"{r['provider']} timed by {a}, {other['provider']} by {b}: not like for like"
    return None


STATUSES = ("ok", "unstable", "failed", "error", "unavailable")


def cell(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One overview cell from the annotated rows of one (kernel, provider[, mode, dtype]):
    geometric-mean speedup over the baseline and median fraction of the ceiling, over the rows
    that passed; how many did not; how many of the speedups compare two timing methods."""
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    ok = [r for r in rows if r["status"] == "ok"]
    fracs = [r["frac_of_peak"] for r in ok if r["frac_of_peak"] is not None]
    return {"n": len(rows), **counts,
            "speedup": geomean([r["vs_base"] for r in ok if r["vs_base"]]),
            "mixed": sum(bool(r["vs_base"] and r["vs_base_mixed"]) for r in ok),
            "n_speedups": sum(bool(r["vs_base"]) for r in ok),
            "frac": median(fracs), "over": sum(f > 1 for f in fracs),
            "reason": next((r["error"] for r in rows if r["status"] != "ok" and r["error"]), None)}
