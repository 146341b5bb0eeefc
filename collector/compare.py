"""`kcollect compare A B`: two commits (the CI gate), two runs, or two GPUs, side by side.

The exit status is the CI signal: 1 when a series of ours whose code changed got significantly
slower or newly fails its correctness gate on a GPU, 0 otherwise, 2 with one line for bad input (an
unknown commit, a bad --threshold, two sides with nothing in common, a store this kcollect cannot
read). The verdicts come from the one engine (kcollect.verdicts), with each series' noise and the
flags of its history from kcollect.regress (the same walk the site shows) and whose code changed
from git (kcollect.codechange). Each series of B is compared with the last commit up to A that
measured it. `--confirm` re-measures the doubtful and failing cases of ours, both commits
interleaved on this machine (kcollect.confirm), and decides on those samples.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from datetime import datetime

import click
import duckdb

from . import codechange, regress
from .common import DEFAULT_DB, kernel_module_option
from .formats import FORMATS, IDENTITY, render
from .noise import Noise
from .regress import DEFAULT_THRESHOLD, SeriesKey, code_status
from .series import commit_rank, full_commits
from .store import Store, StoreError
from .verdicts import CHANGED, MARK, METHOD, QUIET, UNCHANGED, UNKNOWN, Q, Comparison, Line, compare

QUERY = regress.QUERY  # lab runs are left out: experiments are never compared or gated
NOT_LAB = "grid IS DISTINCT FROM 'lab'"
DEVICE_SQL = "CASE WHEN device_kind = 'cuda' AND gpu_name IS NOT NULL THEN gpu_name ELSE 'cpu' END"
COLUMNS = IDENTITY + ("timing", "a_ms", "b_ms", "change", "noise", "z", "p", "code", "verdict", "note")
RIGHT = ("a_ms", "b_ms", "change", "noise", "z", "p")


class BadInput(Exception):
    """Exit 2 with this one line."""


def parse_threshold(text: str) -> float:
    """A relative threshold: 0.05 or 5% (a bare number above 1 would be over 100%: refused)."""
    text = str(text).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise BadInput(f"--threshold {text!r} is not a number; write 0.05 or 5% for 5%") from None
    if not math.isfinite(number) or number < 0:
        raise BadInput(f"--threshold {text!r} must be a finite number at least 0; write 0.05 or 5% for 5%")
    if number > 1:
        raise BadInput(f"--threshold {text!r} would mean {number:.0%}; a threshold is a fraction: write 0.05 "
                       "or 5% for 5%")
    return number


# -- resolving A and B -----------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    out = codechange.git(".", *args)
    return None if out is None else out.strip()


def _stored(sha: str, known: dict[str, datetime | None]) -> str | None:
    """The commit as the store keys it: itself, or the short SHA that older runs stored for it."""
    found = [c for c in known if sha.lower() == c.lower() or (len(c) >= 7 and sha.lower().startswith(c.lower()))]
    return max(found, key=len) if found else None


def resolve_commit(ref: str, known: dict[str, datetime | None]) -> tuple[str, str | None]:
    """A commit with runs in the store, from a prefix of it, a full SHA of a commit stored by a short
    one, or a git revision of the checkout in the current folder (HEAD~1). A revision without runs
    (a data-only commit, say) stands for its nearest ancestor with runs, and a note says so.
    -> (commit, note or None)"""
    full = full_commits(known)
    matches = sorted({full[c] for c in known if c.lower().startswith(ref.lower())} |
                     ({full[c]} if (c := _stored(ref, known)) else set()))
    if len(matches) == 1:
        return next(c for c in known if full[c] == matches[0] and len(c) == max(
            len(k) for k in known if full[k] == matches[0])), None
    if len(matches) > 1:
        raise BadInput(f"commit {ref!r} is ambiguous: {', '.join(c[:12] for c in matches[:5])}")
    sha = None if ref.startswith("-") else _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if sha:
        for ancestor in (_git("rev-list", "--max-count=1000", sha) or "").split():
            stored = _stored(ancestor, known)
            if stored:
                note = None if ancestor == sha else (f"{ref} ({sha[:12]}) has no runs; using its nearest "
                                                     f"ancestor with runs, {stored[:12]}")
                return stored, note
    recent = sorted(known, key=lambda c: known[c] or datetime.min, reverse=True)[:5]
    where = "it and its ancestors have no runs in the store" if sha else "not a commit in the store"
    raise BadInput(f"unknown commit {ref!r} ({where}); known: "
                   f"{', '.join(c[:12] for c in recent) or 'none, the store has no runs'}")


def _one(kind: str, name: str, found: list[str], known: list[str], width: int = 12) -> str:
    if len(found) == 1:
        return found[0]
    if found:
        raise BadInput(f"{kind} {name!r} matches several: {', '.join(f[:width] for f in found[:5])}")
    raise BadInput(f"unknown {kind} {name!r}; known: "
                   f"{', '.join(k[:width] for k in known[:8]) or 'none, the store has no runs'}")


def resolve_device(name: str, devices: list[str]) -> str:
    exact = [d for d in devices if d.lower() == name.lower()]
    return _one("GPU", name, exact or [d for d in devices if name.lower() in d.lower()], devices, width=200)


@dataclass
class Sides:
    a_rows: list[dict]
    b_rows: list[dict]
    label_a: str
    label_b: str
    commits: tuple[str | None, str | None]
    notes: list[str]


def select(store: Store, a: str, b: str, how: str) -> Sides:
    """The rows of the two sides; `how`: 'commits', 'runs' or 'gpus'."""
    if how == "commits":
        known = dict(store.con.execute("SELECT git_commit, max(commit_time) FROM runs "
                                       f"WHERE git_commit IS NOT NULL AND {NOT_LAB} GROUP BY 1").fetchall())
        (ca, na), (cb, nb) = resolve_commit(a, known), resolve_commit(b, known)
        rows = [store.query(QUERY + " AND git_commit = ?", [c]) for c in (ca, cb)]
        return Sides(rows[0], rows[1], ca[:12], cb[:12], (ca, cb), [n for n in (na, nb) if n])
    if how == "runs":
        runs = store.query(f"SELECT run_id, git_commit FROM runs WHERE {NOT_LAB} ORDER BY started_at DESC")
        ids = [r["run_id"] for r in runs]
        ra, rb = (_one("run", x, [i for i in ids if i.startswith(x)], ids) for x in (a, b))
        commit = {r["run_id"]: r["git_commit"] for r in runs}
        rows = [store.query(QUERY + " AND run_id = ?", [r]) for r in (ra, rb)]
        return Sides(rows[0], rows[1], f"run {ra[:8]}", f"run {rb[:8]}", (commit[ra], commit[rb]), [])
    devices = sorted(r[0] for r in store.con.execute(f"SELECT DISTINCT {DEVICE_SQL} FROM results_v "
                                                     f"WHERE {NOT_LAB}").fetchall())
    da, db = resolve_device(a, devices), resolve_device(b, devices)
    if (da == "cpu") != (db == "cpu"):
        raise BadInput("CPU (interpreted) timings are never compared with GPU timings; compare two GPUs")
    out = []
    for d in (da, db):
        # The latest commit measured on this GPU (a run without a commit stands for itself).
        commit, run_id = store.con.execute(
            f"SELECT git_commit, run_id FROM results_v WHERE {DEVICE_SQL} = ? AND {NOT_LAB} "
            "ORDER BY coalesce(commit_time, started_at) DESC, started_at DESC LIMIT 1", [d]).fetchone()
        where, arg = ("git_commit = ?", commit) if commit else ("run_id = ?", run_id)
        out.append((store.query(f"{QUERY} AND {DEVICE_SQL} = ? AND {where}", [d, arg]),
                    f"{d} @ {(commit or 'run ' + run_id)[:12]}", commit))
    return Sides(out[0][0], out[1][0], out[0][1], out[1][1], (out[0][2], out[1][2]), [])


def nothing_in_common(s: Sides, how: str) -> str:
    """Why two sides share no series, in one line."""
    def where(rows):
        return sorted({f"{regress.device(r)}" + (f" ({r['machine']})" if r.get("machine") else "") for r in rows})

    if not s.a_rows or not s.b_rows:
        empty = s.label_a if not s.a_rows else s.label_b
        return f"{empty} has no rows in the store"
    wa, wb = where(s.a_rows), where(s.b_rows)
    if how == "commits" and not set(wa) & set(wb):
        return (f"{s.label_a} ran on {', '.join(wa)} and {s.label_b} on {', '.join(wb)}: no series in common; "
                "compare two GPUs with --gpus")
    ka, kb = sorted({r["kernel"] for r in s.a_rows}), sorted({r["kernel"] for r in s.b_rows})
    if not set(ka) & set(kb):
        return f"{s.label_a} measured {', '.join(ka)} and {s.label_b} {', '.join(kb)}: no kernel in common"
    return f"{s.label_a} and {s.label_b} share no (kernel, mode, provider, shape, dtype) on one GPU and machine"


# -- the history, noise and code -------------------------------------------------------------------


@dataclass
class History:
    """The history of the GPUs of both sides, walked as the gate met it (regress.analyse), and the
    commit order."""

    rows: list[dict]
    analysed: dict[SeriesKey, regress.SeriesResult]
    rank: dict[str, int]
    repo: codechange.Repo


def history(store: Store, s: Sides) -> History:
    gpus = sorted({regress.device(r) for r in s.a_rows + s.b_rows})
    rows = store.query(f"{QUERY} AND {DEVICE_SQL} IN ({', '.join('?' * len(gpus))})", gpus)
    repo = codechange.Repo(".")
    analysed = regress.analyse(rows, code=repo)
    return History(rows, analysed, commit_rank(r.points for r in analysed.values()), repo)


def _where(r: dict) -> tuple:
    return (r["kernel"], r["mode"], r["provider"], r["shape"], r["dtype"], regress.device(r), r.get("machine"))


def last_measured(h: History, s: Sides) -> list[dict]:
    """A's rows, and for each series of B that A did not measure, the rows of the last commit up to
    A (in commit order) that did: the gate compares a kernel with where it was last measured."""
    ca, cb = s.commits
    full = full_commits(r.get("git_commit") for r in h.rows)
    have = {_where(r) for r in s.a_rows}
    wanted = {_where(r) for r in s.b_rows} - have
    limit = h.rank.get(full.get(ca, ca))
    if not wanted or limit is None:
        return s.a_rows
    best: dict[tuple, tuple[int, str]] = {}
    for r in h.rows:
        where, commit = _where(r), full.get(r.get("git_commit"), r.get("git_commit"))
        at = h.rank.get(commit)
        if where in wanted and at is not None and at <= limit and commit != full.get(cb, cb):
            if where not in best or at > best[where][0]:
                best[where] = (at, commit)
    extra = [r for r in h.rows if (w := _where(r)) in best and full.get(r.get("git_commit")) == best[w][1]]
    return s.a_rows + extra


def noise_lookup(h: History, commit: str | None, before: bool = False):
    """series key -> its noise as the gate knew it at `commit` (with `before`: from the commits
    before it only, as for two runs of that commit), or None for a series without history."""
    full = full_commits(r.get("git_commit") for r in h.rows)
    commit = full.get(commit, commit)

    def lookup(key: SeriesKey) -> Noise | None:
        r = h.analysed.get(key)
        if r is None:
            return None
        at = [i for i, p in enumerate(r.points) if p.commit == commit]
        if not at:
            return r.noise
        return (r.noise_before if before else r.noise_at)[at[0]]

    return lookup


def code_of(h: History | None, how: str, force: str | None = None):
    """(kernel, ours, commit a, commit b) -> our code's status (regress.code_status); `force`: the
    status of our code whatever git says (the A/A evaluation treats it as changed)."""
    def status(kernel: str, ours: bool, a: str | None, b: str | None) -> str:
        if force and ours:
            return force
        if how == "gpus":
            return UNKNOWN if ours else UNCHANGED
        return code_status(h.repo if h else None, kernel, ours, a, b)

    return status


def code_note(h: History | None, s: Sides, how: str) -> str | None:
    ca, cb = s.commits
    if how == "gpus" or not (ca and cb) or ca == cb:
        return None
    changes = h.repo.changed_kernels(ca, cb) if h else None
    if changes is None:
        return ("git cannot tell which kernels changed between the two sides (run compare inside the "
                "repository, with both commits fetched): every kernel of ours is taken as changed")
    code = [k for k, v in changes.items() if v == CHANGED]
    method = [k for k, v in changes.items() if v == METHOD]
    if not code and not method:
        return "no kernel's code changed between the two sides"
    return "; ".join(x for x in (code and f"kernels whose code changed: {', '.join(code)}",
                                 method and f"kernels whose method only changed (inputs, what is measured or how it is timed): "
                                            f"{', '.join(method)}") if x)


def with_history(cmp: Comparison, h: History, s: Sides) -> Comparison:
    """Lines that the history's walk, with points after B, found a step in (A, B] for: that flag's
    verdict (the site shows the same), and the slides of ours that end at B, as notes."""
    full = full_commits(r.get("git_commit") for r in h.rows)
    ca, cb = (full.get(c, c) for c in s.commits)
    lo, hi = h.rank.get(ca), h.rank.get(cb)
    lines, notes = [], list(cmp.notes)
    for ln in cmp.lines:
        r = h.analysed.get(ln.series)
        if r is not None and lo is not None and hi is not None and ln.verdict in QUIET:
            for f in r.flags:
                if not f.by_gate and lo < h.rank[f.after_commit] <= hi:
                    ln = replace(ln, verdict=f.verdict, z=f.noise_sigmas, note=(
                        f"found in the history: {f.change:+.1%} at {f.after_commit[:8]}, decided with "
                        f"{f.decided_index - f.index + 1} points after it (at {r.points[f.decided_index].commit[:8]})"))
        lines.append(ln)
        if r is not None and r.ours and ln.b.gpu != "cpu":
            for slide in r.slides:
                if slide.end_commit == cb:
                    notes.append(f"slow slide: {' '.join(map(str, ln.key))} on {ln.b.gpu} {slide.change:+.1%} "
                                 f"over {slide.end_index - slide.start_index + 1} commits "
                                 f"({slide.start_commit[:8]}..{slide.end_commit[:8]}), each step under the threshold")
    return replace(cmp, lines=lines, notes=notes)


# -- output -----------------------------------------------------------------------------------------


def _ms(side) -> str:
    return f"{side.point.median_ms:.4f}" if side.point else str(side.status).upper()


def records(lines: list[Line]) -> tuple[list[dict], list[dict]]:
    """(records with raw values for CSV/JSON, display text for the table and Markdown)."""
    recs, text = [], []
    for ln in lines:
        gpu = ln.a.gpu if ln.a.gpu == ln.b.gpu else f"{ln.a.gpu} / {ln.b.gpu}"
        machine = ln.a.machine if ln.a.machine == ln.b.machine else f"{ln.a.machine} / {ln.b.machine}"
        timing = ln.a.timing if ln.a.timing == ln.b.timing else f"{ln.a.timing} / {ln.b.timing}"
        recs.append(dict(zip(IDENTITY, (*ln.key, gpu, machine)), timing=timing,
                         a_ms=ln.a.point.median_ms if ln.a.point else None,
                         b_ms=ln.b.point.median_ms if ln.b.point else None, change=ln.change,
                         noise=ln.noise.sigma if ln.noise else None,
                         z=None if ln.z is None or not math.isfinite(ln.z) else round(ln.z, 2),
                         p=None if ln.p is None else float(f"{ln.p:.3g}"),
                         code=ln.code, verdict=ln.verdict, note=ln.note))
        text.append(dict(a_ms=_ms(ln.a), b_ms=_ms(ln.b), change=f"{ln.change:+.1%}" if ln.change is not None else "-",
                         noise=f"±{ln.noise.sigma:.2%}" if ln.noise else "-",
                         z=f"{ln.z:.1f}" if ln.z is not None and math.isfinite(ln.z) else "-",
                         p=f"{ln.p:.2g}" if ln.p is not None else "-",
                         verdict=MARK[ln.verdict], machine=machine or "-", note=ln.note or ""))
    return recs, text


def summary(lines: list[Line]) -> str:
    gating = [ln for ln in lines if ln.gates]
    count = {v: sum(ln.verdict == v for ln in lines) for v in MARK}
    quiet = count["regression"] + count["failing"] - len(gating)
    return (f"{len(lines)} series in both: {sum(ln.verdict == 'regression' for ln in gating)} significant "
            f"regression(s), {sum(ln.verdict == 'failing' for ln in gating)} newly failing, "
            f"{count['improvement']} significant improvement(s), {count['fixed']} fixed"
            + (f" ({quiet} more on the CPU or of code that did not change, which never fail)" if quiet else ""))


def report(cmp: Comparison, s: Sides, threshold: float, fmt: str, only_changed: bool = False) -> list[str]:
    shown = [ln for ln in cmp.lines if not only_changed or ln.verdict not in QUIET]
    recs, text = records(shown)
    if fmt in ("csv", "json"):
        return render(recs, fmt, COLUMNS)
    if fmt == "table":
        return [f"A = {s.label_a}   B = {s.label_b}   threshold {threshold:.1%}",
                *render(recs, fmt, COLUMNS, text, RIGHT), summary(cmp.lines)]
    bad = [i for i, ln in enumerate(shown) if ln.gates]
    out = [f"### kcollect compare: `{s.label_a}` → `{s.label_b}`", "",
           f"{summary(cmp.lines)} (threshold {threshold:.1%}, and significant against each series' measured noise at "
           f"a false-discovery rate of {Q:.0%} over the comparison; only our own kernels whose code changed can "
           "fail).", ""]
    out += [f"- {n}" for n in cmp.notes] + ([""] if cmp.notes else [])
    if bad:
        out += render([recs[i] for i in bad], fmt, COLUMNS, [text[i] for i in bad]) + [""]
    title = "Every series whose verdict is not 'no'" if only_changed else "All series"
    out += [f"<details><summary>{title}</summary>", "", *render(recs, fmt, COLUMNS, text), "", "</details>"]
    return out


# -- the command ------------------------------------------------------------------------------------


def compare_sides(s: Sides, h: History | None, how: str, threshold: float, force_code: str | None = None) -> Comparison:
    """The comparison of two selected sides, as the gate decides it (the command, the A/A evaluation
    and the replay test share it)."""
    threshold_of = lambda kernel: threshold  # noqa: E731
    if how == "gpus":
        return compare(s.a_rows, s.b_rows, threshold_of, False, lambda key: None, code_of(None, how), across=True)
    if how == "runs":
        noise = noise_lookup(h, s.commits[1], before=s.commits[0] == s.commits[1])
        return compare(s.a_rows, s.b_rows, threshold_of, False, noise, code_of(h, how, force_code))
    cmp = compare(last_measured(h, s), s.b_rows, threshold_of, True, noise_lookup(h, s.commits[1]),
                  code_of(h, how, force_code))
    ca = s.commits[0]
    cmp = replace(cmp, lines=[ln if not ln.a.commit or ln.a.commit == ca else replace(
        ln, note="; ".join(x for x in (f"A side: {ln.a.commit[:8]}, the last commit that measured it", ln.note) if x))
        for ln in cmp.lines])
    return with_history(cmp, h, s)


def fail(message: str, code: int = 2) -> None:
    click.echo(f"kcollect: error: {message}", err=True)
    sys.exit(code)


@click.command("compare")
@click.argument("a")
@click.argument("b")
@click.option("--gpus", is_flag=True,
              help="A and B are GPU names (or parts of one, or 'cpu'); each side is its latest commit. Never fails.")
@click.option("--run", "runs", is_flag=True, help="A and B are run ids (or prefixes), e.g. two runs of one commit.")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--threshold", default=f"{DEFAULT_THRESHOLD:g}", show_default=True,
              help="Relative change a significant difference must exceed: 0.05 or 5% for 5%.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Output: an aligned table (default), Markdown (a pull-request comment), CSV or JSON.")
@click.option("--markdown", is_flag=True, help="Same as --format markdown.")
@click.option("--confirm", is_flag=True,
              help="Re-measure the doubtful and regressed cases of ours here, both commits interleaved "
                   "(git worktrees of A and B), and decide on those samples.")
@click.option("--rounds", type=click.IntRange(3, 50), default=5, show_default=True,
              help="With --confirm: rounds of A then B.")
@click.option("--only-changed", is_flag=True,
              help="Show only the series whose verdict is not 'no' or 'no (noise)' (the summary counts all).")
@kernel_module_option
def compare_cmd(a, b, gpus, runs, db, threshold, fmt, markdown, confirm, rounds, only_changed, kernel_modules) -> None:
    """Compare two commits (prefixes or git revisions such as HEAD~1), two runs (--run) or two GPUs
    (--gpus). Exits 1 when a kernel of ours whose code changed got significantly slower on a GPU or
    newly fails its correctness gate."""
    if gpus and runs:
        fail("give --gpus or --run, not both")
    if markdown and fmt not in (None, "markdown"):
        fail(f"--markdown and --format {fmt} disagree; give one")
    fmt = "markdown" if markdown else (fmt or "table")
    how = "gpus" if gpus else ("runs" if runs else "commits")
    if confirm and how != "commits":
        fail("--confirm re-measures two commits; it cannot be used with --gpus or --run")
    try:
        threshold = parse_threshold(threshold)
        with Store(db, read_only=True) as store:
            s = select(store, a, b, how)
            h = history(store, s) if how != "gpus" else None
    except StoreError as e:
        fail(str(e), e.code)
    except BadInput as e:
        fail(str(e))
    except duckdb.Error as e:  # damage that only shows when the rows are read
        fail(f"{db} is a damaged DuckDB file ({str(e).splitlines()[0]})")
    cmp = compare_sides(s, h, how, threshold)
    if not cmp.lines:
        fail(nothing_in_common(s, how))
    if confirm:
        from .confirm import ConfirmError, confirm_lines

        try:
            cmp = confirm_lines(cmp, s.commits, threshold, rounds, kernel_modules,
                                progress=lambda m: click.echo(f"kcollect: {m}", err=True))
        except ConfirmError as e:
            fail(str(e), 1)
    note = code_note(h, s, how)
    for line in s.notes + ([note] if note else []) + ([] if fmt == "markdown" else cmp.notes):
        click.echo(f"kcollect: note: {line}", err=True)
    click.echo("\n".join(report(cmp, s, threshold, fmt, only_changed)))
    sys.exit(1 if any(ln.gates for ln in cmp.lines) else 0)
