"""kcollect: the command line. Each command parses its options and hands them down explicitly.

Bad input exits 2 with one line saying what is wrong and what is valid; a store that cannot be
opened or written exits 1 with one line; Ctrl-C exits 130 after marking the run interrupted.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import (DEFAULT_DB, DEFAULT_RUNS, fail, kernel_module_option, load_registry, open_store,
                     resolve_device)
from .formats import format_option
from .store import StoreError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kcollect")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


class _Main(click.Group):
    """The command group; a store found damaged while a command reads it (StoreError, raised from
    Store.query where DuckDB's own checks find what the checksums at opening did not) ends any
    command with its one line and exit code, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except StoreError as e:
            fail(str(e), code=e.code)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", "-V", prog_name="kcollect", message="%(prog)s %(version)s")
def main() -> None:
    """Benchmark Triton kernels against their baselines, store results in DuckDB, publish a site."""


@main.command("list")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="Device whose provider availability is shown.")
@kernel_module_option
@format_option
def list_cmd(device: str, kernel_modules, fmt: str) -> None:
    """List kernels and their providers: modes, dtypes, grid sizes, where each kernel comes from, and
    whether each provider is available here (or why not)."""
    from .formats import render
    from .registry import LIST_COLUMNS, describe

    device = resolve_device(device)
    registry = load_registry(device, kernel_modules)
    for origin, error in registry.errors.items():
        click.echo(f"kcollect: warning: {origin} could not be loaded: {error}", err=True)
    recs, text = describe(registry, device)
    click.echo("\n".join(render(recs, fmt, LIST_COLUMNS, text if fmt in ("table", "markdown") else None)))


@main.command()
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--run", "run_id", default=None,
              help="Run id, or the id of a `kcollect run` (its workers' runs together), or a prefix of one. "
                   "Default: the latest `kcollect run`, all its runs.")
@format_option
@click.option("--markdown", is_flag=True, help="Same as --format markdown.")
def summary(db, run_id, fmt, markdown) -> None:
    """Print the summary table of one run (every row of a `kcollect run`, whose workers each write a
    run of their own) and, where the runs recorded them, where their wall time went and how the
    rows' own seconds split over the kernels."""
    from .report import cost_lines, lines, phase_lines, run_records

    fmt = "markdown" if markdown else fmt
    with open_store(db, read_only=True) as store:  # closed on a one-line error too (in-process callers)
        picked = _pick_runs(store.query("SELECT u.*, e.device_kind, e.gpu_name FROM runs u LEFT JOIN environments "
                                        "e USING (env_id) ORDER BY started_at DESC"), run_id, db)
        ids = [r["run_id"] for r in picked]
        rows = store.query(f"SELECT * FROM results WHERE run_id IN ({', '.join('?' * len(ids))}) ORDER BY seq", ids)
    run = picked[0]
    commit = (run["git_commit"] or "no commit")[:12]
    what = (f"run {run['run_id'][:8]} ({run['status']})" if len(picked) == 1 else
            f"runs {', '.join(i[:8] for i in ids)} of one `kcollect run` ({', '.join(r['status'] for r in picked)})")
    click.echo(f"{what}, commit {commit}, grid {run['grid']}, {len(rows)} rows", err=True)
    out = lines(run_records(picked, rows), fmt)
    for r in picked:
        phases = phase_lines(r, fmt)
        out += phases[:1] + ([f"run {r['run_id'][:8]} ({r['machine']}):"] if phases and len(picked) > 1 else []) \
            + phases[1:]
    click.echo("\n".join(out + cost_lines(rows, fmt)))


def _pick_runs(runs: list[dict], run_id: str | None, db: str) -> list[dict]:
    """The runs `summary` shows, in the order they started: the run whose id begins with run_id
    (the latest such), else every run of the `kcollect run` whose id begins with it; by default
    every run of the latest `kcollect run` (older stores, without invocation ids: the latest run)."""
    if run_id:
        picked = [r for r in runs if r["run_id"].startswith(run_id)][:1] or \
            [r for r in runs if (r.get("invocation") or "").startswith(run_id)]
    else:
        latest = runs[:1]
        picked = [r for r in runs if latest and latest[0]["invocation"]
                  and r["invocation"] == latest[0]["invocation"]] or latest
    if not picked:
        fail(f"no run {'matching ' + repr(run_id) + ' ' if run_id else ''}in {db}", code=2 if run_id else 1)
    return picked[::-1]


