"""How the verdict engine does on the committed history: calibration on one GPU's runs, rates on
the other's.

    python benchmarks/regress_eval.py [--calibration "NVIDIA H200"] [--trials 1000] [--seed 0]
        [--calibration-only] [--scenarios step,plateau]   (while tuning: the calibration GPU alone)

The history (data/runs) is imported into a temporary store and split by GPU: the calibration runs
(the H200's, by default) fit the tails of the null distribution (noise.GATE_TAIL, PERSISTENT_TAIL, JOINT_TAIL);
every rate is then measured on the held-out runs (the H100's) and, for comparison, on the
calibration runs too. Sections:

1. calibration: the standardised changes z of every line the gate judged in the calibration history
   whose code, method and conditions did not change (the references' commit-to-commit changes, and
   ours where git says our code did not change), and of every A/A pair of runs there, and the
   persistence statistics (the least point's and the joint mean's) of the candidates in a window of
   one code; a Student t (scale and degrees of freedom) matched to the 99th and 99.9th percentiles
   of each.
2. A/A: every pair of runs of one commit on one GPU that share a series, compared as if our code
   had changed (`compare --run`, with every line of ours counted as changed): how many comparisons
   would fail. Pairs where a run was interrupted are counted apart (their lines never gate).
3. planted steps: synthetic series made of one GPU's real noise (each reference series' points
   minus its level between its own steps, with each point's reruns and rechecks), a step, plateau,
   sticky clock, slow slide or nothing planted in one of them (not a torch.compile series: its code
   is rebuilt in every run, where ours is fixed), up to 40 others of the kernel over the same commits
   beside it (they carry the machine's drift); our code "changes" at the planted commits and at 30%
   of the others; the target is judged as one of --family lines of ours at each commit. Found: a flag
   of the right kind at the planted commit (or the next), decided there or at the next commit ("by
   +1": within 2 commits) or the one after ("by +2"); a plateau counts when its regression is found
   and, at the end, marked recovered; a slide when one is reported. False flags: any flag on a
   noise-only or sticky-clock series, per series per commit; gate failures: regressions of ours the
   gate flagged, per series. Steps and plateaus are broken down by the target's own noise, beside
   the ceiling: what a test that knew that noise and took it as normal would find at the same rate.
4. the committed history: the gate on the named pairs (the swiglu +11% at fea1ddc4, the backbone's
   own provider, the input-generation pairs f2cc07b on the H100 and 291df4e5 on the H200).
"""
from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
from scipy import stats

from kcollect import codechange, noise, regress
from kcollect.compare import History, Sides, compare_sides, resolve_commit
from kcollect.history import import_path
from kcollect.series import Point, SeriesKey, commit_rank, group_series
from kcollect.store import Store
from kcollect.verdicts import CHANGED, MIN_REFERENCES, UNCHANGED, env_change

ROOT = Path(__file__).resolve().parent.parent
MAX_REFERENCES = 40
BLOCK = 5
# the target series' own noise (the spread of one point, from its consecutive residuals), to tell
# where steps are missed
NOISE_CLASSES = ((0.005, "under 0.5%"), (0.01, "0.5-1%"), (0.02, "1-2%"), (math.inf, "over 2%"))
T0 = datetime(2026, 1, 1)
# the committed history's named pairs: (gpu, A, B, what the gate must say)
PAIRS = [("NVIDIA H200", "98ba2b8d", "fea1ddc4", "swiglu +11% at fea1ddc4 caught"),
         ("NVIDIA H100 80GB HBM3", "0d6a1bbf", "f2cc07b", "input generation only (f2cc07b): no failure"),
         ("NVIDIA H200", "c5778478", "291df4e5", "input generation only (291df4e5): no failure")]


def load(runs: Path) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "k.duckdb") as store:
        import_path(store, runs)
        return store.query(regress.QUERY)


def history(rows: list[dict], record: list | None = None) -> History:
    repo = codechange.Repo(ROOT)
    series, ours = group_series(rows)
    analysed = regress.walk(series, ours, code=repo, record=record)
    return History(rows, analysed, commit_rank(r.points for r in analysed.values()), repo)


def run_pairs(rows: list[dict]):
    """(gpu, commit, run a, run b, rows a, rows b, both finished) for every pair of runs of one commit."""
    by_run: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_run[r["run_id"]].append(r)
    runs = defaultdict(list)
    for rid, rr in by_run.items():
        runs[(regress.device(rr[0]), rr[0]["git_commit"])].append((rr[0]["started_at"], rid))
    for (gpu, commit), ids in sorted(runs.items()):
        for (_, a), (_, b) in itertools.combinations(sorted(ids), 2):
            finished = all(r.get("run_status") == "finished" for r in by_run[a][:1] + by_run[b][:1])
            yield gpu, commit, a, b, by_run[a], by_run[b], finished


