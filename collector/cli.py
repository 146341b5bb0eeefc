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
from .store import StoreError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Benchmark Triton kernels against their baselines, store results in DuckDB, publish a site."""


@main.command("list")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="Device whose provider availability is shown.")
@kernel_module_option
def list_cmd(device: str, kernel_modules) -> None:
    """List kernels, their modes, providers (available here or why not) and grid sizes."""
    device = resolve_device(device)
    registry = load_registry(device, kernel_modules)
    for origin, error in registry.errors.items():
        click.echo(f"kcollect: warning: {origin} could not be loaded: {error}", err=True)
    for spec in registry.specs:
        grids = ", ".join(f"{g}: {len(shapes)} shapes" for g, shapes in spec.grids.items())
        click.echo(f"{spec.name}  ({spec.description})")
        click.echo(f"  modes: {', '.join(spec.modes)} | dtypes: {', '.join(str(d).split('.')[-1] for d in spec.dtypes)}"
                   f" | {grids} | baseline: {spec.baseline}")
        for p in spec.providers:
            reason = p.available(device)
            click.echo(f"  - {p.name:<12} {'available' if reason is None else 'unavailable: ' + reason}")


@main.command()
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--run", "run_id", default=None, help="Run id (or a prefix). Default: the latest run.")
@click.option("--markdown", is_flag=True, help="Print a Markdown table.")
def summary(db, run_id, markdown) -> None:
    """Print the summary table of one run."""
    from .report import markdown_lines, table_lines

    store = open_store(db, read_only=True)
    runs = store.query("SELECT * FROM runs ORDER BY started_at DESC")
    if run_id:
        runs = [r for r in runs if r["run_id"].startswith(run_id)]
    if not runs:
        fail(f"no run {'matching ' + repr(run_id) if run_id else ''} in {db}", code=1 if not run_id else 2)
    run = runs[0]
    rows = store.query("SELECT * FROM results WHERE run_id = ? ORDER BY seq", [run["run_id"]])
    fmt = markdown_lines if markdown else table_lines
    click.echo("\n".join(fmt(rows, run["copy_gbps"], run["matmul_tflops"])))


@main.command("export")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--out", default=DEFAULT_RUNS, show_default=True, help="Folder that receives one folder per run.")
@click.option("--run", "run_ids", multiple=True, help="Only these run ids (repeatable). Default: every run.")
def export_cmd(db, out, run_ids) -> None:
    """Write runs as Parquet folders (the history kept in git); runs already exported are skipped."""
    from .history import export_runs

    store = open_store(db, read_only=True)
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
    skipped and named, and the command exits 1 after importing the rest."""
    from .history import import_path

    for p in paths:
        if not Path(p).exists():
            fail(f"nothing to import at {p}: no such file or folder")
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


if __name__ == "__main__":
    main()
