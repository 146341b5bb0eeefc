"""`kcollect compare A B`: two commits, or two GPUs, side by side; Markdown for a pull-request comment.

The exit status is the CI signal: 1 when a series got significantly slower or newly fails its
correctness gate, 0 otherwise, 2 with one line for bad input. Significant means beyond the relative
threshold AND beyond the noise of the two points: their p20-p80 bands do not overlap (a point is all
runs of one commit, grouped as regress.points_from_rows does, so reruns widen the band).
"""
from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime

import click

from .regress import DEFAULT_THRESHOLD, Point, points_from_rows
from .store import Store, StoreError

from .common import DEFAULT_DB  # noqa: E402
SERIES = ("kernel", "mode", "provider", "shape", "dtype")
QUERY = ("SELECT kernel, mode, provider, shape, dtype, status, median_ms, p20_ms, p80_ms, git_commit, commit_time, "
         "started_at, run_id, device_kind, gpu_name FROM results_v")
FAILING = ("failed", "error")  # a newly failing gate or crash is a regression; 'unavailable' is not


class BadInput(Exception):
    """Exit 2 with this one line."""


@dataclass(frozen=True)
class Line:
    key: tuple  # SERIES values, plus the device in a comparison of commits
    a: Point | None  # None when the side has no time (see a_status)
    b: Point | None
    a_status: str
    b_status: str
    verdict: str  # 'regression', 'improvement', 'within noise', 'same', 'failing', 'fixed', 'n/a'

    @property
    def change(self) -> float | None:
        return self.b.median_ms / self.a.median_ms - 1 if self.a and self.b else None


def device(row: dict) -> str:
    # CPU (interpreted) rows are their own device, so they never meet GPU rows.
    return row["gpu_name"] if row["device_kind"] == "cuda" and row["gpu_name"] else "cpu"


def verdict(a: Point, b: Point, threshold: float) -> str:
    if abs(math.log(b.median_ms / a.median_ms)) < math.log1p(threshold):
        return "same"
    if b.median_ms > a.median_ms:
        return "regression" if b.p20_ms > a.p80_ms else "within noise"
    return "improvement" if b.p80_ms < a.p20_ms else "within noise"


