"""The results store: one DuckDB file, long format.

Tables
- meta(key, value): 'app' = 'kcollect', 'schema_version' = N.
- environments: one row per distinct machine/software fingerprint (GPU, driver, CUDA, torch, ...).
- runs: one row per `kcollect run`: commit, timing config, measured ceilings, status.
- results: one row per (run, kernel, mode, provider, shape, dtype).
- view results_v: results joined with runs and environments, with GB/s, TFLOP/s and the fraction
  of the run's measured ceiling derived (never stored, so they cannot disagree with the times).

Everything that writes goes through `Store`; opening problems become `StoreError` with one clear
sentence. The CLI prints it and exits with its `code`: 2 for a file this kcollect cannot use as it is
(corrupt, truncated, of another program, of a newer schema) and for a --db whose folder does not
exist, 1 for the rest (in use, not writable, missing). Every block of a file is checked against its
checksum when it is opened, so that damage is found before a command reads or writes anything.
"""
from __future__ import annotations

import json
import mmap
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Sequence

import duckdb
import numpy as np

from .names import rate_sql

SCHEMA_VERSION = 8
APP = "kcollect"


class StoreError(Exception):
    """A store that cannot be opened or written, explained in one sentence; `code` is the exit status
    the CLI gives it."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class BadStoreFile(StoreError):
    """The file is not a store this kcollect can use (corrupt, truncated, foreign, too new): exit 2."""

    def __init__(self, message: str):
        super().__init__(message, code=2)


ENV_COLUMNS = {
    "env_id": "VARCHAR PRIMARY KEY",
    "device_kind": "VARCHAR",  # 'cuda' or 'cpu' (cpu rows come from Triton's interpreter)
    "gpu_name": "VARCHAR",
    "sm_count": "INTEGER",
    "gpu_mem_bytes": "BIGINT",
    "driver": "VARCHAR",
    "cuda": "VARCHAR",
    "torch": "VARCHAR",
    "triton": "VARCHAR",
    "python": "VARCHAR",
    "interpreted": "BOOLEAN",
    "peers": "VARCHAR",  # JSON {package: version} of the peer packages installed (liger-kernel, ...)
    # (schema 7) JSON {distribution: version} of the packages whose kcollect.kernels entry points
    # were loaded (a user's own kernels); None where there are none
    "plugins": "VARCHAR",
}

RUN_COLUMNS = {
    "run_id": "VARCHAR PRIMARY KEY",
    "env_id": "VARCHAR",
    "started_at": "TIMESTAMP",
    "finished_at": "TIMESTAMP",
    # 'unfinished' until the run ends: a crash or kill leaves it so; 'interrupted' on Ctrl-C
    "status": "VARCHAR",
    "git_commit": "VARCHAR",
    "commit_time": "TIMESTAMP",
    "git_dirty": "BOOLEAN",
    "grid": "VARCHAR",
    "copy_gbps": "DOUBLE",  # measured device-to-device copy, read + write
    "matmul_tflops": "DOUBLE",  # measured bf16 matmul
    "config": "VARCHAR",  # JSON of the run configuration (warm-up, repeats, seed, selection)
    "machine": "VARCHAR",  # --machine, default host name + GPU: two hosts of one GPU model are two series
    "commit_subject": "VARCHAR",  # the commit message's first line
    "commit_author": "VARCHAR",
    "commit_url": "VARCHAR",  # the commit's page, from the repository's remote (None where unknown)
    "phases": "VARCHAR",  # JSON {phase: seconds} of where the run's wall time went
    "shard": "VARCHAR",  # 'K/N' when the plan was split over machines (--shard), else None
    "device_index": "INTEGER",  # the CUDA device the run measured on (one run per GPU of a host)
    # (schema 7) one id for every run of one `kcollect run` (its workers' runs, one per GPU or CPU
    # worker), so that `summary` shows the whole command's rows
    "invocation": "VARCHAR",
    "kcollect_version": "VARCHAR",  # (schema 7) the installed kcollect that measured
    # (schema 7) the full SHA of the commit the installed kcollect was built from (None where unknown:
    # an install from a tree without git); git_commit is the commit the rows are keyed by
    "kcollect_commit": "VARCHAR",
}

RESULT_COLUMNS = {
    "run_id": "VARCHAR",
    "kernel": "VARCHAR",
    "mode": "VARCHAR",
    "provider": "VARCHAR",
    "shape": "VARCHAR",  # label with the dims' names, e.g. M=4096,N=14336
    "dims": "VARCHAR",  # JSON object of the named dims
    "dtype": "VARCHAR",
    "baseline": "VARCHAR",  # the kernel's baseline provider (so the site needs no kernel import)
    "bound": "VARCHAR",  # 'memory' or 'compute'
    "status": "VARCHAR",  # 'ok', 'unstable' (disturbed while timed), 'failed' (correctness gate),
    #                       'error' (exception), 'unavailable'
    "error": "VARCHAR",  # the reason for any status but ok
    "rel_err": "DOUBLE",
    "tolerance": "DOUBLE",
    "timing": "VARCHAR",  # 'cuda-events', 'cuda-graph' or 'cpu-clock'
    "median_ms": "DOUBLE",
    "p20_ms": "DOUBLE",
    "p80_ms": "DOUBLE",
    "mean_ms": "DOUBLE",
    "std_ms": "DOUBLE",
    "min_ms": "DOUBLE",
    "reps": "INTEGER",
    "peak_mem_bytes": "BIGINT",  # memory one call allocates beyond what existed before it
    "config": "VARCHAR",  # JSON of the tuned config the provider ran with (ours), else None
    "recheck_ms": "DOUBLE",  # median of a second, short measurement at the end of the case
    "free_mem_bytes": "BIGINT",  # device memory free when the provider was timed
    "alloc_mem_bytes": "BIGINT",  # bytes of this process's live tensors then (PyTorch's allocator)
    "reserved_mem_bytes": "BIGINT",  # bytes PyTorch's allocator held then (live, cached, graph pools)
    "clock_mhz": "DOUBLE",  # SM clock while it was timed (None where it cannot be read)
    "bytes": "BIGINT",
    "flops": "DOUBLE",
    "seq": "INTEGER",  # order of measurement within the run
    "p99_ms": "DOUBLE",  # (schema 4) the slowest percent of the timed calls starts here
    "max_ms": "DOUBLE",  # (schema 4) the slowest timed call
    "tokens": "BIGINT",  # (schema 5) tokens one call processes, where the op has them (spec.tokens)
    # (schema 6) wall seconds its measurement took, recheck and its share of the case's inputs,
    # references and release included: what the next run's estimate is fitted on (cost.py)
    "seconds": "DOUBLE",
    # (schema 8) the provider's code is this repository's (spec.Provider.ours): only these series can
    # fail the regression gate. Rows from before schema 8 are given it on import (legacy_ours).
    "ours": "BOOLEAN",
    # (schema 8) the peer distribution the provider runs ('liger-kernel'), '' for any other provider:
    # its version (environments.peers) is a condition of that provider's series only. NULL before
    # schema 8: unknown, so every peer version counts for the rows of providers that are not ours.
    "package": "VARCHAR",
}
RESULT_KEY = ("run_id", "kernel", "mode", "provider", "shape", "dtype")


def is_damage(e: duckdb.Error) -> bool:
    """Whether DuckDB's error says the file is damaged (as it read a block): a plain duckdb.Error
    ("Corrupt database file", "Corrupted DICT_FSST segment"), an I/O, internal or serialization
    error; not a wrong query or value, which is kcollect's own mistake."""
    return type(e) is duckdb.Error or isinstance(e, (duckdb.IOException, duckdb.InternalException,
                                                         duckdb.SerializationException))