# -- 1. calibration ---------------------------------------------------------------------------------


# Providers that build new code in every run (torch.compile autotunes and generates its kernels per
# process): their series flip between builds, which says nothing of the noise of a kernel whose code
# is fixed, such as ours; they are left out of the calibration's null (never out of the engine).
REBUILT = ("compile",)


def null_z(h: History, rows: list[dict]) -> list[float]:
    """Standardised changes of lines whose code, method and conditions did not change."""
    out = []
    for key, r in h.analysed.items():
        for ln in r.lines:
            if (ln is not None and ln.code == UNCHANGED and ln.z is not None and math.isfinite(ln.z)
                    and key.provider not in REBUILT and not env_change(ln)
                    and not (ln.a.point.partial or ln.b.point.partial)):
                out.append(ln.z)
    for gpu, commit, a, b, ra, rb, finished in run_pairs(rows):
        cmp = compare_sides(Sides(ra, rb, a, b, (commit, commit), []), h, "runs", regress.DEFAULT_THRESHOLD)
        out += [ln.z for ln in cmp.lines if finished and ln.key[2] not in REBUILT and ln.z is not None
                and math.isfinite(ln.z)]
    return out


def persistent_z(record: list) -> list[tuple[float, int, float]]:
    """(the least point's statistic, differences behind the series' noise, the joint mean's
    statistic) of the persistence candidates whose window held one code (references, and ours where
    git says it did not change)."""
    return [(z, n, z2) for key, ours, j, i, z, codes, n, z2 in record if math.isfinite(z) and math.isfinite(z2)
            and key.provider not in REBUILT and all(c in (UNCHANGED, None) for c in codes)]


def by_history(zn: list[tuple[float, int, float]], short: int = 6) -> None:
    """The tail of candidates whose noise rests on a short history (mostly the pool's value) against
    the others': whether a short history needs a heavier tail (regress._persistence says why not)."""
    for name, is_short in ((f"fewer than {short} differences", True), (f"{short} or more", False)):
        az = np.abs([z for z, n, _ in zn if (n < short) == is_short])
        print(f"    series' noise from {name}: {len(az)} candidates, |z| 99%: {np.percentile(az, 99):.2f}, "
              f"99.9%: {np.percentile(az, 99.9):.2f}, max {az.max():.1f}")


def calibrate(z: list[float]) -> tuple[float, float]:
    """A Student t matched to the 99th and 99.9th percentiles of |z|: the gate decides in the tail
    (a maximum-likelihood fit follows the body, where most |z| are far below 1)."""
    az = np.abs(z)
    q99, q999 = np.percentile(az, 99), np.percentile(az, 99.9)
    ratio = lambda df: stats.t.ppf(0.9995, df) / stats.t.ppf(0.995, df)  # noqa: E731 (falls as df grows)
    lo, hi = 1.0, 200.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ratio(mid) > q999 / q99 else (lo, mid)
    df = lo
    scale = q99 / stats.t.ppf(0.995, df)
    print(f"  {len(z)} standardised same-code changes; |z| quantiles: "
          + ", ".join(f"{q}%: {np.percentile(az, q):.2f}" for q in (50, 90, 99, 99.9)) + f", max {az.max():.1f}")
    print(f"  Student t matched to the 99th and 99.9th percentiles: df {df:.2f}, scale {scale:.3f}")
    for x in (3, 5, 10, 20):
        model = 2 * stats.t.sf(x / scale, df)
        print(f"    P(|z| > {x:>2}): measured {np.mean(az > x):.2e}, fitted t {model:.2e}")
    return df, scale


# -- 2. A/A -----------------------------------------------------------------------------------------


def aa(h: History, rows: list[dict], threshold: float) -> dict[str, Counter]:
    out: dict[str, Counter] = defaultdict(Counter)
    for gpu, commit, a, b, ra, rb, finished in run_pairs(rows):
        cmp = compare_sides(Sides(ra, rb, a[:8], b[:8], (commit, commit), []), h, "runs", threshold,
                            force_code=CHANGED)
        if not any(ln.a.point and ln.b.point for ln in cmp.lines):
            continue
        gating = [ln for ln in cmp.lines if ln.gates]
        kind = "finished" if finished else "interrupted"
        out[gpu][kind + " pairs"] += 1
        out[gpu][kind + " lines of ours"] += sum(ln.ours and ln.a.point is not None and ln.b.point is not None
                                                 for ln in cmp.lines)
        if gating:
            out[gpu][kind + " failing"] += 1
            worst = max(gating, key=lambda ln: abs(ln.z or 0))
            print(f"    fails: {gpu} {commit[:8]} runs {a[:8]} {b[:8]}: {len(gating)} line(s), e.g. "
                  f"{' '.join(map(str, worst.key))} {worst.change:+.1%} z {worst.z:.1f}")
    return out


