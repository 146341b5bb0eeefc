"""`kcollect compare --confirm`: re-measure the doubtful cases of ours, base and head interleaved.

A verdict from the history compares two runs made at different times, maybe in different
environments; this measures the two commits now, on this machine, one after the other:

1. the cases: each line of ours (code changed, or git cannot tell) that is a regression, or slower
   by the threshold but within noise, changed with the environment, from an interrupted run, or
   measured in another environment or timing method;
2. a git worktree of each commit (in a temporary folder, removed at the end) and, in each, one
   worker process (kcollect.confirm_worker) that runs that commit's `kcollect run` for just those
   cases each time it is told to;
3. `rounds` rounds of A then B (A B A B ...), each round one short run per side, so that a drift of
   the machine during the confirmation touches both sides alike;
4. per case, the rounds' medians of each side decide: confirmed when B is slower than A by the
   threshold (median of medians) and a one-sided Mann-Whitney U test (scipy) of B's medians over A's
   gives p <= ALPHA; with 3 rounds only a complete separation does that, with 5 one overlap may.

A confirmed line stays a regression (and fails the gate); the others become 'not confirmed'.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Callable

from .store import Store
from .verdicts import WITH_ENV, Comparison, Line

ALPHA = 0.05
WORKER = Path(__file__).with_name("confirm_worker.py")
DOUBTFUL = ("within noise", "environment changed", WITH_ENV, "partial run", "timing changed")


class ConfirmError(Exception):
    """Confirmation could not run, in one line (exit 1)."""


def candidates(lines: list[Line], threshold: float) -> list[Line]:
    def slower(ln: Line) -> bool:
        change = ln.corrected if ln.corrected is not None else ln.change
        return change is not None and change >= threshold

    return [ln for ln in lines if ln.ours and ln.code not in ("unchanged", "method") and ln.a.point and ln.b.point
            and (ln.verdict == "regression" or (ln.verdict in DOUBTFUL and slower(ln)))]


def _git(root: Path | str, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise ConfirmError(f"git {' '.join(args[:2])} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return out.stdout.strip()


_ERROR = re.compile(r"\w+(Error|Exception|Interrupt)\b|\berror\b|Killed|Aborted", re.IGNORECASE)


def last_error(log: str) -> str:
    """A failed run's reason in one line: its log's last line that names an error (a traceback's
    exception, `kcollect: error: ...`), else its last line (a run's summary says less: '0 rows in ...')."""
    lines = [ln.strip() for ln in log.strip().splitlines() if ln.strip()]
    return next((ln for ln in reversed(lines) if _ERROR.search(ln)), lines[-1] if lines else "no output")


class Worker:
    """One side: a worker process in a worktree, told to run one round at a time."""

    def __init__(self, name: str, root: Path, db: Path, log: Path, cases: list[tuple], run_args: list[str]):
        self.name, self.db, self.log = name, db, log
        self.failed, self.error = 0, ""  # rounds whose run exited non-zero; the last one's reason
        self._log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--root", str(root), "--cases", json.dumps(cases), "--", "run",
             *run_args, "--db", str(db)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=root)

    def round(self) -> int:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer.startswith("done "):
            tail = self.log.read_text().strip().splitlines()[-3:]
            raise ConfirmError(f"the worker of {self.name} stopped: {' | '.join(tail) or 'no output'}")
        code = int(answer.split()[1])
        if code:
            self.failed += 1
            self.error = last_error(self.log.read_text())
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


def _run_args(lines: list[Line], commit: str, commit_time, kernel_modules) -> list[str]:
    """`kcollect run`'s options for the lines' cases; the worker names each kernel and its shapes."""
    args: list[str] = []
    for option, index in (("--mode", 1), ("--provider", 2), ("--dtype", 4)):
        for value in sorted({ln.key[index] for ln in lines}):
            args += [option, value]
    args += ["--device", "cpu" if lines[0].a.gpu == "cpu" else "cuda", "--commit", commit]
    if commit_time is not None:
        args += ["--commit-time", commit_time.isoformat()]
    for m in kernel_modules:
        args += ["--kernel-module", m]
    return args


