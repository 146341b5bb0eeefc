"""`kcollect find KERNEL SHAPE GOOD BAD`: which commit made one series slower (or faster), by
bisection on this machine, as asv's `find` does.

The commits from GOOD to BAD (first parents) are checked out one at a time in a temporary git
worktree and measured there with `kcollect run`, in a process of their own: that commit's kcollect
and kernels when the worktree is a Python project (installed into a temporary folder first), the
installed kcollect otherwise (a repository of one's own kernels, given with --kernel-module,
whose paths are read from each commit's tree). Each midpoint is judged by whether its median is
nearer (in log time) to GOOD's or to BAD's, and the range is halved until the first commit that
is like BAD is found.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import click

from .common import fail, kernel_module_option
from .formats import format_option, render
from .shapes import ShapeError, parse_label
from .names import DTYPE_CHOICES as DTYPES, MODES

# GOOD and BAD closer than this leave nothing to find: the rule that marks a change significant
# elsewhere (compare's default threshold) would not flag it either.
MIN_CHANGE = 0.05


class FindError(Exception):
    """One commit could not be measured; `code` is the exit status (2: the run refused its input)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass
class Point:
    commit: str
    subject: str
    median_ms: float


@dataclass(frozen=True)
class Series:
    kernel: str
    shape: str
    mode: str
    provider: str
    dtype: str | None


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise FindError((out.stderr.strip().splitlines() or ["git " + " ".join(args) + " failed"])[-1], code=2)
    return out.stdout.strip()


def commits_between(repo: Path, good: str, bad: str) -> list[str]:
    """[GOOD, ..., BAD] along BAD's first parents; GOOD must be an ancestor of BAD."""
    def resolve(rev: str) -> str:
        try:
            return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        except FindError:
            raise FindError(f"{rev!r} is not a commit of {repo}", code=2) from None

    good_sha, bad_sha = resolve(good), resolve(bad)
    if good_sha == bad_sha:
        raise FindError(f"GOOD and BAD are the same commit ({good_sha[:12]})", code=2)
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good_sha, bad_sha]).returncode != 0:
        raise FindError(f"{good} is not an ancestor of {bad}: give GOOD first, then the later BAD", code=2)
    return [good_sha] + git(repo, "rev-list", "--first-parent", "--reverse", f"{good_sha}..{bad_sha}").split()


class Bench:
    """Measures the series at commits of `repo`, each in a worktree of its own."""

    def __init__(self, repo: Path, series: Series, run_options: list[str], install: bool):
        self.repo, self.series, self.run_options, self.install = repo, series, run_options, install
        self.tmp = Path(tempfile.mkdtemp(prefix="kcollect-find-"))

    def measure(self, commit: str) -> Point:
        tree = self.tmp / f"wt-{commit[:12]}"
        git(self.repo, "worktree", "add", "--detach", "--quiet", str(tree), commit)
        try:
            return Point(commit, git(self.repo, "show", "-s", "--format=%s", commit), self._run(commit, tree))
        finally:
            subprocess.run(["git", "-C", str(self.repo), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)

    def _env(self, tree: Path) -> tuple[dict[str, str], bool]:
        """The environment of the commit's run, and whether it runs that commit's own install."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if not (self.install and any((tree / f).is_file() for f in ("pyproject.toml", "setup.py"))):
            return env, False
        target = tree.with_name(tree.name + "-site")
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
               "--target", str(target), str(tree)]
        # pip's own build environment first; offline, the build tools installed here
        for extra in ([], ["--no-build-isolation"]):
            out = subprocess.run(pip[:4] + extra + pip[4:], capture_output=True, text=True)
            if out.returncode == 0:
                break
            shutil.rmtree(target, ignore_errors=True)
        else:
            raise FindError(f"pip could not install the tree of {tree.name[3:]} (--no-install runs the "
                            f"installed kcollect instead): {_last_line(out.stderr)}")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
        return env, True

    def _run(self, commit: str, tree: Path) -> float:
        env, own = self._env(tree)
        s = self.series
        db = tree.with_name(tree.name + ".duckdb")
        when = datetime.fromtimestamp(int(git(self.repo, "show", "-s", "--format=%ct", commit)), tz=timezone.utc)
        cmd = [sys.executable, "-m", "kcollect.cli", "run", s.kernel, "--db", str(db), "--mode", s.mode,
               "--provider", s.provider, "--commit", commit, "--commit-time", when.replace(tzinfo=None).isoformat(),
               *(["--dtype", s.dtype] if s.dtype else []), *self.run_options]
        if _takes_shape(env, tree) if own else _takes_shape_here():
            cmd += ["--shape", s.shape]
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        tail: deque[str] = deque(maxlen=20)
        for line in proc.stderr:
            tail.append(line.rstrip())
            click.echo(f"  | {line.rstrip()}", err=True)
        if proc.wait() != 0:
            raise FindError(f"kcollect run failed at {commit[:12]} (exit {proc.returncode}): "
                            f"{tail[-1] if tail else 'no output'}", code=2 if proc.returncode == 2 else 1)
        return median_of(db, s, commit)

    def close(self) -> None:
        subprocess.run(["git", "-C", str(self.repo), "worktree", "prune"], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _takes_shape(env: dict[str, str], tree: Path) -> bool:
    """Whether that commit's `kcollect run` has --shape (without it, the whole grid is run)."""
    out = subprocess.run([sys.executable, "-m", "kcollect.cli", "run", "--help"], cwd=tree, env=env,
                         capture_output=True, text=True)
    return "--shape" in out.stdout


def _takes_shape_here() -> bool:
    from .run_cmd import run

    return any("--shape" in p.opts for p in run.params)


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]