# -- 3. planted steps -------------------------------------------------------------------------------


class Oracle:
    """Our code 'changed' at the given commits (c<index>), never the method."""

    def __init__(self, changed: set[int]):
        self.changed = changed

    def status(self, kernel, a, b):
        lo, hi = int(a[1:]), int(b[1:])
        return CHANGED if any(lo < k <= hi for k in self.changed) else UNCHANGED

    def method_changed(self, kernel, a, b):
        return False


class Residuals:
    """One GPU's reference series as residual points over its kernels' commits (see the docstring)."""

    def __init__(self, h: History, gpu: str):
        self.kernels = []
        for kernel in sorted({k.kernel for k in h.analysed if k.gpu == gpu}):
            refs = {k: r for k, r in h.analysed.items() if k.gpu == gpu and k.kernel == kernel and not r.ours
                    and len(r.points) >= 4}
            commits = sorted({(h.rank[p.commit], p.commit) for r in refs.values() for p in r.points})
            col = {c: n for n, (_, c) in enumerate(commits)}
            table = {k: _residual_points(r, col) for k, r in refs.items()}
            if len(table) > MIN_REFERENCES:
                self.kernels.append((kernel, len(commits), table))

    def draw(self, rng: random.Random, n: int):
        while True:
            kernel, width, table = self.kernels[rng.randrange(len(self.kernels))]
            cols = _columns(rng, width, n)
            keys = list(table)
            fixed = [k for k in keys if k.provider not in REBUILT]  # a target's code is fixed, like ours
            target = fixed[rng.randrange(len(fixed))]
            if any(table[target][c] is None for c in cols):
                continue
            others = [k for k in keys if k != target]
            rng.shuffle(others)
            return table[target], [table[k] for k in others[:MAX_REFERENCES]], cols


def _residual_points(r: regress.SeriesResult, col: dict[str, int]) -> list[tuple | None]:
    """Per commit column: (log residual, the runs' medians over the point's, its rechecks, the level
    in ms it is a residual of: a point keeps its real duration, hence its duration class) or None."""
    y = [math.log(p.median_ms) for p in r.points]
    cuts = sorted({0, len(y), *(f.index for f in r.flags),
                   *(i for i in range(1, len(y)) if r.points[i].env != r.points[i - 1].env)})
    out: list[tuple | None] = [None] * len(col)
    for lo, hi in zip(cuts, cuts[1:]):
        level = float(np.median(y[lo:hi]))
        for i in range(lo, hi):
            p = r.points[i]
            out[col[p.commit]] = (y[i] - level, tuple(v / p.median_ms for v in p.runs_ms), p.rechecks, math.exp(level))
    return out


def _columns(rng: random.Random, available: int, n: int) -> list[int]:
    if n <= available:
        start = rng.randrange(available - n + 1)
        return list(range(start, start + n))
    out: list[int] = []
    while len(out) < n:
        start = rng.randrange(max(available - BLOCK, 0) + 1)
        out += range(start, min(start + BLOCK, available))
    return out[:n]


def _points(cells, cols, plant) -> list[Point]:
    pts = []
    for i, c in enumerate(cols):
        cell = cells[c]
        if cell is None:
            continue
        resid, runs, rechecks, level = cell
        m = level * math.exp(resid + plant[i])
        pts.append(Point(commit=f"c{i}", commit_time=T0 + timedelta(hours=i), median_ms=m, p20_ms=m, p80_ms=m,
                         runs=len(runs) or 1, runs_ms=tuple(v * m for v in runs) or (m,), rechecks=rechecks))
    return pts


