"""The output formats of `list` and `summary` (one column order everywhere), `--version`, the wall
time breakdown of `summary`, `preview`, and one-line errors with exit 2 for bad input."""
import csv
import io
import json
import re
import socket
import subprocess
import sys
import urllib.request
from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner

from kcollect.cli import main
from kcollect.formats import IDENTITY
from kcollect.report import COLUMNS
from kcollect.store import Environment, Run, Store

T0 = datetime(2026, 3, 1, 12, 0)
CPU = Environment(env_id="env-cpu", device_kind="cpu", gpu_name=None, sm_count=None, gpu_mem_bytes=None,
                  driver=None, cuda=None, torch="2.13.0+cpu", triton="3.7.1", python="3.11.7", interpreted=True)
GPU = Environment(env_id="env-h100", device_kind="cuda", gpu_name="NVIDIA H100 80GB HBM3", sm_count=132,
                  gpu_mem_bytes=80 * 2**30, driver="580", cuda="13.0", torch="2.11.0", triton="3.6.0",
                  python="3.12.3", interpreted=False)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def row(provider, median, status="ok", **extra):
    base = dict(kernel="swiglu", mode="fwd", provider=provider, shape="M=4096,N=14336",
                dims='{"M": 4096, "N": 14336}', dtype="bfloat16", baseline="torch", bound="memory", status=status,
                rel_err=2.5e-3, tolerance=8e-3, timing="cuda-graph", median_ms=median, p20_ms=median and median * 0.99,
                p80_ms=median and median * 1.01, bytes=3 * 4096 * 14336 * 2, flops=6.0 * 4096 * 14336, reps=100)
    return {**base, **extra}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two runs: an old CPU run, and the latest on an H100 host with a wall-time breakdown."""
    db = tmp_path_factory.mktemp("fmt") / "k.duckdb"
    with Store(db) as s:
        for env in (CPU, GPU):
            s.add_environment(env)
        s.start_run(Run(run_id="cpu-run-0001", env_id="env-cpu", started_at=T0, finished_at=T0 + timedelta(seconds=9),
                        status="finished", git_commit="a" * 40, commit_time=T0, git_dirty=False, grid="quick",
                        copy_gbps=20.0, matmul_tflops=0.5, config="{}"))
        s.add_results([row("torch", 3.0, run_id="cpu-run-0001", timing="cpu-clock", seq=1)])
        s.start_run(Run(run_id="gpu-run-0002", env_id="env-h100", started_at=T0 + timedelta(hours=1),
                        finished_at=T0 + timedelta(hours=1, seconds=100), status="finished", git_commit="b" * 40,
                        commit_time=T0, git_dirty=False, grid="full", copy_gbps=3000.0, matmul_tflops=700.0,
                        config="{}", machine="lab-h100-1",
                        phases=json.dumps({"ceilings": 4.0, "compile": 30.0, "timed": 50.0})))
        s.add_results([row("triton", 0.12, run_id="gpu-run-0002", seq=1), row("torch", 0.36, run_id="gpu-run-0002", seq=2),
                       row("compile", 0.2, status="failed", rel_err=0.5, run_id="gpu-run-0002", seq=3,
                           error="relative error 0.5 over the tolerance 0.008")])
        # an earlier run whose rows kept their seconds (schema 6): two kernels, one of them costlier
        s.start_run(Run(run_id="cost-run-0003", env_id="env-h100", started_at=T0, finished_at=T0 + timedelta(seconds=60),
                        status="finished", git_commit="c" * 40, commit_time=T0, git_dirty=False, grid="full",
                        copy_gbps=3000.0, matmul_tflops=700.0, config="{}"))
        s.add_results([row("triton", 0.12, run_id="cost-run-0003", seq=1, seconds=0.5),
                       row("compile", 0.2, run_id="cost-run-0003", seq=2, seconds=9.5),
                       row("triton", 0.3, run_id="cost-run-0003", seq=3, seconds=20.0, kernel="rtu", reps=1000),
                       row("eager", None, status="failed", run_id="cost-run-0003", seq=4, seconds=10.0, kernel="rtu")])
    return db


def test_summary_csv_and_json_keep_the_column_order_and_raw_numbers(store):
    out = invoke("summary", "--db", store, "--format", "csv")
    assert out.exit_code == 0, out.output
    table = list(csv.reader(io.StringIO(out.stdout)))
    assert tuple(table[0]) == COLUMNS and COLUMNS[:len(IDENTITY)] == IDENTITY
    rows = [dict(zip(table[0], r)) for r in table[1:]]
    assert [r["provider"] for r in rows] == ["triton", "torch", "compile"]
    assert {r["gpu"] for r in rows} == {"NVIDIA H100 80GB HBM3"} and {r["machine"] for r in rows} == {"lab-h100-1"}
    assert float(rows[0]["median_ms"]) == 0.12 and float(rows[0]["vs_base"]) == pytest.approx(3.0)
    assert rows[2]["status"] == "failed" and rows[2]["median_ms"] == "" and "tolerance" in rows[2]["note"]

    js = json.loads(invoke("summary", "--db", store, "--format", "json").stdout)
    assert list(js[0]) == list(COLUMNS) and js[0]["rate"] == pytest.approx(3 * 4096 * 14336 * 2 / 0.12e6)
    assert js[2]["median_ms"] is None and js[2]["vs_base"] is None  # a failed row is never a speedup


def test_summary_table_and_markdown_show_the_wall_time_breakdown(store):
    table = invoke("summary", "--db", store)
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:7] == ["kernel", "mode", "provider", "shape", "dtype", "gpu", "machine"]
    assert "3.00x" in table.stdout and "FAILED" not in table.stdout and " failed " in table.stdout
    breakdown = table.stdout[table.stdout.index("wall time 100.0 s:"):]
    assert re.search(r"timed\s+50\.0\s+50%", breakdown) and re.search(r"other\s+16\.0\s+16%", breakdown)
    assert breakdown.index("timed") < breakdown.index("compile") < breakdown.index("other") < breakdown.index("ceilings")
    assert "run gpu-run-" in table.stderr

    md = invoke("summary", "--db", store, "--markdown")
    assert md.stdout.startswith("| kernel | mode | provider | shape | dtype | gpu | machine | median ms |")
    assert md.stdout == invoke("summary", "--db", store, "--format", "markdown").stdout
    assert "| timed | 50.0 | 50% |" in md.stdout

    # the machine formats carry no breakdown: one list of records
    assert "wall time" not in invoke("summary", "--db", store, "--format", "csv").stdout


def test_summary_splits_the_rows_seconds_by_kernel(store):
    out = invoke("summary", "--db", store, "--run", "cost-run")
    assert out.exit_code == 0, out.output
    part = out.stdout[out.stdout.index("the rows' own 40.0 s by kernel"):]
    rtu, swiglu = (next(line for line in part.splitlines() if line.startswith(k)) for k in ("rtu", "swiglu"))
    assert part.index("rtu") < part.index("swiglu")  # the costlier first
    assert rtu.split()[:5] == ["rtu", "2", "30.0", "75%", "0.3"] and rtu.endswith("triton (20.0 s)")
    assert swiglu.split()[:5] == ["swiglu", "2", "10.0", "25%", "0.0"] and swiglu.endswith("compile (9.5 s)")
    assert "by kernel" not in invoke("summary", "--db", store, "--run", "cost-run", "--format", "json").stdout
    assert "by kernel" not in invoke("summary", "--db", store).stdout  # its rows kept no seconds


def test_summary_of_a_run_without_phases_or_machine(store):
    out = invoke("summary", "--db", store, "--run", "cpu-run")
    assert out.exit_code == 0 and "wall time" not in out.stdout
    assert out.stdout.split("\n")[0].split()[:6] == ["kernel", "mode", "provider", "shape", "dtype", "gpu"]
    assert "machine" not in out.stdout.split("\n")[0]  # empty for every row: left out of the text table
    js = json.loads(invoke("summary", "--db", store, "--run", "cpu-run", "--format", "json").stdout)
    assert js[0]["gpu"] == "cpu" and js[0]["machine"] is None  # ... but always there for scripts


def test_list_formats():
    js = invoke("list", "--device", "cpu", "--format", "json")
    assert js.exit_code == 0, js.output
    recs = json.loads(js.stdout)
    swiglu = {r["provider"]: r for r in recs if r["kernel"] == "swiglu"}
    assert swiglu["torch"]["baseline"] is True and swiglu["triton"]["baseline"] is False
    assert swiglu["triton"]["available"] is True and swiglu["triton"]["quick"] >= 1
    assert swiglu["liger"]["available"] is False and "liger" in swiglu["liger"]["why"]
    assert swiglu["triton"]["origin"] == "builtin" and swiglu["triton"]["modes"] == "fwd,bwd,fwd+bwd"

    header = invoke("list", "--device", "cpu", "--format", "csv").stdout.splitlines()[0].split(",")
    assert header[:2] == ["kernel", "provider"] and header[-2:] == ["origin", "description"]
    md = invoke("list", "--device", "cpu", "--format", "markdown").stdout.splitlines()
    assert md[0].startswith("| kernel | provider | baseline |") and md[1].startswith("| --- |")
    table = invoke("list", "--device", "cpu").stdout.splitlines()
    first = next(ln for ln in table if ln.startswith("swiglu "))
    assert "fwd,bwd,fwd+bwd" in first and "silu(a) * b" in first  # what belongs to the kernel, once


def test_version():
    from importlib.metadata import version

    for flag in ("--version", "-V"):
        out = invoke(flag)
        assert out.exit_code == 0 and out.stdout.strip() == f"kcollect {version('kcollect')}"


@pytest.mark.parametrize("args, words", [
    (["import", "{tmp}/nowhere"], "nothing to import at {tmp}/nowhere: no such file or folder"),
    (["import", "{tmp}", "{tmp}/gone"], "nothing to import at {tmp}/gone"),
    (["summary", "--db", "{db}", "--run", "nope"], "no run matching 'nope' in"),
    (["summary", "--db", "{db}", "--format", "yaml"], "Invalid value for '--format'"),
    (["list", "--format", "xml"], "Invalid value for '--format'"),
    (["export", "--db", "{db}", "--run", "zzz"], "run 'zzz' matches 0 runs"),
    (["rm", "zzz", "--db", "{db}", "--yes"], "no run 'zzz' in"),
    (["rm", "gpu-run-0002", "zzz", "--db", "{db}", "--yes"], "no run 'zzz' in"),
    (["runs", "--db", "{db}", "--format", "xml"], "Invalid value for '--format'"),
    (["preview", "--dir", "{tmp}/nosite"], "no site in {tmp}/nosite/"),
    (["list", "--device", "cuda"], "no CUDA device is visible here"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path, store):
    if "cuda" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is visible")
    fill = {"tmp": tmp_path, "db": store}
    out = invoke(*(a.format(**fill) for a in args))
    assert out.exit_code == 2, out.output
    assert words.format(**fill) in out.stderr
    assert len([ln for ln in out.stderr.splitlines() if "error" in ln.lower()]) == 1
    assert not (tmp_path / "k.duckdb").exists() and not list(tmp_path.glob("*.duckdb"))


def test_import_of_a_missing_path_creates_no_store(tmp_path):
    db = tmp_path / "new.duckdb"
    out = invoke("import", tmp_path / "missing", "--db", db)
    assert out.exit_code == 2 and out.stderr.count("\n") == 1 and not db.exists()


def test_preview_serves_the_site_on_localhost(tmp_path):
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "index.html").write_text("<h1>overview</h1>")
    (site / "kernels" / "swiglu.html").write_text("<h1>swiglu</h1>")
    proc = subprocess.Popen([sys.executable, "-m", "kcollect.cli", "preview", "--dir", str(site), "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        assert urllib.request.urlopen(url, timeout=30).read() == b"<h1>overview</h1>"
        assert urllib.request.urlopen(url + "kernels/swiglu.html", timeout=30).read() == b"<h1>swiglu</h1>"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_preview_on_a_port_in_use_exits_2(tmp_path):
    (tmp_path / "index.html").write_text("x")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        out = invoke("preview", "--dir", tmp_path, "--port", busy.getsockname()[1])
    assert out.exit_code == 2 and "the port is in use" in out.stderr


def test_the_breakdown_of_a_run_that_recorded_its_wall_time_adds_up_to_it():
    from kcollect.report import phase_lines

    phases = {"precompile": 60.0, "first_call": 20.0, "timing": 12.0, "timed_work": 8.0, "other": 8.0, "wall": 100.0}
    text = "\n".join(phase_lines({"phases": json.dumps(phases)}, "table"))
    assert "wall time 100.0 s:" in text and not re.search(r"^wall\s+\d", text, re.M)
    assert re.search(r"precompile\s+60\.0\s+60%", text) and re.search(r"other\s+8\.0\s+8%", text)
    assert re.search(r"timed_work\s+8\.0\s+8%", text)  # a part of timing, shown, not added


def test_runs_lists_every_run_newest_first(store):
    table = invoke("runs", "--db", store)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["run", "started", "commit", "dirty", "gpu", "machine", "grid", "status", "rows",
                                "invocation"]
    assert [ln.split()[0] for ln in lines[2:]] == ["gpu-run-", "cost-run", "cpu-run-"]
    gpu = lines[2].split()
    assert gpu[3] == "b" * 12 and gpu[4] == "no" and "lab-h100-1" in lines[2] and gpu[-2] == "3"
    js = json.loads(invoke("runs", "--db", store, "--format", "json").stdout)
    assert [r["run"] for r in js] == ["gpu-run-0002", "cost-run-0003", "cpu-run-0001"]
    assert js[0]["commit"] == "b" * 40 and js[0]["gpu"] == "NVIDIA H100 80GB HBM3" and js[2]["gpu"] == "cpu"
    assert [r["rows"] for r in js] == [3, 4, 1] and js[0]["status"] == "finished"
    md = invoke("runs", "--db", store, "--format", "markdown").stdout
    assert md.startswith("| run | started | commit |")


def test_rm_asks_for_yes_then_deletes_the_run_and_its_rows(store, tmp_path):
    import shutil

    db = tmp_path / "k.duckdb"
    shutil.copy(store, db)
    (tmp_path / "runs" / "20260301T130000-nvidia-h100-80gb-hbm3-gpu-run-").mkdir(parents=True)
    asked = invoke("rm", "gpu-run", "--db", db)
    assert asked.exit_code == 2 and "add --yes to delete them" in asked.stderr and "3 rows" in asked.stdout
    assert db.read_bytes() == store.read_bytes()  # nothing deleted
    ambiguous = invoke("rm", "c", "--db", db, "--yes")
    assert ambiguous.exit_code == 2 and "matches 2 runs" in ambiguous.stderr
    done = invoke("rm", "gpu-run", "--db", db, "--yes", "--runs-dir", tmp_path / "runs")
    assert done.exit_code == 0, done.output
    assert "deleted 1 run(s) and 3 rows" in done.stderr and "would bring it back" in done.stderr
    with Store(db, read_only=True) as s:
        assert s.run_ids() == {"cpu-run-0001", "cost-run-0003"}
        assert s.query("SELECT count(*) AS n FROM results WHERE run_id = 'gpu-run-0002'") == [{"n": 0}]
        assert {r["env_id"] for r in s.query("SELECT env_id FROM environments")} == {"env-cpu", "env-h100"}
    assert invoke("rm", "cpu-run", "--db", db, "--yes").exit_code == 0
    with Store(db, read_only=True) as s:  # the environment no run uses any more goes with it
        assert {r["env_id"] for r in s.query("SELECT env_id FROM environments")} == {"env-h100"}


def test_summary_shows_every_run_of_the_latest_kcollect_run(tmp_path):
    # the runs of one `kcollect run` (one per worker) share its invocation id: summary shows them
    # together by default, one of them with --run RUN, all with --run INVOCATION
    db = tmp_path / "k.duckdb"
    with Store(db) as s:
        s.add_environment(GPU)
        for i, rid in enumerate(("inv-a-gpu0", "inv-a-gpu1", "older-run")):
            s.start_run(Run(run_id=rid, env_id="env-h100", started_at=T0 + timedelta(minutes=10 - 5 * (i // 2)),
                            finished_at=None, status="finished", git_commit="b" * 40, commit_time=T0, git_dirty=False,
                            grid="full", copy_gbps=3000.0, matmul_tflops=700.0, config="{}", device_index=i,
                            invocation=None if rid == "older-run" else "invocation-1"))
            s.add_results([row("triton", 0.1 + i, run_id=rid, seq=1, shape=f"M={i},N=8")])
    both = json.loads(invoke("summary", "--db", db, "--format", "json").stdout)
    assert sorted(r["shape"] for r in both) == ["M=0,N=8", "M=1,N=8"]
    assert [r["shape"] for r in json.loads(invoke("summary", "--db", db, "--run", "inv-a-gpu1", "--format",
                                                  "json").stdout)] == ["M=1,N=8"]
    assert len(json.loads(invoke("summary", "--db", db, "--run", "invocation", "--format", "json").stdout)) == 2
    out = invoke("summary", "--db", db)
    assert "runs inv-a-gp, inv-a-gp of one `kcollect run`" in out.stderr