def _same_shape(row: dict, label: str) -> bool:
    if row["shape"] == label:
        return True
    try:  # older stores labelled shapes by their values alone; their dims say which shape it is
        return {k: str(v) for k, v in json.loads(row["dims"]).items()} == \
            {k: str(v) for k, v in parse_label(label).items()}
    except (TypeError, ValueError, AttributeError):
        return False


def median_of(db: Path, s: Series, commit: str) -> float:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        cur = con.execute("SELECT * FROM results WHERE kernel = ? AND mode = ? AND provider = ?",
                          [s.kernel, s.mode, s.provider])
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
    rows = [r for r in rows if _same_shape(r, s.shape) and (s.dtype is None or r["dtype"] == s.dtype)]
    if not rows:
        raise FindError(f"the run at {commit[:12]} has no {s.mode} {s.provider} row of {s.kernel} at {s.shape}")
    if len({r["dtype"] for r in rows}) > 1:
        raise FindError(f"{s.kernel} ran in several dtypes ({', '.join(sorted({r['dtype'] for r in rows}))}); "
                        "pick one with --dtype", code=2)
    row = rows[0]
    if row["status"] != "ok" or not row["median_ms"]:
        raise FindError(f"at {commit[:12]} the row is {row['status']}: {row.get('error') or 'no time'}")
    return row["median_ms"]


def nearer_bad(t: float, good: float, bad: float) -> bool:
    return abs(math.log(t / bad)) < abs(math.log(t / good))


def bisect(commits: list[str], measure) -> tuple[int, dict[int, Point]]:
    """Index of the first commit like BAD, and every point measured (by index)."""
    seen = {0: measure(0), len(commits) - 1: measure(len(commits) - 1)}
    good, bad = seen[0].median_ms, seen[len(commits) - 1].median_ms
    if abs(math.log(bad / good)) < math.log1p(MIN_CHANGE):
        raise FindError(f"GOOD ({good:.4g} ms) and BAD ({bad:.4g} ms) differ by less than {MIN_CHANGE:.0%}: "
                        "nothing to find")
    lo, hi = 0, len(commits) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        seen[mid] = measure(mid)
        if nearer_bad(seen[mid].median_ms, good, bad):
            hi = mid
        else:
            lo = mid
    return hi, seen