def _sides(rows: list[dict], with_device: bool) -> dict[tuple, tuple[Point | None, str]]:
    """Rows of one side -> {series: (point, status)}; a series with no 'ok' row keeps its latest status."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = tuple(r[c] for c in SERIES) + ((device(r),) if with_device else ())
        groups.setdefault(key, []).append(r)
    out = {}
    for key, group in groups.items():
        points = points_from_rows(group)
        latest = max(group, key=lambda r: r["started_at"] or datetime.min)
        out[key] = (points[0], "ok") if points else (None, latest["status"])
    return out


def compare_rows(a_rows: list[dict], b_rows: list[dict], threshold: float, with_device: bool) -> list[Line]:
    """The series present on both sides, with their verdicts."""
    a, b = _sides(a_rows, with_device), _sides(b_rows, with_device)
    lines = []
    for key in sorted(a.keys() & b.keys(), key=lambda k: tuple(str(x) for x in k)):
        (pa, sa), (pb, sb) = a[key], b[key]
        if pa and pb:
            v = verdict(pa, pb, threshold)
        elif pa and sb in FAILING:
            v = "failing"
        elif pb and sa in FAILING:
            v = "fixed"
        else:
            v = "n/a"
        lines.append(Line(key, pa, pb, sa, sb, v))
    return lines


# -- resolving A and B -----------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def resolve_commit(ref: str, known: dict[str, datetime | None]) -> tuple[str, str | None]:
    """A commit with runs in the store, from a prefix of it or a git revision of the checkout in the
    current folder (HEAD~1). A revision without runs (a data-only commit, say) stands for its nearest
    ancestor with runs, and a note says so. -> (commit, note or None)"""
    matches = [c for c in known if c.lower().startswith(ref.lower())]
    if len(matches) == 1:
        return matches[0], None
    if len(matches) > 1:
        raise BadInput(f"commit {ref!r} is ambiguous: {', '.join(c[:12] for c in matches[:5])}")
    sha = None if ref.startswith("-") else _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if sha:
        for ancestor in (_git("rev-list", "--max-count=1000", sha) or "").split():
            if ancestor in known:
                note = None if ancestor == sha else (f"{ref} ({sha[:12]}) has no runs; using its nearest "
                                                     f"ancestor with runs, {ancestor[:12]}")
                return ancestor, note
    recent = sorted(known, key=lambda c: known[c] or datetime.min, reverse=True)[:5]
    where = "it and its ancestors have no runs in the store" if sha else "not a commit in the store"
    raise BadInput(f"unknown commit {ref!r} ({where}); known: "
                   f"{', '.join(c[:12] for c in recent) or 'none, the store has no runs'}")


def resolve_device(name: str, devices: list[str]) -> str:
    exact = [d for d in devices if d.lower() == name.lower()]
    matches = exact or [d for d in devices if name.lower() in d.lower()]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise BadInput(f"GPU {name!r} matches several: {', '.join(matches)}")
    raise BadInput(f"unknown GPU {name!r}; known: {', '.join(devices) or 'none, the store has no runs'}")


DEVICE_SQL = "CASE WHEN device_kind = 'cuda' AND gpu_name IS NOT NULL THEN gpu_name ELSE 'cpu' END"


def select(store: Store, a: str, b: str, gpus: bool) -> tuple[list[dict], list[dict], str, str, list[str]]:
    """-> (rows of A, rows of B, label of A, label of B, notes); only the two sides are read."""
    if not gpus:
        known = dict(store.con.execute("SELECT git_commit, max(commit_time) FROM runs "
                                       "WHERE git_commit IS NOT NULL GROUP BY 1").fetchall())
        (ca, na), (cb, nb) = resolve_commit(a, known), resolve_commit(b, known)
        return (store.query(QUERY + " WHERE git_commit = ?", [ca]), store.query(QUERY + " WHERE git_commit = ?", [cb]),
                ca[:12], cb[:12], [n for n in (na, nb) if n])
    devices = sorted(r[0] for r in store.con.execute(f"SELECT DISTINCT {DEVICE_SQL} FROM results_v").fetchall())
    da, db = resolve_device(a, devices), resolve_device(b, devices)
    if (da == "cpu") != (db == "cpu"):
        raise BadInput("CPU (interpreted) timings are never compared with GPU timings; compare two GPUs")
    sides = []
    for d in (da, db):
        # The latest commit measured on this GPU (a run without a commit stands for itself).
        commit, run_id = store.con.execute(
            f"SELECT git_commit, run_id FROM results_v WHERE {DEVICE_SQL} = ? "
            "ORDER BY coalesce(commit_time, started_at) DESC, started_at DESC LIMIT 1", [d]).fetchone()
        where, arg = ("git_commit = ?", commit) if commit else ("run_id = ?", run_id)
        sides.append((store.query(f"{QUERY} WHERE {DEVICE_SQL} = ? AND {where}", [d, arg]),
                      f"{d} @ {(commit or 'run ' + run_id)[:12]}"))
    return sides[0][0], sides[1][0], sides[0][1], sides[1][1], []


# -- output -----------------------------------------------------------------------------------------

MARK = {"regression": "REGRESSION", "failing": "NOW FAILING", "improvement": "faster", "fixed": "fixed",
        "within noise": "no (noise)", "same": "no", "n/a": "-"}


def _ms(p: Point | None, status: str) -> str:
    return f"{p.median_ms:.4f}" if p else status.upper()


def cells(lines: list[Line], with_device: bool) -> list[tuple[str, ...]]:
    header = SERIES + (("gpu",) if with_device else ()) + ("A ms", "B ms", "change", "significant?")
    body = [tuple(str(k) for k in ln.key) + (_ms(ln.a, ln.a_status), _ms(ln.b, ln.b_status),
                                              f"{ln.change:+.1%}" if ln.change is not None else "-", MARK[ln.verdict])
            for ln in lines]
    return [header] + body


def text_table(table: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    numeric = len(table[0]) - 4  # the four last columns are right-aligned
    out = []
    for j, row in enumerate(table):
        out.append("  ".join(c.rjust(w) if i >= numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                   .rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def markdown_table(table: list[tuple[str, ...]]) -> list[str]:
    esc = [tuple(c.replace("|", "\\|") for c in row) for row in table]
    return (["| " + " | ".join(esc[0]) + " |", "|" + "|".join(" --- " for _ in esc[0]) + "|"]
            + ["| " + " | ".join(row) + " |" for row in esc[1:]])


def summary(lines: list[Line]) -> str:
    count = {v: sum(ln.verdict == v for ln in lines) for v in MARK}
    return (f"{len(lines)} series in both: {count['regression']} significant regression(s), "
            f"{count['failing']} newly failing, {count['improvement']} significant improvement(s), "
            f"{count['fixed']} fixed")


def report(lines: list[Line], label_a: str, label_b: str, threshold: float, with_device: bool,
           markdown: bool) -> list[str]:
    table = cells(lines, with_device)
    if not markdown:
        return [f"A = {label_a}   B = {label_b}   threshold {threshold:.0%}", *text_table(table), summary(lines)]
    bad = [i + 1 for i, ln in enumerate(lines) if ln.verdict in ("regression", "failing")]
    out = [f"### kcollect compare: `{label_a}` → `{label_b}`", "",
           f"{summary(lines)} (threshold {threshold:.0%}, and beyond the p20-p80 spread of both).", ""]
    if bad:
        out += markdown_table([table[0]] + [table[i] for i in bad]) + [""]
    out += ["<details><summary>All series</summary>", "", *markdown_table(table), "", "</details>"]
    return out


@click.command("compare")
@click.argument("a")
@click.argument("b")
@click.option("--gpus", is_flag=True,
              help="A and B are GPU names (or parts of one, or 'cpu'); each side is its latest commit.")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--threshold", type=click.FloatRange(min=0), default=DEFAULT_THRESHOLD, show_default=True,
              help="Relative change a significant difference must exceed (0.05 = 5%).")
@click.option("--markdown", is_flag=True, help="Print Markdown (for a pull-request comment or a job summary).")
def compare_cmd(a, b, gpus, db, threshold, markdown) -> None:
    """Compare two commits (prefixes or git revisions such as HEAD~1) or, with --gpus, two GPUs.
    Exits 1 when a series got significantly slower or newly fails its correctness gate."""
    try:
        with Store(db, read_only=True) as store:
            a_rows, b_rows, label_a, label_b, notes = select(store, a, b, gpus)
    except StoreError as e:
        click.echo(f"kcollect: error: {e}", err=True)
        sys.exit(1)
    except BadInput as e:
        click.echo(f"kcollect: error: {e}", err=True)
        sys.exit(2)
    for note in notes:
        click.echo(f"kcollect: note: {note}", err=True)
    lines = compare_rows(a_rows, b_rows, threshold, with_device=not gpus)
    if not lines:
        click.echo(f"kcollect: note: {label_a} and {label_b} have no series in common", err=True)
    click.echo("\n".join(report(lines, label_a, label_b, threshold, not gpus, markdown)))
    sys.exit(1 if any(ln.verdict in ("regression", "failing") for ln in lines) else 0)