def measure(lines: list[Line], commits: tuple[str, str], rounds: int, kernel_modules=(),
            progress: Callable[[str], None] = lambda m: None
            ) -> tuple[dict[tuple, tuple[list[float], list[float]]], dict[str, str]]:
    """({line key: (A's medians, B's medians)}, one per round and side, measured here; {side: a line
    saying in how many rounds its run failed, and why} for the sides whose run failed)."""
    root = Path(_git(".", "rev-parse", "--show-toplevel"))
    cases = sorted({(ln.key[0], ln.key[3], ln.key[4]) for ln in lines})
    times = (lines[0].a.point.commit_time, lines[0].b.point.commit_time)
    with tempfile.TemporaryDirectory(prefix="kcollect-confirm-") as tmp:
        tmp = Path(tmp)
        trees, workers, failures = [], [], {}
        try:
            for name, commit, when in zip("AB", commits, times):
                tree = tmp / name
                _git(root, "worktree", "add", "--detach", "--quiet", str(tree), commit)
                trees.append(tree)
                workers.append(Worker(name, tree, tmp / f"{name}.duckdb", tmp / f"{name}.log", cases,
                                      _run_args(lines, commit, when, kernel_modules)))
            for r in range(rounds):
                for w in workers:
                    code = w.round()
                    progress(f"confirm round {r + 1}/{rounds}: {w.name} done" + (f" (exit {code})" if code else ""))
        finally:
            for w in workers:
                w.close()
                if w.failed:
                    failures[w.name] = f"{w.name}'s run failed in {w.failed} of {rounds} rounds: {w.error}"
            for tree in trees:
                subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                               capture_output=True, timeout=120)
        return _samples(lines, [w.db for w in workers]), failures


def _samples(lines: list[Line], dbs: list[Path]) -> dict[tuple, tuple[list[float], list[float]]]:
    per_side = []
    for db in dbs:
        got: dict[tuple, list[float]] = {}
        if db.exists():
            with Store(db) as store:  # read-write: a commit of an older schema wrote it; this migrates it
                for r in store.query("SELECT kernel, mode, provider, shape, dtype, median_ms FROM results "
                                     "WHERE status = 'ok' AND median_ms > 0"):
                    got.setdefault((r["kernel"], r["mode"], r["provider"], r["shape"], r["dtype"]), []).append(
                        r["median_ms"])
        per_side.append(got)
    return {ln.key: (per_side[0].get(ln.key, []), per_side[1].get(ln.key, [])) for ln in lines}


def decide(ln: Line, a: list[float], b: list[float], threshold: float, why: str = "") -> Line:
    """The line's verdict from the interleaved samples (see the module docstring); `why`: what
    went wrong in the rounds, told where there are too few samples."""
    from scipy.stats import mannwhitneyu

    if min(len(a), len(b)) < 3:
        return replace(ln, note=(ln.note + "; " if ln.note else "") +
                       f"not confirmed: too few samples ({len(a)} A, {len(b)} B): verdict kept" +
                       (f" ({why})" if why else ""))
    change = median(b) / median(a) - 1
    p = float(mannwhitneyu(b, a, alternative="greater", method="exact").pvalue)
    confirmed = math.log1p(change) >= math.log1p(threshold) and p <= ALPHA
    text = (f"{'confirmed' if confirmed else 'not confirmed'} here: A {median(a):.4g} ms, B {median(b):.4g} ms "
            f"({change:+.1%}) over {min(len(a), len(b))} interleaved rounds, p={p:.3f}")
    return replace(ln, verdict="regression" if confirmed else "not confirmed", note=text)


def confirm_lines(cmp: Comparison, commits: tuple[str | None, str | None], threshold: float, rounds: int,
                  kernel_modules=(), progress: Callable[[str], None] = lambda m: None) -> Comparison:
    """The comparison with its doubtful and regressed lines of ours decided by measurement here."""
    todo = candidates(cmp.lines, threshold)
    if not todo:
        progress("confirm: nothing to re-measure (no regression or doubtful slowdown of ours)")
        return cmp
    if not all(commits):
        raise ConfirmError("--confirm needs both sides to be commits")
    decided: dict[int, Line] = {}
    for on_cpu in sorted({ln.a.gpu == "cpu" for ln in todo}):  # the GPU's cases, then the CPU's, if both
        group = [ln for ln in todo if (ln.a.gpu == "cpu") == on_cpu]
        progress(f"confirm: re-measuring {len(group)} case(s) of {', '.join(sorted({ln.key[0] for ln in group}))}, "
                 f"{rounds} rounds of A then B")
        samples, failures = measure(group, commits, rounds, kernel_modules, progress)
        why = "; ".join(failures[side] for side in sorted(failures))
        decided.update({id(ln): decide(ln, *samples[ln.key], threshold, why) for ln in group})
    return replace(cmp, lines=[decided.get(id(ln), ln) for ln in cmp.lines])
