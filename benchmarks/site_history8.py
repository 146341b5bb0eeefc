"""Build time and weight of `kcollect build-site` on the committed history and on 8 times it.

The 8x history is the committed one (data/runs) followed by 7 copies of itself: each copy's runs
come at new commits (new hashes, every commit time moved past the end of the copy before), with
their times scaled by a fixed factor per copy within +-1% (so that the copies are neither identical
nor stepped). Numbers are measured, never assumed: each build runs `kcollect build-site` as a
process, and its CPU time (user + system, its children included) comes from the operating system.

    python benchmarks/site_history8.py                 # writes lab/results/site_build.txt
    python benchmarks/site_history8.py --copies 4 --out -
    python benchmarks/site_history8.py --compare ../main/.venv/bin/kcollect   # and an older build-site

Builds of each history, in this order: cold (an empty cache folder: the partial plotly.js is made,
every part of the history analysed); rendered again with the analysis cached (the output folder
removed first); unchanged (the same build again: nothing it reads changed, so it checks that and
stops); and after one more run (a copy of the newest H200 run at a new commit: the parts it touches
are analysed again, the others come from the cache).
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent


def history(db: Path, copies: int) -> int:
    """The committed history in db, followed by copies - 1 copies of itself. Returns its runs."""
    from kcollect.history import import_path
    from kcollect.store import RESULT_COLUMNS, RUN_COLUMNS, Store

    with Store(db) as store:
        import_path(store, ROOT / "data" / "runs")
        con = store.con
        span = con.execute("SELECT epoch(max(coalesce(commit_time, started_at)) - min(coalesce(commit_time, started_at)))"
                           " + 86400 FROM runs").fetchone()[0]
        runs = [c for c in RUN_COLUMNS if c not in ("run_id", "git_commit", "commit_time", "started_at", "finished_at")]
        timed = ("median_ms", "p20_ms", "p80_ms", "mean_ms", "min_ms", "p99_ms", "max_ms", "std_ms", "recheck_ms")
        results = [c for c in RESULT_COLUMNS if c not in ("run_id", *timed)]
        for k in range(1, copies):
            shift = f"INTERVAL {int(span * k)} SECOND"
            scale = 1 + 0.01 * ((k * 7919) % 201 - 100) / 100  # fixed per copy, within +-1%
            con.execute(f"""INSERT INTO runs (run_id, git_commit, commit_time, started_at, finished_at, {', '.join(runs)})
                SELECT md5(run_id || '{k}'), CASE WHEN git_commit IS NULL THEN NULL
                       ELSE md5(git_commit || '{k}') || left(md5(git_commit), 8) END,
                       commit_time + {shift}, started_at + {shift}, finished_at + {shift}, {', '.join(runs)}
                FROM runs WHERE length(run_id) <> 32""")
            con.execute(f"""INSERT INTO results (run_id, {', '.join(timed)}, {', '.join(results)})
                SELECT md5(run_id || '{k}'), {', '.join(f'{c} * {scale}' for c in timed)}, {', '.join(results)}
                FROM results WHERE length(run_id) <> 32""")
        con.execute("CHECKPOINT")
        return con.execute("SELECT count(*) FROM runs").fetchone()[0]


def build(db: Path, out: Path, cache: Path, kcollect: str | None = None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one `kcollect build-site` process (`kcollect`: another
    installation's command, given the options every version takes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    ours = ["--config", str(ROOT / "data" / "site.toml")] if kcollect is None else []
    subprocess.run([kcollect or str(Path(sys.executable).with_name("kcollect")), "build-site", "--db", str(db),
                    "--out", str(out), "--data", "", "--no-git", *ours],
                   check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, KCOLLECT_CACHE_DIR=str(cache)))
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def one_more_run(db: Path) -> None:
    """A copy of the newest H200 run, at a commit after every other."""
    from kcollect.store import RESULT_COLUMNS, RUN_COLUMNS, Store

    with Store(db) as store:
        con = store.con
        last = con.execute("""SELECT run_id FROM runs JOIN environments USING (env_id) WHERE gpu_name = 'NVIDIA H200'
                              ORDER BY coalesce(commit_time, started_at) DESC LIMIT 1""").fetchone()[0]
        other = [c for c in RUN_COLUMNS if c not in ("run_id", "git_commit", "commit_time", "started_at")]
        con.execute(f"""INSERT INTO runs (run_id, git_commit, commit_time, started_at, {', '.join(other)})
            SELECT 'one-more-run', md5('one more') || '00000000', commit_time + INTERVAL 1 DAY,
                   started_at + INTERVAL 1 DAY, {', '.join(other)} FROM runs WHERE run_id = ?""", [last])
        cols = [c for c in RESULT_COLUMNS if c != "run_id"]
        con.execute(f"""INSERT INTO results (run_id, {', '.join(cols)}) SELECT 'one-more-run', {', '.join(cols)}
                        FROM results WHERE run_id = ?""", [last])
        con.execute("CHECKPOINT")


def _ask(kcollect: str, code: str) -> str:
    """What another installation's Python prints for `code`."""
    python = Path(kcollect).with_name("python")
    return subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def installation(kcollect: str) -> str:
    """Another kcollect named by the commit of the checkout it is installed from (never its path:
    the results name nothing outside the repository)."""
    where = _ask(kcollect, "import kcollect, pathlib; print(pathlib.Path(kcollect.__file__).resolve().parent)")
    commit = subprocess.run(["git", "-C", where, "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    return f"the kcollect of commit {commit or '(unknown)'}"


def readable_by(db: Path, kcollect: str) -> Path:
    """The store as another installation can open it: where its schema is older, a copy labelled
    with its version (the columns added since stay: a reader of the older schema leaves them alone)."""
    from kcollect.store import SCHEMA_VERSION

    theirs = int(_ask(kcollect, "from kcollect.store import SCHEMA_VERSION; print(SCHEMA_VERSION)"))
    if theirs >= SCHEMA_VERSION:
        return db
    copy = db.with_name(f"{db.stem}-schema{theirs}.duckdb")
    shutil.copyfile(db, copy)
    con = duckdb.connect(str(copy))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(theirs)])
    con.close()
    return copy