def report(commits: list[str], first_bad: int, seen: dict[int, Point], fmt: str) -> list[str]:
    good, bad = seen[0].median_ms, seen[len(commits) - 1].median_ms
    recs = []
    for i in sorted(seen):
        p = seen[i]
        verdict = ("good" if i == 0 else "bad" if i == len(commits) - 1 else
                   "like bad" if nearer_bad(p.median_ms, good, bad) else "like good")
        if i == first_bad:
            verdict = "first bad" + (" (BAD itself)" if i == len(commits) - 1 else "")
        recs.append({"position": i, "commit": p.commit if fmt in ("csv", "json") else p.commit[:12],
                     "median_ms": p.median_ms, "verdict": verdict, "subject": p.subject})
    out = render(recs, fmt, text=[{"median_ms": f"{r['median_ms']:.4f}"} for r in recs], right=("median_ms",))
    if fmt in ("table", "markdown"):
        before = max(i for i in seen if i < first_bad)
        p, q = seen[before], seen[first_bad]
        out += ["", f"first bad commit: {q.commit} {q.subject!r}: {q.median_ms:.4g} ms, against "
                    f"{p.median_ms:.4g} ms at {p.commit[:12]} ({q.median_ms / p.median_ms - 1:+.1%})"]
    return out


@click.command("find")
@click.argument("kernel")
@click.argument("shape")
@click.argument("good")
@click.argument("bad")
@click.option("--mode", default="fwd", show_default=True, help=f"The series' mode: {', '.join(MODES)}.")
@click.option("--provider", default="triton", show_default=True, help="The series' provider.")
@click.option("--dtype", default=None, help="The series' dtype (needed when the kernel runs in several).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--quick/--full", "quick", default=None, help="Grid to run where `run` has no --shape.")
@click.option("--warmup-ms", type=click.FloatRange(min=0), default=None, help="Passed to `kcollect run`.")
@click.option("--rep-ms", type=click.FloatRange(min=0), default=None, help="Passed to `kcollect run`.")
@click.option("--min-reps", type=click.IntRange(min=1), default=None, help="Passed to `kcollect run`.")
@kernel_module_option
@click.option("--repo", default=".", show_default=True, type=click.Path(file_okay=False),
              help="The git repository whose commits are searched.")
@click.option("--install/--no-install", default=True, show_default=True,
              help="Measure each commit with its own code where its tree is a Python project (installed into "
                   "a temporary folder), or always with the installed kcollect.")
@format_option
def find_cmd(kernel, shape, good, bad, mode, provider, dtype, device, quick, warmup_ms, rep_ms, min_reps,
             kernel_modules, repo, install, fmt) -> None:
    """Find the first commit between GOOD and BAD where one series (KERNEL at SHAPE, e.g.
    M=4096,N=8192, with --mode, --provider, --dtype) took BAD's time rather than GOOD's, by
    bisection: each commit measured is checked out in a temporary git worktree and run with
    `kcollect run` on this machine. --kernel-module paths are relative to the repository's root
    and read from each commit's tree."""
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if dtype is not None and dtype not in DTYPES:
        fail(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    try:
        parse_label(shape)
    except ShapeError as e:
        fail(str(e))
    options = ["--device", device, *([] if quick is None else ["--quick" if quick else "--full"])]
    for flag, value in (("--warmup-ms", warmup_ms), ("--rep-ms", rep_ms), ("--min-reps", min_reps)):
        options += [] if value is None else [flag, str(value)]
    for k in kernel_modules:
        options += ["--kernel-module", k]
    series = Series(kernel, shape, mode, provider, dtype)
    try:
        root = Path(git(Path(repo), "rev-parse", "--show-toplevel"))
        commits = commits_between(root, good, bad)
    except FindError as e:
        fail(str(e), e.code)
    bench = Bench(root, series, options, install)
    steps = 2 + math.ceil(math.log2(max(len(commits) - 1, 1)))

    def measure(i: int) -> Point:
        click.echo(f"find: measuring {commits[i][:12]} ({i + 1} of {len(commits)} commits; about {steps} "
                   "to measure)", err=True)
        return bench.measure(commits[i])

    try:
        first_bad, seen = bisect(commits, measure)
    except FindError as e:
        fail(str(e), e.code)
    finally:
        bench.close()
    click.echo("\n".join(report(commits, first_bad, seen, fmt)))
