"""`kcollect runs` (the runs in a store, newest first) and `kcollect rm RUN...` (delete runs)."""
from __future__ import annotations

from pathlib import Path

import click

from .common import DEFAULT_DB, DEFAULT_RUNS, fail, open_store
from .formats import format_option, render

COLUMNS = ("run", "started", "commit", "dirty", "gpu", "machine", "grid", "status", "rows", "invocation")
RUNS_SQL = ("SELECT u.run_id, u.started_at, u.git_commit, u.git_dirty, e.device_kind, e.gpu_name, u.machine, u.grid, "
            "u.status, u.invocation, (SELECT count(*) FROM results r WHERE r.run_id = u.run_id) AS n_rows "
            "FROM runs u LEFT JOIN environments e USING (env_id) ORDER BY u.started_at DESC, u.run_id")


def run_records(store) -> list[dict]:
    from .regress import device

    return [{"run": r["run_id"], "started": r["started_at"], "commit": r["git_commit"], "dirty": r["git_dirty"],
             "gpu": device(r), "machine": r["machine"], "grid": r["grid"], "status": r["status"],
             "rows": r["n_rows"], "invocation": r["invocation"]} for r in store.query(RUNS_SQL)]


@click.command("runs")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@format_option
def runs_cmd(db: str, fmt: str) -> None:
    """List the runs in the store, newest first: id, start time, commit (and whether its checkout had
    uncommitted changes), GPU, machine, grid, status, rows, and the `kcollect run` it belongs to
    (its workers' runs share that id; `summary --run` takes either)."""
    with open_store(db, read_only=True) as store:
        recs = run_records(store)
    short = fmt in ("table", "markdown")
    text = [{"run": r["run"][:8], "commit": (r["commit"] or "-")[:12], "invocation": (r["invocation"] or "-")[:8],
             "started": r["started"].strftime("%Y-%m-%d %H:%M:%S") if r["started"] else "-",
             "dirty": {None: "-", True: "yes", False: "no"}[r["dirty"]]} for r in recs] if short else None
    if recs or not short:
        click.echo("\n".join(render(recs, fmt, COLUMNS, text, right=("rows",))))
    click.echo(f"{len(recs)} run(s) in {db}", err=True)


@click.command("rm")
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN...")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to delete the runs from.")
@click.option("--yes", is_flag=True, help="Delete them; without it, the runs are only listed.")
@click.option("--runs-dir", default=DEFAULT_RUNS, show_default=True,
              help="The folder of exported runs, checked for the runs' folders (which `import` would bring back).")
def rm_cmd(run_ids: tuple[str, ...], db: str, yes: bool, runs_dir: str) -> None:
    """Delete runs (by id, or a prefix naming one run; `kcollect runs` lists them) and their rows
    from the store. Without --yes it lists what it would delete and exits 2. An exported run's
    folder under data/runs is left alone: delete it there too (git rm -r), or `kcollect import`
    and `build-site` bring the run back."""
    with open_store(db, read_only=not yes) as store:  # closed on a one-line error too (in-process callers)
        known = store.query("SELECT u.run_id, u.git_commit, u.status, (SELECT count(*) FROM results r "
                            "WHERE r.run_id = u.run_id) AS n_rows FROM runs u ORDER BY u.started_at")
        picked = {}
        for rid in run_ids:
            match = [r for r in known if r["run_id"].startswith(rid)]
            if len(match) != 1:
                fail(f"run {rid!r} matches {len(match)} runs in {db}; give more of its id (`kcollect runs` lists "
                     f"them)" if match else f"no run {rid!r} in {db} (`kcollect runs` lists them)")
            picked[match[0]["run_id"]] = match[0]
        rows = sum(r["n_rows"] for r in picked.values())
        for r in picked.values():
            click.echo(f"{r['run_id']}  commit {(r['git_commit'] or '-')[:12]}  {r['status']}  {r['n_rows']} rows")
        if not yes:
            fail(f"would delete {len(picked)} run(s) and {rows} rows from {db}; add --yes to delete them")
        store.delete_runs(list(picked))
    click.echo(f"deleted {len(picked)} run(s) and {rows} rows from {db}", err=True)
    folders = Path(runs_dir)
    for rid in picked:
        for f in sorted(folders.glob(f"*-{rid[:8]}")) if folders.is_dir() else ():
            click.echo(f"kcollect: note: {f} still holds run {rid[:8]}: `kcollect import` and `build-site` "
                       "would bring it back; delete the folder too (git rm -r)", err=True)
