"""`kcollect import` refuses a run folder whose run does not match its name, or whose `ok` rows carry
no time (issue 39): each is named with why, nothing of it reaches the store, the command exits 1."""
import shutil

import duckdb
from click.testing import CliRunner

from compare_store import make_db, ok
from kcollect import history
from kcollect.cli import main
from kcollect.store import Store


def exported(tmp_path, n=3):
    src = make_db(tmp_path / "src.duckdb", [("h100", f"{i}" * 40, i, [ok("triton", 1.0 + i), ok("torch", 2.0)])
                                            for i in range(n)])
    with Store(src, read_only=True) as s:
        return history.export_runs(s, tmp_path / "runs")


def rewrite(folder, sql):
    """Rewrites a folder's results.parquet through DuckDB (as a hand edit would)."""
    path = folder / "results.parquet"
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT * FROM read_parquet('{path}')")
    con.execute(sql)
    con.execute(f"COPY t TO '{path}' (FORMAT parquet)")
    con.close()


def test_a_folder_of_another_run_or_with_negative_times_is_refused(tmp_path):
    good, negative, renamed = exported(tmp_path)
    rewrite(negative, "UPDATE t SET median_ms = -0.5 WHERE provider = 'triton'")
    other = renamed.with_name(renamed.name[:-8] + "deadbeef")
    shutil.move(renamed, other)
    found = []
    with Store(tmp_path / "k.duckdb") as d:
        assert history.import_path(d, tmp_path / "runs", found) == (1, 0)
        assert d.query("SELECT count(*) AS n FROM results")[0]["n"] == 2  # the good folder's rows only
    why = {folder.name: reason for folder, reason in found}
    assert "1 'ok' row(s) in results.parquet with a negative, missing or infinite time" in why[negative.name]
    assert why[other.name].startswith("its run is run-0002-h100, which does not match the folder's name "
                                      "(expected it to end in -run-0002)")
    r = CliRunner().invoke(main, ["import", str(tmp_path / "runs"), "--db", str(tmp_path / "k2.duckdb")])
    assert r.exit_code == 1, r.output
    assert f"kcollect: error: skipped {negative}: 1 'ok' row(s)" in r.stderr
    assert f"kcollect: error: skipped {other}: its run is run-0002-h100" in r.stderr


def test_rows_of_another_run_in_a_folder_are_refused(tmp_path):
    good, mixed, _ = exported(tmp_path)
    rewrite(mixed, "UPDATE t SET run_id = 'run-0000-h100' WHERE provider = 'torch'")
    found = []
    with Store(tmp_path / "k.duckdb") as d:
        history.import_path(d, tmp_path / "runs", found)
    assert [(f.name, r) for f, r in found] == [
        (mixed.name, "results.parquet holds 1 row(s) of another run than run-0001-h100")]


def test_the_committed_history_passes_every_check():
    from pathlib import Path

    runs = Path(__file__).resolve().parent.parent / "data" / "runs"
    assert history.problem_folders(runs) == []