def trial(res: Residuals, rng: random.Random, scenario: str, size: float, threshold: float, family: int) -> tuple:
    """-> (found, false flags, points, gate failures of the target, its noise class)"""
    n = rng.randint(6, 30)
    target, refs, cols = res.draw(rng, n)
    plant = [0.0] * n
    at, length = rng.randint(2, n - 3), 0
    changed = {k for k in range(1, n) if rng.random() < 0.3}
    ref_plant = [0.0] * n
    if scenario == "step":
        sign = 1 if rng.random() < 0.5 else -1
        plant[at:] = [sign * math.log1p(size)] * (n - at)
        changed.add(at)
    elif scenario == "plateau":
        n = max(n, 8)
        target, refs, cols = res.draw(rng, n)
        plant, ref_plant = [0.0] * n, [0.0] * n
        at, length = rng.randint(2, n - 5), rng.randint(2, 3)
        plant[at:at + length] = [math.log1p(size)] * length
        changed |= {at, at + length}
    elif scenario == "sticky":
        length = rng.randint(2, 4)
        at = rng.randint(1, n - length)
        clock = math.log1p(rng.uniform(0.05, 0.20))
        plant[at:at + length] = [clock] * length
        ref_plant = plant
    elif scenario == "slide":  # +size per commit over 10 commits, our code changing at each
        n = max(n, 16)
        target, refs, cols = res.draw(rng, n)
        plant, ref_plant = [0.0] * n, [0.0] * n
        at = rng.randint(2, n - 11)
        plant = [math.log1p(size) * min(max(i - at + 1, 0), 10) for i in range(n)]
        changed = set(range(1, n))
    key = SeriesKey("k", "fwd", "ours", "s", "bf16", "gpu", None, "cuda-graph")
    series = {key: _points(target, cols, plant)}
    for r, cells in enumerate(refs):
        points = _points(cells, cols, ref_plant)
        if points:  # a reference may have measured none of the drawn commits
            series[key._replace(provider="ref", shape=f"s{r}")] = points
    # the target is one line among `family` of ours at each commit, the others unchanged: BH then
    # rejects it where its p-value is at most Q / family
    out = regress.walk(series, {key}, {"k": threshold}, Oracle(changed), q=regress.Q / family)
    flags = out[key].flags
    gate_failures = sum(1 for f in flags if f.by_gate and f.kind == "regression" and f.cause is None)
    # the target's own noise: the spread of its residuals' consecutive differences (flips included)
    resid = [target[c][0] for c in cols]
    spread = float(np.std(np.diff(resid))) / math.sqrt(2)
    noise_class = next(name for limit, name in NOISE_CLASSES if spread < limit)
    # the ceiling: a test that knew this noise exactly and took it as normal (no heavy tail), the
    # level of up to WINDOW points before against the mean of the two after, at the same rate
    se = spread * math.sqrt(1 / 2 + 1 / min(at, regress.WINDOW))
    ceiling = float(stats.norm.sf(stats.norm.isf(regress.Q / family / 2) - math.log1p(size) / se)) if se > 0 else 1.0
    if scenario in ("step", "plateau"):
        kind = "regression" if scenario == "plateau" or sign > 0 else "improvement"
        hit = [any(f.kind == kind and f.index in (at, at + 1) and f.decided_index <= at + late
                   and (scenario == "step" or f.status == "recovered") for f in flags) for late in (1, 2)]
        return hit, 0, n, gate_failures, noise_class, ceiling
    if scenario == "slide":
        return [bool(out[key].slides)] * 2, 0, n, gate_failures, noise_class
    return [False, False], len(flags), n, gate_failures, noise_class


SCENARIOS = (("step", 0.10, "10% step"), ("step", 0.05, "5% step"),
             ("plateau", 0.20, "+20% plateau of 2-3 commits, reverted"),
             ("sticky", 0.0, "sticky clock (all series 5-20%, 2-4 commits)"),
             ("none", 0.0, "noise only"),
             ("slide", 0.01, "slow slide +1%/commit over 10 (reported)"))


def planted(res: Residuals, trials: int, seed: int, threshold: float, family: int, only: set[str] | None = None
            ) -> None:
    rng = random.Random(seed)
    print(f"  {'scenario':<44} {'by +1':>8} {'by +2':>6} {'false flags/series/commit':>26} "
          f"{'gate failures/series':>21}")
    for scenario, size, label in SCENARIOS:
        if only and scenario not in only:
            continue
        r = [trial(res, rng, scenario, size, threshold, family) for _ in range(trials)]
        found = (f"{np.mean([x[0][0] for x in r]):8.1%} {np.mean([x[0][1] for x in r]):6.1%}"
                 if scenario in ("step", "plateau", "slide") else f"{'-':>8} {'-':>6}")
        false = sum(x[1] for x in r) / sum(x[2] for x in r)
        print(f"  {label:<44} {found} {false:>26.3%} {np.mean([x[3] for x in r]):>21.3f}")
        if scenario in ("step", "plateau"):  # where steps are missed: by the target's own noise
            print(f"      a test that knew each series' noise, taken as normal: {np.mean([x[5] for x in r]):.1%}")
            print("      by +1, by the series' noise: " + "; ".join(
                f"{name} {np.mean([x[0][0] for x in r if x[4] == name]):.1%} of {sum(x[4] == name for x in r)}"
                for _, name in NOISE_CLASSES if any(x[4] == name for x in r)))