HEADER_BYTES = 3 * 4096  # a DuckDB file's three header blocks, before its data blocks
CHECKSUM_FACTOR = np.uint64(0xBF58476D1CE4E5B9)


def damaged_blocks(path: Path, block_size: int, blocks: int) -> list[int]:
    """The blocks of a DuckDB file whose stored checksum does not match their content. Free blocks
    are checked too: they keep what was last written there, checksum included; those past the end
    of the file (cut off on checkpoint) are not there to check. Where no block matches, the file's
    format is not the one this knows (a DuckDB of another block layout): [] (nothing can be said;
    DuckDB's own checks still apply when blocks are read)."""
    blocks = min(blocks, (min(path.stat().st_size, HEADER_BYTES + block_size * blocks) - HEADER_BYTES) // block_size)
    if blocks <= 0:
        return []
    # mapped, not read: checked in the page cache's own pages (a copy of a large store cost more
    # CPU than its checksums), and unmapped before returning: a descriptor of the file left open
    # would drop DuckDB's lock on it when closed
    with open(path, "rb") as f, mmap.mmap(f.fileno(), HEADER_BYTES + block_size * blocks,
                                          access=mmap.ACCESS_READ) as mapped:
        bad = _bad_blocks(mapped, block_size, blocks)
    return [] if len(bad) == blocks else bad


def _bad_blocks(mapped: mmap.mmap, block_size: int, blocks: int) -> list[int]:
    """damaged_blocks of a mapped file (its arrays are views of the map: gone when this returns)."""
    data = np.frombuffer(mapped, dtype=np.uint8)
    bad = []
    for b in range(blocks):
        block = data[HEADER_BYTES + b * block_size: HEADER_BYTES + (b + 1) * block_size]
        with np.errstate(over="ignore"):
            computed = np.bitwise_xor.reduce(block[8:].view(np.uint64) * CHECKSUM_FACTOR) ^ np.uint64(5381)
        if computed != block[:8].view(np.uint64)[0]:
            bad.append(b)
    return bad


def _create(columns: dict[str, str], table: str, key: Sequence[str] = ()) -> str:
    cols = ", ".join(f"{n} {t}" for n, t in columns.items())
    pk = f", PRIMARY KEY ({', '.join(key)})" if key else ""
    return f"CREATE TABLE IF NOT EXISTS {table} ({cols}{pk})"


RESULTS_VIEW = f"""
CREATE OR REPLACE VIEW results_v AS
SELECT r.*, u.started_at, u.finished_at, u.status AS run_status, u.git_commit, u.commit_time,
       u.git_dirty, u.grid, u.copy_gbps, u.matmul_tflops, u.machine, u.commit_subject, u.commit_author,
       u.commit_url, u.shard, u.device_index, u.invocation, u.kcollect_version, u.kcollect_commit, e.*,
       CASE WHEN r.status = 'ok' THEN {rate_sql("memory")} END AS gbps,
       CASE WHEN r.status = 'ok' THEN {rate_sql("compute")} END AS tflops,
       CASE WHEN r.status <> 'ok' THEN NULL
            WHEN r.bound = 'compute' THEN {rate_sql("compute")} / u.matmul_tflops
            ELSE {rate_sql("memory")} / u.copy_gbps END AS frac_of_peak
FROM results r JOIN runs u USING (run_id) JOIN environments e USING (env_id)
"""

# Migrations from version N to N+1, in order: SQL statements, or a function of the connection.
# A change appends one here and bumps SCHEMA_VERSION; history.py migrates run folders the same way.
ADDED = {1: {"environments": ["peers"],
             "runs": ["machine", "commit_subject", "commit_author", "commit_url", "phases", "shard", "device_index"],
             "results": ["config", "recheck_ms", "free_mem_bytes", "clock_mhz"]},
         2: {"results": ["alloc_mem_bytes", "reserved_mem_bytes"]},
         3: {"results": ["p99_ms", "max_ms"]},
         4: {"results": ["tokens"]},
         5: {"results": ["seconds"]},
         6: {"environments": ["plugins"], "runs": ["invocation", "kcollect_version", "kcollect_commit"]},
         7: {"results": ["ours", "package"]}}


def relabel_shapes(con, run_ids: str | Sequence[str] | None = None) -> None:
    """v1 labels were the bare values (4096x14336); v2 names them (M=4096,N=14336), from dims; of
    every row, or of these runs' rows. One UPDATE through a table of labels: one statement per
    distinct dims cost seconds per run."""
    ids = [run_ids] if isinstance(run_ids, str) else list(run_ids or ())
    if run_ids is not None and not ids:
        return
    where = f"WHERE run_id IN ({', '.join('?' * len(ids))})" if ids else ""
    dims = [d for (d,) in con.execute(f"SELECT DISTINCT dims FROM results {where}", ids).fetchall() if d]
    if not dims:
        return
    con.execute("CREATE OR REPLACE TEMP TABLE kc_labels (dims VARCHAR, label VARCHAR)")
    con.executemany("INSERT INTO kc_labels VALUES (?, ?)",
                    [[d, ",".join(f"{k}={v}" for k, v in json.loads(d).items())] for d in dims])
    con.execute("UPDATE results SET shape = kc_labels.label FROM kc_labels WHERE results.dims = kc_labels.dims"
                + where.replace("WHERE run_id", " AND results.run_id"), ids)
    con.execute("DROP TABLE kc_labels")


def legacy_ours(con, run_ids: Sequence[str] | None = None) -> None:
    """Rows stored before schema 8 did not say whose code they timed. Until then our kernels were
    always the provider named 'triton', and the backbones' own was 'kcollect': every row, or these
    runs' rows, gets `ours` from that rule (rows written since carry Provider.ours)."""
    where = f"AND run_id IN ({', '.join('?' * len(run_ids))})" if run_ids else ""
    if run_ids is not None and not run_ids:
        return
    con.execute("UPDATE results SET ours = (provider = 'triton' OR (kernel = 'backbone' AND provider = 'kcollect')) "
                f"WHERE ours IS NULL {where}", list(run_ids or ()))


def _add_columns(version: int):
    tables = {"environments": ENV_COLUMNS, "runs": RUN_COLUMNS, "results": RESULT_COLUMNS}
    return [f"ALTER TABLE {t} ADD COLUMN {c} {tables[t][c]}" for t, cols in ADDED[version].items() for c in cols]


MIGRATIONS: dict[int, list] = {1: ["DROP VIEW IF EXISTS results_v", *_add_columns(1), relabel_shapes],
                               2: ["DROP VIEW IF EXISTS results_v", *_add_columns(2)],
                               3: ["DROP VIEW IF EXISTS results_v", *_add_columns(3)],
                               4: ["DROP VIEW IF EXISTS results_v", *_add_columns(4)],
                               5: ["DROP VIEW IF EXISTS results_v", *_add_columns(5)],
                               6: ["DROP VIEW IF EXISTS results_v", *_add_columns(6)],
                               7: ["DROP VIEW IF EXISTS results_v", *_add_columns(7), legacy_ours]}


@dataclass
class Environment:
    env_id: str
    device_kind: str
    gpu_name: str | None
    sm_count: int | None
    gpu_mem_bytes: int | None
    driver: str | None
    cuda: str | None
    torch: str
    triton: str
    python: str
    interpreted: bool
    peers: str | None = None
    plugins: str | None = None


@dataclass
class Run:
    run_id: str
    env_id: str
    started_at: Any
    finished_at: Any
    status: str
    git_commit: str | None
    commit_time: Any
    git_dirty: bool | None
    grid: str
    copy_gbps: float | None
    matmul_tflops: float | None
    config: str
    machine: str | None = None
    commit_subject: str | None = None
    commit_author: str | None = None
    commit_url: str | None = None
    phases: str | None = None
    shard: str | None = None
    device_index: int | None = None
    invocation: str | None = None
    kcollect_version: str | None = None
    kcollect_commit: str | None = None


def _values(obj: Any) -> list[Any]:
    return [getattr(obj, f.name) for f in fields(obj)]


assert [f.name for f in fields(Environment)] == list(ENV_COLUMNS)
assert [f.name for f in fields(Run)] == list(RUN_COLUMNS)


class Store:
    """A kcollect DuckDB file. `read_only` opens without a write lock (for build-site, export).
    `create_folder`: make the file's folder where it is missing; the commands pass False for any
    --db but the default (a typo must not make directories: common.open_store)."""

    def __init__(self, path: str | os.PathLike, read_only: bool = False, create_folder: bool = True):
        self.path = Path(path)
        if read_only and not self.path.exists():
            raise StoreError(f"no store at {self.path}: run `kcollect run` or `kcollect import` first")
        if not read_only:
            parent = self.path.parent
            if not parent.is_dir() and not create_folder:
                raise StoreError(f"the folder {parent} of the store {self.path} does not exist (create it, or "
                                 "choose another --db)", code=2)
            try:
                parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create the folder {parent}: {e.strerror}") from None
            if not os.access(parent, os.W_OK) or (self.path.exists() and not os.access(self.path, os.W_OK)):
                raise StoreError(f"cannot write the store {self.path}: permission denied (choose another --db)")
        if self.path.exists():
            self._check_file()
        self.con = self._connect(read_only)
        try:
            self._check_or_init(read_only)
        except StoreError:
            self.con.close()
            raise
        except duckdb.Error as e:  # a damaged catalog or meta table shows only when read
            self.con.close()
            raise BadStoreFile(f"{self.path} is a damaged DuckDB file ({str(e).splitlines()[0]})") from None

    def _connect(self, read_only: bool):
        try:
            return duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.IOException as e:
            msg = str(e)
            if "lock" in msg.lower():
                raise StoreError(f"the store {self.path} is in use by another kcollect process; "
                                 "wait for it to finish or use another --db") from None
            if not self.path.exists():
                raise StoreError(f"cannot create the store {self.path} ({msg.splitlines()[0]})") from None
            raise BadStoreFile(f"{self.path} is not a readable DuckDB file ({msg.splitlines()[0]})") from None
        except duckdb.Error as e:
            raise BadStoreFile(f"{self.path} is not a readable DuckDB file ({str(e).splitlines()[0]})") from None

    def _check_file(self) -> None:
        """The file whole, before a command reads or writes anything: its length, then every block
        against its checksum. Done through a connection of its own, closed before the store's opens:
        this process reading the file while DuckDB holds its lock would drop the lock (POSIX locks
        go with any descriptor of the file that the process closes)."""
        con = self._connect(read_only=True)
        try:
            block_size, blocks = self._check_size(con)
        except duckdb.Error as e:  # a damaged catalog shows here
            raise BadStoreFile(f"{self.path} is a damaged DuckDB file ({str(e).splitlines()[0]})") from None
        finally:
            con.close()
        self._check_blocks(block_size, blocks)

    def _check_size(self, con) -> tuple[int, int]:
        """A truncated file opens, and fails only when a missing block is read (mid-way through a
        command): compare the file's length with the blocks its header says are in use and the last
        block its tables' data sits in (free blocks at the end are cut off the file on checkpoint).
        -> (block size, blocks in the header's count)."""
        row = con.execute("PRAGMA database_size").fetchone()
        block_size, total, used = int(row[2]), int(row[3]), int(row[4])
        last = -1
        for (table,) in con.execute("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_schema = 'main' AND table_type = 'BASE TABLE'").fetchall():
            found = con.execute("SELECT max(block_id) FROM pragma_storage_info(?) WHERE block_id >= 0",
                                [table]).fetchone()[0]
            last = max(last, -1 if found is None else int(found))
        expected = HEADER_BYTES + block_size * max(used, last + 1)
        actual = self.path.stat().st_size
        if actual < expected:
            raise BadStoreFile(f"{self.path} is truncated ({actual} of at least {expected} bytes); restore it "
                               "from a backup or rebuild it with `kcollect import data/runs`")
        return block_size, total

    def _check_blocks(self, block_size: int, blocks: int) -> None:
        """A damaged block (a disk error, a bad copy) is found by DuckDB only when a query reads it:
        a command would fail half-way (a traceback in `summary`, or `run` writing its rows into
        the file). So every block is checked first: DuckDB keeps a checksum in the first 8 bytes of
        each block (checksum.cpp: 5381 XOR, over the block's other 64-bit words, each word times
        0xbf58476d1ce4e5b9); about 30 ms for a 14 MB store."""
        bad = damaged_blocks(self.path, block_size, blocks)
        if bad:
            raise BadStoreFile(f"{self.path} is damaged: block {bad[0]} of {blocks} fails its checksum"
                               f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}; restore it from a "
                               "backup or rebuild it with `kcollect import data/runs`")

    def _tables(self) -> set[str]:
        rows = self.con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()
        return {r[0] for r in rows}

    def _check_or_init(self, read_only: bool) -> None:
        tables = self._tables()
        if not tables:
            if read_only:
                raise BadStoreFile(f"{self.path} is an empty DuckDB file, not a kcollect store")
            self._create_schema()
            return
        if "meta" not in tables:
            raise BadStoreFile(f"{self.path} is a DuckDB file of another program (tables: "
                             f"{', '.join(sorted(tables))}); refusing to touch it")
        meta = dict(self.con.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("app") != APP:
            raise BadStoreFile(f"{self.path} is a DuckDB file of another program; refusing to touch it")
        try:
            version = int(meta.get("schema_version", 0))
        except ValueError:
            raise BadStoreFile(f"{self.path} has an unreadable schema version "
                               f"{meta.get('schema_version')!r}") from None
        if version > SCHEMA_VERSION:
            raise BadStoreFile(f"{self.path} has schema version {version}, newer than this kcollect "
                             f"({SCHEMA_VERSION}); upgrade kcollect")
        if version < SCHEMA_VERSION:
            if read_only:
                raise StoreError(f"{self.path} has schema version {version}; open it once with "
                                 "`kcollect import` to migrate it")
            self._migrate(version)

    def _create_schema(self) -> None:
        with self.transaction():
            self.con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
            self.con.execute(_create(ENV_COLUMNS, "environments"))
            self.con.execute(_create(RUN_COLUMNS, "runs"))
            self.con.execute(_create(RESULT_COLUMNS, "results", RESULT_KEY))
            self.con.execute(RESULTS_VIEW)
            self.con.execute("INSERT INTO meta VALUES ('app', ?), ('schema_version', ?)", [APP, str(SCHEMA_VERSION)])

    def _migrate(self, version: int) -> None:
        with self.transaction():
            for v in range(version, SCHEMA_VERSION):
                for step in MIGRATIONS[v]:
                    step(self.con) if callable(step) else self.con.execute(step)
            self.con.execute(RESULTS_VIEW)
            self.con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])

    # -- writing --------------------------------------------------------------------------------

    def transaction(self):
        store = self

        class _Tx:
            def __enter__(self):
                store.con.execute("BEGIN TRANSACTION")

            def __exit__(self, exc_type, exc, tb):
                if exc_type is None:
                    store.con.execute("COMMIT")
                else:
                    store.con.execute("ROLLBACK")
                return False

        return _Tx()

    def _write(self, fn) -> None:
        try:
            with self.transaction():
                fn()
            # Checkpoint so that what was just written is in the main file, not only in the WAL.
            self.con.execute("CHECKPOINT")
        except duckdb.Error as e:
            if not is_damage(e):
                raise
            first = str(e).splitlines()[0]
            code = 2 if "corrupt" in first.lower() or not isinstance(e, duckdb.IOException) else 1
            raise StoreError(f"could not write to {self.path} ({first}); rows written before this are kept",
                             code=code) from None

    def add_environment(self, env: Environment) -> None:
        def go():
            self.con.execute(f"INSERT OR IGNORE INTO environments VALUES ({', '.join('?' * len(ENV_COLUMNS))})",
                             _values(env))

        self._write(go)

    def start_run(self, run: Run) -> None:
        self._write(lambda: self.con.execute(
            f"INSERT INTO runs VALUES ({', '.join('?' * len(RUN_COLUMNS))})", _values(run)))

    def finish_run(self, run_id: str, status: str, finished_at: Any, phases: str | None = None) -> None:
        self._write(lambda: self.con.execute(
            "UPDATE runs SET status = ?, finished_at = ?, phases = coalesce(?, phases) WHERE run_id = ?",
            [status, finished_at, phases, run_id]))

    def add_results(self, rows: Iterable[dict[str, Any]]) -> None:
        # the last of rows with one key wins, as row-by-row replacing would have it (within one
        # statement DuckDB keeps the first)
        rows = list({tuple(row.get(k) for k in RESULT_KEY): row for row in rows}.values())
        if not rows:
            return
        cols = list(RESULT_COLUMNS)
        one = f"({', '.join('?' * len(cols))})"

        def insert() -> None:
            # a statement per 64 rows: DuckDB's executemany runs one per row (a case's rows took
            # 6x the time), and one statement of thousands of rows parses slowly
            for i in range(0, len(rows), 64):
                part = rows[i:i + 64]
                self.con.execute(f"INSERT OR REPLACE INTO results VALUES {', '.join([one] * len(part))}",
                                 [row.get(c) for row in part for c in cols])

        self._write(insert)

    def delete_runs(self, run_ids: Sequence[str]) -> None:
        """The runs, their rows, and the environments no other run uses."""
        marks = ", ".join("?" * len(run_ids))

        def go() -> None:
            self.con.execute(f"DELETE FROM results WHERE run_id IN ({marks})", list(run_ids))
            self.con.execute(f"DELETE FROM runs WHERE run_id IN ({marks})", list(run_ids))
            self.con.execute("DELETE FROM environments WHERE env_id NOT IN (SELECT env_id FROM runs)")

        self._write(go)

    # -- reading --------------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] = (), by_column: bool = False) -> list[dict[str, Any]]:
        """Rows as dicts. `by_column`: read column by column (for columns of numbers, text, booleans and
        timestamps only): the same dicts, a third faster on a long history."""
        try:
            cur = self.con.execute(sql, list(params))
        except duckdb.Error as e:  # damage the checksums cannot see (DuckDB's own checks, as it reads)
            if not is_damage(e):
                raise
            self.con.close()  # of no further use
            raise BadStoreFile(f"{self.path} is a damaged DuckDB file ({str(e).splitlines()[0]})") from None
        names = [d[0] for d in cur.description]
        if by_column:
            columns = cur.fetchnumpy()  # NULLs masked: tolist() gives None for them, as fetchall() does
            return [dict(zip(names, row)) for row in zip(*(columns[n].tolist() for n in names))]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def run_ids(self) -> set[str]:
        return {r[0] for r in self.con.execute("SELECT run_id FROM runs").fetchall()}

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def config_json(config: Any) -> str:
    return json.dumps(asdict(config) if hasattr(config, "__dataclass_fields__") else config, sort_keys=True, default=str)
