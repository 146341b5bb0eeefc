"""`kcollect find KERNEL SHAPE GOOD BAD`: which commit made one series slower (or faster), by
bisection on this machine, as asv's `find` does.

The series is checked first (the kernel, its mode, provider and dtype, and the shape in the grid
this machine runs), so that a typo costs no measurement. The commits from GOOD to BAD (first
parents) are checked out in temporary git worktrees and measured there with `kcollect run --shape`,
each in a process of its own: that commit's kcollect and kernels when the worktree is a Python
project (installed into a temporary folder first), the installed kcollect otherwise (a repository
of one's own kernels, given with --kernel-module, whose paths are read from each commit's tree).
Every commit measured gets --samples runs, GOOD's and BAD's interleaved so that a drift of the
machine touches both alike. Unless Welch's t-test on the runs' log times says GOOD and BAD differ
(and by more than MIN_CHANGE), find stops with "not significant" instead of bisecting noise; else
each midpoint is judged by whether its runs' mean log time is nearer GOOD's or BAD's, and the range
is halved until the first commit that is like BAD is found.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
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
# Two-sided p of Welch's t-test on GOOD's and BAD's log times under which they differ. Strict: a find
# that names a commit sends someone to read it, and same-code runs on a loaded machine differ by
# several percent; with 3 runs each a 2x step has p ~1e-4, noise of a few percent p ~0.3 and more.
ALPHA = 0.01
SAMPLES = 3  # runs per commit measured (--samples)


class FindError(Exception):
    """One commit could not be measured; `code` is the exit status (2: the run refused its input)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass
