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

from .store import (ENV_COLUMNS, RESULT_COLUMNS, RUN_COLUMNS, SCHEMA_VERSION, Store, StoreError, legacy_ours,
                    relabel_shapes)

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


PARTIAL = ".partial"  # the suffix of a folder being written (export renames it when complete)


def _is_run_folder(path: Path) -> bool:
    return path.name.endswith(PARTIAL) or any((path / f"{part}.parquet").exists() for part in PARTS)


def run_folders(path: Path) -> list[Path]:
    """The run folders at path (itself, or its sub-folders), whole or not: every folder that holds
    one of a run's Parquet files or is named *.partial, so that a broken one (run.parquet lost,
    say) is reported, never silently passed."""
    if _is_run_folder(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and _is_run_folder(p))


_run_folders = run_folders  # the name build-site imports


def _folder_version(con, folder: Path) -> int:
    """The schema version a run folder was written with (folders before version 2 carry none)."""
    src = f"read_parquet({_sql_str(folder / 'run.parquet')})"
    if "schema_version" not in {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}:
        return 1
    version = int(con.execute(f"SELECT max(schema_version) FROM {src}").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise FolderError(f"written by a newer kcollect (schema {version}, this one reads up to "
                          f"{SCHEMA_VERSION}); upgrade kcollect")
    return version


class FolderError(Exception):
    """Why one run folder cannot be imported (it is skipped and named)."""


def check_folder(con, folder: Path) -> tuple[str, int]:
    """(run id, schema version) of a whole, readable run folder; FolderError otherwise. Reads each
    Parquet file's footer and the run's row, which is where a truncated or foreign file fails."""
    if folder.name.endswith(PARTIAL):
        raise FolderError("incomplete: an export was interrupted while writing it")
    missing = [part for part in PARTS if not (folder / f"{part}.parquet").is_file()]
    if missing:
        raise FolderError(f"incomplete: no {', '.join(m + '.parquet' for m in missing)}")
    try:
        for part, columns in PARTS.items():
            src = f"read_parquet({_sql_str(folder / (part + '.parquet'))})"
            have = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
            key = "env_id" if part == "environment" else "run_id"
            if key not in have:
                raise FolderError(f"{part}.parquet is not a kcollect {part} table (no {key} column)")
            con.execute(f"SELECT count(*) FROM {src}").fetchone()
        ids = con.execute(f"SELECT DISTINCT run_id FROM read_parquet({_sql_str(folder / 'run.parquet')})").fetchall()
        if len(ids) != 1:
            raise FolderError(f"run.parquet holds {len(ids)} runs, not one")
        run_id = ids[0][0]
        _check_rows(con, folder, run_id)
        return run_id, _folder_version(con, folder)
    except duckdb.Error as e:
        raise FolderError(f"unreadable ({str(e).splitlines()[0][:200]})") from None


TIMES = ("median_ms", "p20_ms", "p80_ms", "min_ms", "mean_ms")


def _check_rows(con, folder: Path, run_id: str) -> None:
    """A folder is named after its run (run_folder_name) and holds that run's rows only, and an `ok`
    row carries a time: anything else is a folder edited or assembled by hand, refused whole."""
    if not folder.name.endswith("-" + str(run_id)[:8]):
        raise FolderError(f"its run is {run_id}, which does not match the folder's name (expected it to end "
                          f"in -{str(run_id)[:8]}): a run folder holds the run it is named after")
    src = f"read_parquet({_sql_str(folder / 'results.parquet')})"
    have = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
    others = con.execute(f"SELECT count(*) FROM {src} WHERE run_id IS DISTINCT FROM ?", [run_id]).fetchone()[0]
    if others:
        raise FolderError(f"results.parquet holds {others} row(s) of another run than {run_id}")
    times = [c for c in TIMES if c in have]
    bad = " OR ".join(f"{c} < 0" for c in times) + " OR median_ms IS NULL OR NOT isfinite(median_ms)"
    n = con.execute(f"SELECT count(*) FROM {src} WHERE status = 'ok' AND ({bad})").fetchone()[0]
    if n:
        raise FolderError(f"{n} 'ok' row(s) in results.parquet with a negative, missing or infinite time "
                          f"({', '.join(times)}): an ok row is a measurement")


def problem_folders(path: Path) -> list[tuple[Path, str]]:
    """The run folders under path that an import skips, each with the reason (for a page or a
    message); [] when every folder is whole and readable, or when path holds no run folders."""
    if not path.is_dir():
        return []
    con = duckdb.connect()
    problems = []
    try:
        for folder in run_folders(path):
            try:
                check_folder(con, folder)
            except FolderError as e:
                problems.append((folder, str(e)))
    finally:
        con.close()
    return problems


def import_path(store: Store, path: Path, problems: list[tuple[Path, str]] | None = None) -> tuple[int, int]:
    """Folds a run folder, a folder of run folders, or another kcollect DuckDB file into the store.
    Returns (runs added, runs already there). A folder that is incomplete (*.partial), unreadable
    (a truncated Parquet file) or too new is skipped, and appended to `problems` with its reason;
    nothing of it reaches the store."""
    if not path.exists():
        raise StoreError(f"nothing to import at {path}: no such file or folder", code=2)
    if path.is_file():
        return _import_duckdb(store, path)
    problems = [] if problems is None else problems
    have = store.run_ids()
    new: dict[str, tuple[Path, int]] = {}
    skipped = 0
    for folder in run_folders(path):
        try:
            run_id, version = check_folder(store.con, folder)
        except FolderError as e:
            problems.append((folder, str(e)))
            continue
        if run_id in have or run_id in new:
            skipped += 1
        else:
            new[run_id] = (folder, version)
    added = _insert_all(store, new, problems)
    store.con.execute("CHECKPOINT")
    return added, skipped


def _insert_all(store: Store, new: dict[str, tuple[Path, int]], problems: list[tuple[Path, str]]) -> int:
    """All new folders in one transaction (one statement per table: seconds for a long history); if
    that fails on damage the footer check could not see, folder by folder, skipping the bad ones."""
    if not new:
        return 0
    try:
        with store.transaction():
            _insert(store.con, new)
        return len(new)
    except duckdb.Error:
        pass
    added = 0
    for run_id, entry in new.items():
        try:
            with store.transaction():
                _insert(store.con, {run_id: entry})
            added += 1
        except duckdb.Error as e:
            problems.append((entry[0], f"unreadable ({str(e).splitlines()[0][:200]})"))
    return added


def _insert(con, new: dict[str, tuple[Path, int]]) -> None:
    for part, table in (("environment", "environments"), ("run", "runs"), ("results", "results")):
        files = "[" + ", ".join(_sql_str(folder / f"{part}.parquet") for folder, _ in new.values()) + "]"
        # by name: folders of an older schema lack the columns added since (NULL here)
        src = f"read_parquet({files}, union_by_name = true)"
        present = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
        cols = ", ".join(c for c in PARTS[part] if c in present)
        verb = "INSERT OR IGNORE" if table == "environments" else "INSERT"
        con.execute(f"{verb} INTO {table} ({cols}) SELECT {cols} FROM {src}")
    relabel_shapes(con, [run_id for run_id, (_, version) in new.items() if version < 2])
    legacy_ours(con, [run_id for run_id, (_, version) in new.items() if version < 8])


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