def weight(out: Path) -> list[str]:
    files = [f for f in out.rglob("*") if f.is_file()]
    total = sum(f.stat().st_size for f in files)
    pages = sorted(((f.stat().st_size, f.relative_to(out).as_posix()) for f in files if f.suffix == ".html"), reverse=True)
    big = sorted(((f.stat().st_size, f.relative_to(out).as_posix()) for f in files), reverse=True)[:3]
    return [f"  site: {len(files)} files, {total / 2**20:.2f} MiB",
            f"  largest page: {pages[0][1]} {pages[0][0] / 2**10:.0f} KiB; regressions.html "
            f"{(out / 'regressions.html').stat().st_size / 2**10:.0f} KiB",
            "  largest files: " + ", ".join(f"{p} {s / 2**10:.0f} KiB" for s, p in big)]


def measure(copies: int, work: Path, compare: str | None) -> list[str]:
    db, out = work / f"h{copies}.duckdb", work / f"site{copies}"
    t = time.perf_counter()
    n = history(db, copies)
    lines = [f"{copies}x the committed history: {n} runs, store {db.stat().st_size / 2**20:.0f} MiB "
             f"(made in {time.perf_counter() - t:.1f} s)"]
    cache = work / f"cache{copies}"
    cold = build(db, out, cache)
    size = weight(out)
    shutil.rmtree(out)
    rendered = build(db, out, cache)
    again = build(db, out, cache)
    one_more_run(db)
    more = build(db, out, cache)
    lines += [f"  cold (empty cache): {cold[0]:.2f} s CPU, {cold[1]:.2f} s wall",
              f"  output removed, analysis cached: {rendered[0]:.2f} s CPU, {rendered[1]:.2f} s wall",
              f"  unchanged rebuild: {again[0]:.2f} s CPU, {again[1]:.2f} s wall",
              f"  after one more run: {more[0]:.2f} s CPU, {more[1]:.2f} s wall", *size]
    if compare:
        other = work / f"other{copies}"
        cpu, wall = build(readable_by(db, compare), other, work / f"cache-other{copies}", compare)
        lines += [f"  {installation(compare)} on the same store: {cpu:.2f} s CPU, {wall:.2f} s wall", *weight(other)]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "lab" / "results" / "site_build.txt"), help="'-' for stdout")
    ap.add_argument("--compare", metavar="KCOLLECT", help="another installation's kcollect command, timed on the same stores")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lines = [f"`python benchmarks/site_history8.py --copies {args.copies}` on {os.cpu_count()} cores "
                 f"(load average {os.getloadavg()[0]:.1f} at the start), commit "
                 + subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True).stdout.strip(), ""]
        for copies in (1, args.copies):
            lines += measure(copies, Path(tmp), args.compare)
            lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