class Point:
    commit: str
    subject: str
    samples: list[float]  # the median of each run at this commit, ms

    @property
    def median_ms(self) -> float:
        """The geometric mean of its runs' medians (the centre the t-test compares)."""
        return math.exp(statistics.fmean(math.log(t) for t in self.samples))


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
    """Measures the series at commits of `repo`, each in a worktree of its own (kept, and its install,
    for the commit's several runs, until close)."""

    def __init__(self, repo: Path, series: Series, run_options: list[str], install: bool):
        self.repo, self.series, self.run_options, self.install = repo, series, run_options, install
        self.tmp = Path(tempfile.mkdtemp(prefix="kcollect-find-"))
        self.trees: dict[str, tuple[Path, dict[str, str], bool]] = {}  # commit -> (tree, env, takes --shape)
        self.runs = 0

    def subject(self, commit: str) -> str:
        return git(self.repo, "show", "-s", "--format=%s", commit)

    def sample(self, commit: str) -> float:
        """One `kcollect run` of the series at commit: its median, ms."""
        if commit not in self.trees:
            tree = self.tmp / f"wt-{commit[:12]}"
            git(self.repo, "worktree", "add", "--detach", "--quiet", str(tree), commit)
            env, own = self._env(tree)
            self.trees[commit] = (tree, env, _takes_shape(env, tree) if own else _takes_shape_here())
        self.runs += 1
        return self._run(commit, *self.trees[commit])

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

    def _run(self, commit: str, tree: Path, env: dict[str, str], takes_shape: bool) -> float:
        s = self.series
        db = tree.with_name(f"{tree.name}-{self.runs}.duckdb")
        when = datetime.fromtimestamp(int(git(self.repo, "show", "-s", "--format=%ct", commit)), tz=timezone.utc)
        cmd = [sys.executable, "-m", "kcollect.cli", "run", s.kernel, "--db", str(db), "--mode", s.mode,
               "--provider", s.provider, "--commit", commit, "--commit-time", when.replace(tzinfo=None).isoformat(),
               *(["--dtype", s.dtype] if s.dtype else []), *self.run_options,
               *(["--shape", s.shape] if takes_shape else [])]  # an older kcollect runs the whole grid
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        tail: deque[str] = deque(maxlen=20)
        for line in proc.stderr:
            tail.append(line.rstrip())
            click.echo(f"  | {line.rstrip()}", err=True)
        # 3: a row of ours failed its gate; the series' own row says whether it is this one
        if proc.wait() not in (0, 3):
            raise FindError(f"kcollect run failed at {commit[:12]} (exit {proc.returncode}): "
                            f"{tail[-1] if tail else 'no output'}", code=2 if proc.returncode == 2 else 1)
        return median_of(db, s, commit)

    def close(self) -> None:
        for tree, _, _ in self.trees.values():
            subprocess.run(["git", "-C", str(self.repo), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
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
    from .store import Store

    with Store(db, read_only=True) as store:
        rows = store.query("SELECT * FROM results WHERE kernel = ? AND mode = ? AND provider = ?",
                           [s.kernel, s.mode, s.provider])
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


def significance(good: list[float], bad: list[float]) -> float:
    """Two-sided p of Welch's t-test on the log times: how likely runs of one and the same code
    would differ as much. Runs that did not vary at all differ for certain, or not at all."""
    from scipy.stats import ttest_ind

    a, b = [math.log(t) for t in good], [math.log(t) for t in bad]
    if statistics.pvariance(a) == statistics.pvariance(b) == 0:
        return 0.0 if a[0] != b[0] else 1.0
    return float(ttest_ind(a, b, equal_var=False).pvalue)


@dataclass
class Found:
    first_bad: int | None  # None: GOOD and BAD do not differ significantly
    seen: dict[int, Point]  # every point measured, by index
    p: float  # the t-test's p between GOOD and BAD


def bisect(commits: list[str], sample, subject, samples: int = SAMPLES) -> Found:
    """`sample(i)`: one run's median at commits[i]; `subject(i)`: its subject line."""
    last = len(commits) - 1
    seen = {i: Point(commits[i], subject(i), []) for i in (0, last)}
    for _ in range(samples):  # interleaved: a drift of the machine touches both ends alike
        for i in (0, last):
            seen[i].samples.append(sample(i))
    good, bad = seen[0].median_ms, seen[last].median_ms
    p = significance(seen[0].samples, seen[last].samples)
    if p >= ALPHA or abs(math.log(bad / good)) < math.log1p(MIN_CHANGE):
        return Found(None, seen, p)
    lo, hi = 0, last
    while hi - lo > 1:
        mid = (lo + hi) // 2
        seen[mid] = Point(commits[mid], subject(mid), [sample(mid) for _ in range(samples)])
        if nearer_bad(seen[mid].median_ms, good, bad):
            hi = mid
        else:
            lo = mid
    return Found(hi, seen, p)


def report(commits: list[str], found: Found, fmt: str) -> list[str]:
    seen, first_bad, last = found.seen, found.first_bad, len(commits) - 1
    good, bad = seen[0].median_ms, seen[last].median_ms
    recs = []
    for i in sorted(seen):
        p = seen[i]
        verdict = ("good" if i == 0 else "bad" if i == last else
                   "like bad" if nearer_bad(p.median_ms, good, bad) else "like good")
        if first_bad is None:
            verdict = "not significant"
        elif i == first_bad:
            verdict = "first bad" + (" (BAD itself)" if i == last else "")
        recs.append({"position": i, "commit": p.commit if fmt in ("csv", "json") else p.commit[:12],
                     "median_ms": p.median_ms, "runs": len(p.samples), "min_ms": min(p.samples),
                     "max_ms": max(p.samples), "verdict": verdict, "subject": p.subject})
    text = [{k: f"{r[k]:.4f}" for k in ("median_ms", "min_ms", "max_ms")} for r in recs]
    out = render(recs, fmt, text=text, right=("median_ms", "runs", "min_ms", "max_ms"))
    if fmt not in ("table", "markdown"):
        return out
    if first_bad is None:
        return out + ["", f"not significant: BAD ({bad:.4g} ms) against GOOD ({good:.4g} ms) is {bad / good - 1:+.1%} "
                          f"over {len(seen[0].samples)} runs each (Welch's t-test p = {found.p:.2g}; a commit is "
                          f"named at p < {ALPHA} and a change over {MIN_CHANGE:.0%}): nothing to bisect"]
    before = max(i for i in seen if i < first_bad)
    p, q = seen[before], seen[first_bad]
    return out + ["", f"first bad commit: {q.commit} {q.subject!r}: {q.median_ms:.4g} ms, against {p.median_ms:.4g} "
                      f"ms at {p.commit[:12]} ({q.median_ms / p.median_ms - 1:+.1%}; GOOD against BAD: p = "
                      f"{found.p:.2g})"]


def check_series(series: Series, grid: str, device: str, kernel_modules, root: Path, bad: str) -> Series:
    """The series as `kcollect run` will measure it (its dtype filled in where the kernel runs in
    one), or a one-line error (exit 2) before anything is measured: the kernel, mode, provider and
    dtype must be the kernel's, and the shape one of the grid this machine runs (--kernel-module
    files are read from BAD's tree)."""
    from .common import load_registry
    from .registry import RegistryError
    from .spec import DTYPE_NAMES, shape_label

    folder = Path(tempfile.mkdtemp(prefix="kcollect-find-modules-"))
    try:
        modules = []
        for n, path in enumerate(kernel_modules):
            try:
                text = git(root, "show", f"{bad}:{path}")
            except FindError:
                raise FindError(f"--kernel-module {path}: not in the tree of {bad}", code=2) from None
            copy = folder / str(n) / Path(path).name
            copy.parent.mkdir()
            copy.write_text(text + "\n")
            modules.append(str(copy))
        spec = load_registry(device, modules).get(series.kernel)
    except RegistryError as e:
        raise FindError(str(e), code=2) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for what, value, valid in (("mode", series.mode, spec.modes), ("provider", series.provider, spec.provider_names),
                               ("dtype", series.dtype, [DTYPE_NAMES[d] for d in spec.dtypes])):
        if value is not None and value not in valid:
            raise FindError(f"{series.kernel} has no {what} {value!r}; valid: {', '.join(valid)}", code=2)
    labels = [s.label for s in spec.grid(grid)]
    label = shape_label(parse_label(series.shape))
    if label not in labels:
        default = " (this machine's default; --quick or --full picks)" if grid == ("quick" if device == "cpu" else
                                                                                   "full") else ""
        raise FindError(f"{series.kernel} has no shape {series.shape} in its {grid} grid{default}; valid: "
                        f"{', '.join(labels)}", code=2)
    dtype = series.dtype
    if dtype is None:
        if len(spec.bench_dtypes) > 1:
            raise FindError(f"{series.kernel} runs in several dtypes "
                            f"({', '.join(DTYPE_NAMES[d] for d in spec.bench_dtypes)}); pick one with --dtype", code=2)
        dtype = DTYPE_NAMES[spec.bench_dtypes[0]]
    return Series(series.kernel, label, series.mode, series.provider, dtype)


@click.command("find")
@click.argument("kernel")
@click.argument("shape")
@click.argument("good")
@click.argument("bad")
@click.option("--mode", default="fwd", show_default=True, help=f"The series' mode: {', '.join(MODES)}.")
@click.option("--provider", default="triton", show_default=True, help="The series' provider.")
@click.option("--dtype", default=None, help="The series' dtype (needed when the kernel runs in several).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--quick/--full", "quick", default=None,
              help="The grid SHAPE is one of. Default: quick on the CPU, full on CUDA (as `kcollect run`).")
@click.option("--samples", type=click.IntRange(min=2), default=SAMPLES, show_default=True,
              help="Runs of `kcollect run` per commit measured: the noise the t-test weighs a change against.")
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
def find_cmd(kernel, shape, good, bad, mode, provider, dtype, device, quick, samples, warmup_ms, rep_ms, min_reps,
             kernel_modules, repo, install, fmt) -> None:
    """Find the first commit between GOOD and BAD where one series (KERNEL at SHAPE, a shape of the
    grid this machine runs, e.g. M=16,N=256 on the CPU; with --mode, --provider, --dtype) took
    BAD's time rather than GOOD's, by bisection: each commit measured is checked out in a temporary
    git worktree and run --samples times with `kcollect run --shape` on this machine. When GOOD's
    and BAD's runs do not differ significantly (Welch's t-test on their log times, p < 0.01, and by
    over 5%), it says "not significant" and bisects nothing. --kernel-module paths are relative to
    the repository's root and read from each commit's tree. Exits 0 with its report either way, 1
    when a commit cannot be measured, 2 for bad input."""
    from .common import resolve_device

    if mode not in MODES:
        fail(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if dtype is not None and dtype not in DTYPES:
        fail(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    try:
        parse_label(shape)
    except ShapeError as e:
        fail(str(e))
    try:
        root = Path(git(Path(repo), "rev-parse", "--show-toplevel"))
        commits = commits_between(root, good, bad)
    except FindError as e:
        fail(str(e), e.code)
    device = resolve_device(device)
    grid = ("quick" if device == "cpu" else "full") if quick is None else ("quick" if quick else "full")
    try:
        series = check_series(Series(kernel, shape, mode, provider, dtype), grid, device, kernel_modules, root,
                              commits[-1])
    except FindError as e:
        fail(str(e), e.code)
    options = ["--device", device, "--quick" if grid == "quick" else "--full"]
    for flag, value in (("--warmup-ms", warmup_ms), ("--rep-ms", rep_ms), ("--min-reps", min_reps)):
        options += [] if value is None else [flag, str(value)]
    for k in kernel_modules:
        options += ["--kernel-module", k]
    bench = Bench(root, series, options, install)
    steps = 2 + math.ceil(math.log2(max(len(commits) - 1, 1)))

    def sample(i: int) -> float:
        click.echo(f"find: run {bench.runs + 1} (about {steps * samples}): {commits[i][:12]}, {i + 1} of "
                   f"{len(commits)} commits", err=True)
        return bench.sample(commits[i])

    try:
        found = bisect(commits, sample, lambda i: bench.subject(commits[i]), samples)
    except FindError as e:
        fail(str(e), e.code)
    finally:
        bench.close()
    click.echo("\n".join(report(commits, found, fmt)))
