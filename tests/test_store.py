"""The DuckDB store and the Parquet history: round trips, idempotent import, refusing bad files."""
from datetime import datetime

import duckdb
import pytest

from kcollect import history
from kcollect.store import ADDED, SCHEMA_VERSION, Environment, Run, Store, StoreError


def _env(env_id="e1", gpu="NVIDIA H200"):
    return Environment(env_id=env_id, device_kind="cuda", gpu_name=gpu, sm_count=132, gpu_mem_bytes=141 << 30,
                       driver="580", cuda="13.0", torch="2.11", triton="3.6", python="3.12", interpreted=False)


def _run(run_id, env_id="e1", commit="abc", status="finished"):
    return Run(run_id=run_id, env_id=env_id, started_at=datetime(2026, 11, 22, 3, 0, 0), finished_at=None,
               status=status, git_commit=commit, commit_time=datetime(2026, 11, 21, 12, 0), git_dirty=False,
               grid="full", copy_gbps=4000.0, matmul_tflops=700.0, config="{}")


def _result(run_id, provider="triton", median=1.0, status="ok", shape="4096x4096"):
    spread = dict(p20_ms=median * 0.99, p80_ms=median * 1.01, min_ms=median * 0.98) if median else {}
    return spread | dict(run_id=run_id, kernel="rms_norm", mode="fwd", provider=provider, shape=shape,
                dims='{"M": 4096, "N": 4096}', dtype="bfloat16", baseline="torch", bound="memory", status=status,
                error=None, rel_err=1e-3, tolerance=1e-2, timing="cuda-events", median_ms=median, mean_ms=median,
                std_ms=0.01, reps=100,
                peak_mem_bytes=1 << 20, bytes=2 * 4096 * 4096 * 2, flops=0.0, seq=1)


def _fill(path, run_id="r-0000001", **kw):
    with Store(path) as s:
        s.add_environment(_env())
        s.start_run(_run(run_id, **kw))
        s.add_results([_result(run_id), _result(run_id, provider="torch", median=2.0)])
    return path


def test_new_store_has_schema_version(tmp_path):
    with Store(tmp_path / "k.duckdb") as s:
        meta = dict(s.con.execute("SELECT key, value FROM meta").fetchall())
    assert meta == {"app": "kcollect", "schema_version": str(SCHEMA_VERSION)}


def test_round_trip_and_derived_rates(tmp_path):
    path = _fill(tmp_path / "k.duckdb")
    with Store(path, read_only=True) as s:
        rows = s.query("SELECT provider, median_ms, gbps, frac_of_peak, gpu_name FROM results_v ORDER BY provider")
    assert [r["provider"] for r in rows] == ["torch", "triton"]
    triton = rows[1]
    assert triton["gbps"] == pytest.approx(2 * 4096 * 4096 * 2 / 1e6)
    assert triton["frac_of_peak"] == pytest.approx(triton["gbps"] / 4000.0)
    assert triton["gpu_name"] == "NVIDIA H200"


def test_failed_rows_have_no_rate(tmp_path):
    path = tmp_path / "k.duckdb"
    with Store(path) as s:
        s.add_environment(_env())
        s.start_run(_run("r1"))
        s.add_results([_result("r1", status="failed", median=None)])
        assert s.query("SELECT gbps, frac_of_peak FROM results_v")[0] == {"gbps": None, "frac_of_peak": None}


def test_foreign_duckdb_is_refused_and_untouched(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE sales (x INTEGER)")
    con.execute("INSERT INTO sales VALUES (42)")
    con.close()
    with pytest.raises(StoreError, match="another program"):
        Store(path)
    con = duckdb.connect(str(path))
    assert con.execute("SELECT * FROM sales").fetchall() == [(42,)]
    assert {r[0] for r in con.execute("SHOW TABLES").fetchall()} == {"sales"}


def test_corrupt_file_is_refused_and_untouched(tmp_path):
    path = tmp_path / "k.duckdb"
    junk = b"this is not a database" * 100
    path.write_bytes(junk)
    with pytest.raises(StoreError, match="not a readable DuckDB file"):
        Store(path)
    assert path.read_bytes() == junk


def test_newer_schema_is_refused(tmp_path):
    path = _fill(tmp_path / "k.duckdb")
    con = duckdb.connect(str(path))
    con.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(StoreError, match="newer than this kcollect"):
        Store(path)


@pytest.mark.parametrize("version", range(2, SCHEMA_VERSION))
def test_a_store_of_an_older_version_is_migrated_with_its_rows(tmp_path, version):
    # the columns added since `version` dropped again (v1's relabelling has a test of its own below)
    path = _fill(tmp_path / "k.duckdb")
    con = duckdb.connect(str(path))
    con.execute("DROP VIEW results_v")
    for v in range(version, SCHEMA_VERSION):
        for table, columns in ADDED[v].items():
            for column in columns:
                con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(version)])
    con.close()
    with Store(path) as s:
        assert s.query("SELECT value FROM meta WHERE key = 'schema_version'") == [{"value": str(SCHEMA_VERSION)}]
        rows = s.query("SELECT provider, median_ms, seconds, ours, package FROM results_v ORDER BY provider")
    # rows from before schema 8 get `ours` from the one rule of their time (legacy_ours), no package
    assert rows == [{"provider": "torch", "median_ms": 2.0, "seconds": None, "ours": False, "package": None},
                    {"provider": "triton", "median_ms": 1.0, "seconds": None, "ours": True, "package": None}]