# -- 4. the committed history -----------------------------------------------------------------------


def named_pairs(h: History, rows: list[dict], threshold: float) -> None:
    known = {r["git_commit"]: r["commit_time"] for r in rows if r["git_commit"]}
    for gpu, a, b, what in PAIRS:
        ca, cb = (resolve_commit(x, known)[0] for x in (a, b))
        side = [[r for r in rows if r["git_commit"] == c and regress.device(r) == gpu] for c in (ca, cb)]
        cmp = compare_sides(Sides(side[0], side[1], ca[:8], cb[:8], (ca, cb), []), h, "commits", threshold)
        gating = sorted({f"{ln.key[0]} {ln.key[1]} {ln.key[3]} {ln.change:+.1%}" for ln in cmp.lines if ln.gates})
        print(f"  {what}: {gpu} {ca[:8]} -> {cb[:8]}: {len(gating)} failing line(s)"
              + (f": {'; '.join(gating[:6])}" if gating else ""))
    backbone = [(r.points[i].commit[:8], ln.verdict, f"{ln.change:+.1%}") for k, r in h.analysed.items()
                if k.kernel == "backbone" and r.ours for i, ln in enumerate(r.lines)
                if ln is not None and ln.code == CHANGED and ln.verdict in ("regression", "improvement")]
    print(f"  the backbone's own provider (kcollect): {len(backbone)} gate verdicts of ours where its code changed, "
          f"e.g. {backbone[:3]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "data" / "runs")
    ap.add_argument("--calibration", default="NVIDIA H200", help="the GPU whose runs the tail is fitted on")
    ap.add_argument("--trials", type=int, default=1000, help="series per planted scenario")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=float, default=regress.DEFAULT_THRESHOLD)
    ap.add_argument("--family", type=int, default=36,
                    help="lines of ours a commit's gate decides together (36: the median on the H200 history)")
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--scenarios", default="", help="comma-separated planted scenarios to run (default: all of "
                    + ", ".join(dict.fromkeys(s for s, _, _ in SCENARIOS))
                    + "); a scenario left out changes the series drawn for those after it")
    ap.add_argument("--calibration-only", action="store_true",
                    help="plant steps in the calibration GPU's noise only (while tuning: the held-out rates are "
                         "looked at once, at the end)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = load(args.runs)
    gpus = sorted({regress.device(r) for r in rows} - {"cpu"})
    held_out = [g for g in gpus if g != args.calibration]
    shown = args.runs.relative_to(ROOT) if args.runs.is_relative_to(ROOT) else args.runs
    print(f"history {shown}: {len({r['run_id'] for r in rows})} runs; calibration: {args.calibration}; "
          f"held out: {', '.join(held_out)}; threshold {args.threshold:.0%}, Q {regress.Q:.0%}")
    cal_rows = [r for r in rows if regress.device(r) == args.calibration]
    print(f"\n1. calibration on {args.calibration} (the engine's constants: GATE_TAIL {noise.GATE_TAIL}, "
          f"PERSISTENT_TAIL {noise.PERSISTENT_TAIL}, JOINT_TAIL {noise.JOINT_TAIL})")
    record: list = []
    h_cal = history(cal_rows, record)
    print(" the gate: one point against the one before")
    calibrate(null_z(h_cal, cal_rows))
    print(" persistence: the two points after a step, both beyond halfway")
    zn = persistent_z(record)
    calibrate([z for z, n, _ in zn])
    by_history(zn)
    print(" persistence, joint: the mean of the two points after a step, each beyond half of it")
    calibrate([z2 for _, _, z2 in zn])
    h = history(rows)
    print("\n2. A/A: pairs of runs of one commit, compared as if our code had changed")
    for gpu, c in sorted(aa(h, rows, args.threshold).items()):
        role = "calibration" if gpu == args.calibration else "held out"
        print(f"  {gpu} ({role}): " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    if not args.skip_steps:
        for gpu in ([] if args.calibration_only else held_out) + [args.calibration]:
            role = "calibration" if gpu == args.calibration else "held out"
            print(f"\n3. planted steps in the real noise of {gpu} ({role}), {args.trials} series (6-30 points) "
                  f"per scenario, each one of {args.family} lines of ours at its commits, seed {args.seed}")
            planted(Residuals(h, gpu), args.trials, args.seed, args.threshold, args.family,
                    set(filter(None, args.scenarios.split(","))))
    print("\n4. the committed history")
    named_pairs(h, rows, args.threshold)
    print(f"\nevaluation took {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
