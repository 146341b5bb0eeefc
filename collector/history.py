"""The history in git: one folder per run under data/runs/, three Parquet files in each.

Why Parquet folders: a run is written once and never edited, so two machines (or two branches)
adding runs add different folders and git merges them without conflicts; Parquet keeps the column
types that DuckDB reads back exactly, compresses well, and needs no extra package (DuckDB writes and
reads it itself). `import` is idempotent: a run already in the store is skipped by its id.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import duckdb

from .store import ENV_COLUMNS, RESULT_COLUMNS, RUN_COLUMNS, SCHEMA_VERSION, Store, StoreError, relabel_shapes

PARTS = {"environment": ENV_COLUMNS, "run": RUN_COLUMNS, "results": RESULT_COLUMNS}


def run_folder_name(run: dict) -> str:
    """<start time>-<device>-<run id prefix>: sorts by time, says where it ran, never collides."""
    stamp = run["started_at"].strftime("%Y%m%dT%H%M%S")
    device = re.sub(r"[^A-Za-z0-9]+", "-", run.get("gpu_name") or run["device_kind"]).strip("-").lower()
    return f"{stamp}-{device}-{run['run_id'][:8]}"


def _sql_str(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def export_runs(store: Store, out_dir: Path, run_ids: Iterable[str] | None = None) -> list[Path]:
    """Writes each run (all runs when run_ids is None) that has no folder yet; returns the new folders."""
    out_dir.mkdir(parents=True, exist_ok=True)
    existing = [p.name for p in out_dir.iterdir() if p.is_dir() and not p.name.endswith(".partial")]
    runs = store.query("SELECT r.*, e.gpu_name, e.device_kind FROM runs r JOIN environments e USING (env_id) "
                       "ORDER BY started_at")
    wanted = set(run_ids) if run_ids is not None else None
    written = []
    for run in runs:
        tail = "-" + run["run_id"][:8]
        if (wanted is not None and run["run_id"] not in wanted) or any(n.endswith(tail) for n in existing):
            continue
        folder = out_dir / run_folder_name(run)
        tmp = folder.with_name(folder.name + ".partial")
        tmp.mkdir(parents=True, exist_ok=True)  # a leftover .partial from a killed export is reused
        rid = run["run_id"]
        queries = {
            "environment": ("SELECT * FROM environments WHERE env_id = ?", [run["env_id"]]),
            "run": ("SELECT * FROM runs WHERE run_id = ?", [rid]),
            "results": ("SELECT * FROM results WHERE run_id = ? ORDER BY seq", [rid]),
        }
        for part, (sql, params) in queries.items():
            cols = ", ".join(PARTS[part])
            if part == "run":  # the folder's schema version, read back by import to migrate it
                cols += f", {SCHEMA_VERSION} AS schema_version"
            inner = sql.replace("SELECT *", f"SELECT {cols}", 1)
            # COPY cannot take parameters: the run id is ours (a uuid) and quoted safely anyway.
            inner = inner.replace("?", "'" + str(params[0]).replace("'", "''") + "'")
            store.con.execute(f"COPY ({inner}) TO {_sql_str(tmp / (part + '.parquet'))} (FORMAT parquet)")
        tmp.rename(folder)  # a folder appears whole or not at all
        written.append(folder)
    return written


def _run_folders(path: Path) -> list[Path]:
    if (path / "run.parquet").exists():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and (p / "run.parquet").exists())


def _folder_version(con, folder: Path) -> int:
    """The schema version a run folder was written with (folders before version 2 carry none)."""
    src = f"read_parquet({_sql_str(folder / 'run.parquet')})"
    if "schema_version" not in {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}:
        return 1
    version = int(con.execute(f"SELECT max(schema_version) FROM {src}").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise StoreError(f"{folder} was written by a newer kcollect (schema {version}, this one reads up to "
                         f"{SCHEMA_VERSION}); upgrade kcollect")
    return version


def import_path(store: Store, path: Path) -> tuple[int, int]:
    """Folds a run folder, a folder of run folders, or another kcollect DuckDB file into the store.
    Returns (runs added, runs already there)."""
    if not path.exists():
        raise StoreError(f"nothing to import at {path}")
    if path.is_file():
        return _import_duckdb(store, path)
    added = skipped = 0
    have = store.run_ids()
    for folder in _run_folders(path):
        con = store.con
        run_id = con.execute(f"SELECT run_id FROM read_parquet({_sql_str(folder / 'run.parquet')})").fetchone()[0]
        if run_id in have:
            skipped += 1
            continue
        version = _folder_version(con, folder)
        with store.transaction():
            for part, table in (("environment", "environments"), ("run", "runs"), ("results", "results")):
                src = f"read_parquet({_sql_str(folder / (part + '.parquet'))})"
                # by name: a folder of an older schema lacks the columns added since (NULL here)
                have = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
                cols = ", ".join(c for c in PARTS[part] if c in have)
                verb = "INSERT OR IGNORE" if table == "environments" else "INSERT"
                con.execute(f"{verb} INTO {table} ({cols}) SELECT {cols} FROM {src}")
            if version < 2:
                relabel_shapes(con, run_id)
        have.add(run_id)
        added += 1
    store.con.execute("CHECKPOINT")
    return added, skipped


def _import_duckdb(store: Store, path: Path) -> tuple[int, int]:
    try:
        other = Store(path, read_only=True)
    except StoreError:
        raise
    try:
        theirs = other.run_ids()
    finally:
        other.close()
    new = theirs - store.run_ids()
    con = store.con
    try:
        con.execute(f"ATTACH {_sql_str(path)} AS src (READ_ONLY)")
    except duckdb.Error as e:
        raise StoreError(f"cannot attach {path}: {str(e).splitlines()[0]}") from None
    try:
        with store.transaction():
            for rid in sorted(new):
                run_cols, env_cols, res_cols = (", ".join(c) for c in (RUN_COLUMNS, ENV_COLUMNS, RESULT_COLUMNS))
                con.execute(f"INSERT OR IGNORE INTO environments SELECT {env_cols} FROM src.environments "
                            f"WHERE env_id = (SELECT env_id FROM src.runs WHERE run_id = ?)", [rid])
                con.execute(f"INSERT INTO runs SELECT {run_cols} FROM src.runs WHERE run_id = ?", [rid])
                con.execute(f"INSERT INTO results SELECT {res_cols} FROM src.results WHERE run_id = ?", [rid])
    finally:
        con.execute("DETACH src")
    con.execute("CHECKPOINT")
    return len(new), len(theirs) - len(new)