def test_uncreatable_path_is_explained(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot create"):
        Store(blocker / "k.duckdb")


def test_a_db_in_a_missing_folder_is_refused_and_nothing_is_made(tmp_path):
    from click.testing import CliRunner

    from kcollect.cli import main

    db = tmp_path / "nowhere" / "deeper" / "k.duckdb"
    with pytest.raises(StoreError, match="does not exist") as e:
        Store(db, create_folder=False)
    assert e.value.code == 2
    (folder,) = _folders(tmp_path, n=1)
    for args in (["import", str(folder)], ["run", "swiglu", "--device", "cpu", "--mode", "fwd", "--provider", "torch"],
                 ["build-site", "--out", str(tmp_path / "site"), "--data", str(folder.parent)]):
        r = CliRunner().invoke(main, args + ["--db", str(db)])
        assert r.exit_code == 2, (args, r.output)
        assert r.output.count("\n") == 1 and "does not exist" in r.output, (args, r.output)
    assert not (tmp_path / "nowhere").exists()


def test_missing_store_read_only(tmp_path):
    with pytest.raises(StoreError, match="no store"):
        Store(tmp_path / "none.duckdb", read_only=True)


def test_second_writer_gets_a_clear_message(tmp_path):
    # DuckDB's lock is per process; a second process is what a user would start.
    import subprocess
    import sys

    path = _fill(tmp_path / "k.duckdb")
    holder = Store(path)
    try:
        code = ("from kcollect.store import Store, StoreError\n"
                f"try:\n    Store({str(path)!r})\nexcept StoreError as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    assert "in use by another kcollect process" in out.stdout, out.stdout + out.stderr


def test_export_import_round_trip_is_idempotent(tmp_path):
    src = _fill(tmp_path / "src.duckdb")
    runs_dir = tmp_path / "runs"
    with Store(src, read_only=True) as s:
        written = history.export_runs(s, runs_dir)
        assert len(written) == 1 and (written[0] / "results.parquet").exists()
        assert history.export_runs(s, runs_dir) == []  # already exported: nothing new
    dst = tmp_path / "dst.duckdb"
    with Store(dst) as d:
        assert history.import_path(d, runs_dir) == (1, 0)
        assert history.import_path(d, runs_dir) == (0, 1)
        rows = d.query("SELECT provider, median_ms FROM results ORDER BY provider")
        assert rows == [{"provider": "torch", "median_ms": 2.0}, {"provider": "triton", "median_ms": 1.0}]
        assert d.query("SELECT count(*) AS n FROM environments")[0]["n"] == 1


def test_import_from_another_duckdb_merges_runs(tmp_path):
    a = _fill(tmp_path / "a.duckdb", run_id="run-a")
    b = _fill(tmp_path / "b.duckdb", run_id="run-b", commit="def")
    with Store(a) as s:
        assert history.import_path(s, b) == (1, 0)
        assert history.import_path(s, b) == (0, 1)
        assert s.run_ids() == {"run-a", "run-b"}
        assert s.query("SELECT count(*) AS n FROM results")[0]["n"] == 4


def test_import_of_nothing_is_an_error(tmp_path):
    with Store(tmp_path / "k.duckdb") as s, pytest.raises(StoreError, match="nothing to import"):
        history.import_path(s, tmp_path / "missing")


# -- damaged stores and run folders ------------------------------------------------------------------


def test_truncated_store_is_refused_with_exit_code_2_and_untouched(tmp_path):
    path = _fill(tmp_path / "k.duckdb")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    for read_only in (True, False):
        with pytest.raises(StoreError, match="is truncated") as e:
            Store(path, read_only=read_only)
        assert e.value.code == 2
    assert path.read_bytes() == data[:len(data) // 2]


def test_bad_files_exit_2_and_busy_or_missing_exit_1(tmp_path):
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"x" * 5000)
    newer = _fill(tmp_path / "newer.duckdb")
    con = duckdb.connect(str(newer))
    con.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    con.close()
    for path in (junk, newer):
        with pytest.raises(StoreError) as e:
            Store(path, read_only=True)
        assert e.value.code == 2, e.value
    with pytest.raises(StoreError) as e:
        Store(tmp_path / "none.duckdb", read_only=True)
    assert e.value.code == 1


def _folders(tmp_path, n=3):
    """n exported run folders (one per run) under tmp_path/runs."""
    src = tmp_path / "src.duckdb"
    with Store(src) as s:
        s.add_environment(_env())
        for i in range(n):
            s.start_run(_run(f"run-{i}", commit=f"c{i}"))
            s.add_results([_result(f"run-{i}", median=1.0 + i)])
    with Store(src, read_only=True) as s:
        return history.export_runs(s, tmp_path / "runs")


def test_import_skips_incomplete_and_corrupt_folders_and_names_them(tmp_path):
    good, truncated, partial = _folders(tmp_path)
    parquet = truncated / "results.parquet"
    parquet.write_bytes(parquet.read_bytes()[:100])  # a killed copy
    partial.rename(partial.with_name(partial.name + ".partial"))  # a killed export
    problems = history.problem_folders(tmp_path / "runs")
    assert sorted((p.name, reason.split(" ")[0]) for p, reason in problems) == sorted(
        [(truncated.name, "unreadable"), (partial.name + ".partial", "incomplete:")])
    found = []
    with Store(tmp_path / "k.duckdb") as d:
        assert history.import_path(d, tmp_path / "runs", found) == (1, 0)
        assert found == problems
        assert d.run_ids() == {"run-0"}  # nothing of the broken folders reached the store
        assert d.query("SELECT count(*) AS n FROM results")[0]["n"] == 1


def test_import_names_a_run_folder_missing_a_file(tmp_path):
    # a folder whose run.parquet is lost is not passed over in silence
    good, lost, _ = _folders(tmp_path)
    (lost / "run.parquet").unlink()
    from click.testing import CliRunner

    from kcollect.cli import main

    r = CliRunner().invoke(main, ["import", str(tmp_path / "runs"), "--db", str(tmp_path / "k.duckdb")])
    assert r.exit_code == 1, r.output
    assert f"kcollect: error: skipped {lost}: incomplete: no run.parquet" in r.stderr
    assert "2 run(s) imported, 0 already present, 1 folder(s) skipped" in r.stdout


def test_import_command_exit_codes(tmp_path):
    from click.testing import CliRunner

    from kcollect.cli import main

    good, bad, _ = _folders(tmp_path)
    (bad / "run.parquet").write_bytes(b"PAR1 not really")
    db = str(tmp_path / "k.duckdb")
    r = CliRunner().invoke(main, ["import", str(tmp_path / "runs"), "--db", db])
    assert r.exit_code == 1, r.output
    assert f"kcollect: error: skipped {bad}: unreadable" in r.stderr
    assert "2 run(s) imported, 0 already present, 1 folder(s) skipped" in r.stdout
    r = CliRunner().invoke(main, ["import", str(tmp_path / "nowhere"), "--db", db])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "no such file or folder" in r.output


def test_schema_1_folder_is_migrated_on_import(tmp_path):
    (folder,) = _folders(tmp_path, n=1)
    con = duckdb.connect()
    old = folder / "run.parquet"
    # a version-1 folder: no schema_version column, no columns added since, bare shape labels
    con.execute(f"COPY (SELECT * EXCLUDE (schema_version, machine, commit_subject, commit_author, commit_url, "
                f"phases, shard, device_index) FROM read_parquet('{old}')) TO '{folder / 'r1.parquet'}' (FORMAT parquet)")
    (folder / "r1.parquet").replace(old)
    res = folder / "results.parquet"
    con.execute(f"COPY (SELECT * REPLACE ('4096x4096' AS shape) FROM read_parquet('{res}')) "
                f"TO '{folder / 'x1.parquet'}' (FORMAT parquet)")
    (folder / "x1.parquet").replace(res)
    with Store(tmp_path / "k.duckdb") as d:
        assert history.import_path(d, tmp_path / "runs") == (1, 0)
        assert d.query("SELECT shape, machine FROM results_v") == [{"shape": "M=4096,N=4096", "machine": None}]


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_a_run_folder_of_every_older_version_is_imported(tmp_path, version):
    (folder,) = _folders(tmp_path, n=1)
    con = duckdb.connect()
    for part, table in (("environment", "environments"), ("run", "runs"), ("results", "results")):
        # the columns added since `version` dropped, and the version it was written with
        gone = [c for v in range(version, SCHEMA_VERSION) for c in ADDED[v].get(table, [])]
        gone += ["schema_version"] if part == "run" else []
        path = folder / f"{part}.parquet"
        stamp = f", {version} AS schema_version" if part == "run" and version > 1 else ""
        con.execute(f"COPY (SELECT * EXCLUDE ({', '.join(gone)}){stamp} FROM read_parquet('{path}')) "
                    f"TO '{folder / 'old.parquet'}' (FORMAT parquet)" if gone else
                    f"COPY (SELECT *{stamp} FROM read_parquet('{path}')) TO '{folder / 'old.parquet'}' (FORMAT parquet)")
        (folder / "old.parquet").replace(path)
    with Store(tmp_path / "k.duckdb") as d:
        assert history.import_path(d, tmp_path / "runs") == (1, 0)
        (row,) = d.query("SELECT shape, ours, package, invocation, plugins FROM results_v")
    shape = "M=4096,N=4096" if version == 1 else "4096x4096"  # v1's bare labels are named from dims
    assert row == {"shape": shape, "ours": True, "package": None, "invocation": None, "plugins": None}


def test_every_committed_run_folder_is_imported(tmp_path):
    from pathlib import Path

    runs = Path(__file__).resolve().parent.parent / "data" / "runs"
    folders = history.run_folders(runs)
    with Store(tmp_path / "k.duckdb") as d:
        assert history.import_path(d, runs) == (len(folders), 0)
        # every row says whose code it timed: older folders by the rule of their time (legacy_ours)
        assert d.query("SELECT count(*) AS n FROM results WHERE ours IS NULL") == [{"n": 0}]
        ours = {(r["kernel"], r["provider"]) for r in d.query("SELECT DISTINCT kernel, provider FROM results WHERE ours")}
        # schema 7's provenance kept where its folders carry it
        kept = d.query("SELECT count(*) AS n FROM runs WHERE invocation IS NOT NULL AND kcollect_commit IS NOT NULL")
    assert {p for _, p in ours} == {"triton", "kcollect"} and all(k == "backbone" for k, p in ours if p == "kcollect")
    assert kept[0]["n"] >= 3


@pytest.mark.parametrize("damage", ["truncated", "newer"])
def test_every_command_refuses_a_damaged_store_with_one_line_and_exit_2(tmp_path, damage):
    from click.testing import CliRunner

    from kcollect.cli import main

    path = _fill(tmp_path / "k.duckdb")
    if damage == "newer":
        con = duckdb.connect(str(path))
        con.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
        con.close()
    else:
        path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    before = path.read_bytes()
    db = ["--db", str(path)]
    incoming = _folders(tmp_path / "incoming", n=1)[0]  # a good run folder: the store is what is wrong
    for args in (["summary"], ["compare", "abc", "def"], ["build-site", "--out", str(tmp_path / "site"), "--data", ""],
                 ["import", str(incoming)], ["export", "--out", str(tmp_path / "runs")],
                 ["run", "swiglu", "--device", "cpu", "--mode", "fwd", "--provider", "torch"]):
        r = CliRunner().invoke(main, args + db)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.count("\n") == 1 and r.output.startswith("kcollect: error: "), (args, r.output)
        assert ("truncated" if damage == "truncated" else "newer than this kcollect") in r.output
    assert path.read_bytes() == before


def _damage_a_block(path, table="results", seed=46):
    """Random bytes over part of one of the table's data blocks, the file's size and header kept:
    a disk error or a bad copy, which only DuckDB's reading of that block would otherwise find."""
    import random

    from kcollect.store import HEADER_BYTES

    con = duckdb.connect(str(path), read_only=True)
    block_size = con.execute("PRAGMA database_size").fetchone()[2]
    block = con.execute("SELECT min(block_id) FROM pragma_storage_info(?) WHERE block_id >= 0", [table]).fetchone()[0]
    con.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + block * block_size + 64)
        f.write(random.Random(seed).randbytes(256))
    assert path.stat().st_size == size
    return block


def test_every_command_refuses_a_store_with_a_damaged_block(tmp_path):
    # a real store, one data block of its results damaged: every command that reads or writes a
    # store says so in one line and exits 2, and writes nothing (no rows, no site, no folders)
    from click.testing import CliRunner

    from kcollect.cli import main

    path = _fill(tmp_path / "k.duckdb")
    with Store(path, read_only=True) as s:  # it was whole: the rows read
        assert len(s.query("SELECT * FROM results")) == 2
    block = _damage_a_block(path)
    before = path.read_bytes()
    (tmp_path / "other").mkdir()
    (folder,) = _folders(tmp_path / "other", n=1)
    db = ["--db", str(path)]
    commands = (["summary"], ["runs"], ["rm", "r-0000001", "--yes"], ["compare", "abc", "def"],
                ["build-site", "--out", str(tmp_path / "site"), "--data", str(folder.parent)],
                ["export", "--out", str(tmp_path / "runs")], ["import", str(folder)],
                ["run", "swiglu", "--device", "cpu", "--mode", "fwd", "--provider", "torch"],
                ["run", "swiglu", "--device", "cpu", "--dry-run"])
    for args in commands:
        r = CliRunner().invoke(main, args + db)
        assert r.exit_code == 2, (args, r.output, r.exception)
        assert r.output.count("\n") == 1 and r.output.startswith("kcollect: error: "), (args, r.output)
        assert f"block {block} of" in r.output and "fails its checksum" in r.output, (args, r.output)
    # another store given to import is checked the same way, and the store it would go into is untouched
    dst = _fill(tmp_path / "dst.duckdb", run_id="r-dst")
    whole = dst.read_bytes()
    r = CliRunner().invoke(main, ["import", str(path), "--db", str(dst)])
    assert r.exit_code == 2 and "fails its checksum" in r.output and r.output.count("\n") == 1, r.output
    assert dst.read_bytes() == whole
    assert path.read_bytes() == before and not path.with_name(path.name + ".wal").exists()
    assert not (tmp_path / "site").exists() and not (tmp_path / "runs").exists()


def test_free_blocks_and_rewritten_stores_raise_no_false_alarm(tmp_path):
    # runs added and deleted leave free blocks (some cut off the end of the file): none is damage
    path = tmp_path / "k.duckdb"
    for i in range(4):
        with Store(path) as s:
            s.add_environment(_env())
            s.start_run(_run(f"run-{i}"))
            s.add_results([_result(f"run-{i}", provider=f"p{j}", shape=f"M={i},N={j}") for j in range(800)])
            if i % 2:
                s.delete_runs([f"run-{i - 1}"])
    con = duckdb.connect(str(path), read_only=True)
    free = con.execute("PRAGMA database_size").fetchone()[5]
    con.close()
    assert free > 0
    with Store(path, read_only=True) as s:
        assert s.run_ids() == {"run-1", "run-3"}


def test_build_site_builds_from_the_whole_folders(tmp_path):
    from click.testing import CliRunner

    from kcollect.cli import main

    good, bad, partial = _folders(tmp_path)
    (bad / "results.parquet").write_bytes((bad / "results.parquet").read_bytes()[:64])
    partial.rename(partial.with_name(partial.name + ".partial"))
    r = CliRunner().invoke(main, ["build-site", "--db", str(tmp_path / "k.duckdb"), "--out", str(tmp_path / "site"),
                                  "--data", str(tmp_path / "runs")])
    assert r.exit_code == 0, r.output
    assert "imported 1 run(s)" in r.output and (tmp_path / "site" / "index.html").is_file()
    assert [p.name for p, _ in history.problem_folders(tmp_path / "runs")] == sorted(
        [bad.name, partial.name + ".partial"])


def test_rows_are_stored_in_any_number_and_the_last_of_one_key_wins(tmp_path):
    # rows go in a statement per 64 (executemany ran one per row); a key sent twice keeps the
    # later row, as a re-measured row must
    with Store(tmp_path / "k.duckdb") as s:
        s.add_environment(_env())
        s.start_run(_run("r1"))
        rows = [_result("r1", provider=f"p{i}", median=float(i)) for i in range(150)]
        s.add_results(rows + [_result("r1", provider="p7", median=70.0)])
        got = {r["provider"]: r["median_ms"] for r in s.query("SELECT provider, median_ms FROM results")}
    assert len(got) == 150 and got["p7"] == 70.0 and got["p149"] == 149.0