@main.command("export")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--out", default=DEFAULT_RUNS, show_default=True, help="Folder that receives one folder per run.")
@click.option("--run", "run_ids", multiple=True, help="Only these run ids (repeatable). Default: every run.")
def export_cmd(db, out, run_ids) -> None:
    """Write runs as Parquet folders (the history kept in git); runs already exported are skipped."""
    from .history import export_runs

    with open_store(db, read_only=True) as store:
        known = store.run_ids()
        full_ids = []
        for rid in run_ids:
            match = [k for k in known if k.startswith(rid)]
            if len(match) != 1:
                fail(f"run {rid!r} matches {len(match)} runs in {db}")
            full_ids.append(match[0])
        try:
            written = export_runs(store, Path(out), full_ids or None)
        except OSError as e:
            fail(f"cannot write to {out}: {e.strerror or e}", code=1)
    for w in written:
        click.echo(f"wrote {w}")
    click.echo(f"{len(written)} run(s) exported to {out}", err=True)


@main.command("import")
@click.argument("paths", nargs=-1)
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to fold the runs into.")
def import_cmd(paths, db) -> None:
    """Fold run folders, folders of them (default: data/runs) or other kcollect DuckDB files into the
    store. Idempotent: runs already there are skipped. A folder that is incomplete or unreadable is
    skipped and named, and the command exits 1 after importing the rest; a folder given that holds
    no run folder at all is refused (exit 2)."""
    from .history import PARTS, import_path, run_folders

    missing = [p for p in paths or (DEFAULT_RUNS,) if not Path(p).exists()]
    if missing:
        fail(f"nothing to import at {missing[0]}: no such file or folder (give run folders, folders of "
             "them, or kcollect DuckDB files)")
    empty = [p for p in paths if Path(p).is_dir() and not run_folders(Path(p))]
    if empty:
        fail(f"no run folder in {empty[0]}: a run folder holds {', '.join(f'{x}.parquet' for x in PARTS)} "
             "(give run folders, folders of them, or kcollect DuckDB files)")
    store = open_store(db)
    added = skipped = 0
    problems: list = []
    try:
        for p in paths or (DEFAULT_RUNS,):
            a, s = import_path(store, Path(p), problems)
            added, skipped = added + a, skipped + s
    except StoreError as e:
        fail(str(e), code=e.code)
    finally:
        store.close()
    for folder, reason in problems:
        click.echo(f"kcollect: error: skipped {folder}: {reason}", err=True)
    click.echo(f"{added} run(s) imported, {skipped} already present"
               + (f", {len(problems)} folder(s) skipped" if problems else "") + f", into {db}")
    if problems:
        sys.exit(1)


# The other commands live beside the code they drive; registered here so that `kcollect` lists them.
from .run_cmd import run  # noqa: E402

main.add_command(run)

# build-site lives in site.py (it reads the store only); registered here so `kcollect` lists it.
from .site import build_site_cmd  # noqa: E402

main.add_command(build_site_cmd)


# compare lives in compare.py (it reads the store only); registered here so `kcollect` lists it.
from .compare import compare_cmd  # noqa: E402

main.add_command(compare_cmd)

# runs lists the store's runs and rm deletes some (runs_cmd.py).
from .runs_cmd import rm_cmd, runs_cmd  # noqa: E402

main.add_command(runs_cmd)
main.add_command(rm_cmd)

# find bisects with `kcollect run` in git worktrees; preview serves the built site.
from .find import find_cmd  # noqa: E402
from .preview import preview_cmd  # noqa: E402

main.add_command(find_cmd)
main.add_command(preview_cmd)


if __name__ == "__main__":
    main()
