"""The command line as a user meets it: real processes, a real DuckDB file, the CPU interpreter."""
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from kcollect.cli import main
from kcollect.store import Store

KCOLLECT = [sys.executable, "-m", "kcollect.cli"]


def kc(*args, timeout=600, env=None):
    return subprocess.run(KCOLLECT + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def _invoke(args):
    environ = dict(os.environ)
    try:
        return CliRunner().invoke(main, args)
    finally:  # what the command may have set stays out of the other tests
        os.environ.clear()
        os.environ.update(environ)


@pytest.mark.parametrize("args, words", [
    (["run", "nope"], "unknown kernel 'nope'; valid: "),
    (["run", "swiglu", "--mode", "sideways"], "unknown mode 'sideways'; valid: fwd, bwd, fwd+bwd"),
    (["run", "swiglu", "--dtype", "int3"], "unknown dtype 'int3'; valid: bfloat16, float16, float32"),
    (["run", "swiglu", "--provider", "magic"], "unknown provider 'magic'; valid: triton, torch, compile"),
    (["run"], "name at least one kernel, or pass --all"),
    (["run", "swiglu", "--all"], "not both"),
    (["run", "swiglu", "--rep-ms", "nan"], "--rep-ms 'nan': must be a finite number > 0"),
    (["run", "swiglu", "--rep-ms", "inf"], "--rep-ms 'inf': must be a finite number > 0"),
    (["run", "swiglu", "--rep-ms", "0"], "--rep-ms '0': must be a finite number > 0"),
    (["run", "swiglu", "--warmup-ms", "-1"], "--warmup-ms '-1': must be a finite number >= 0"),
    (["run", "swiglu", "--min-reps", "2.5"], "--min-reps '2.5': must be a whole number >= 1"),
    (["run", "swiglu", "--ci", "abc"], "--ci 'abc': must be a finite number >= 0"),
    (["run", "swiglu", "--commit-time", "yesterday"], "--commit-time 'yesterday' is not an ISO time"),
    (["run", "swiglu", "--commit", "0123abcd"], "--commit '0123abcd' is not a commit of the git checkout"),
    (["run", "swiglu", "--shard", "3/2"], "--shard '3/2': K must be between 1 and N"),
    (["run", "swiglu", "--gpus", "all", "--device", "cpu"], "--gpus needs a CUDA device"),
    (["run", "swiglu", "--workers", "0"], "--workers '0': must be a whole number >= 1"),
    (["run", "swiglu", "--measure-timeout", "0"], "--measure-timeout '0': must be a finite number > 0"),
    (["run", "swiglu", "--where", "M"], "--where 'M': must be DIM=VALUE"),
    (["run", "swiglu", "--where", "stream=1"], "no shape of the selected kernels' quick grid has the dim 'stream'"),
    (["run", "swiglu", "--where", "M=7"], "the selection leaves nothing to run"),
])
def test_bad_input_exits_2_with_one_line(args, words, tmp_path):
    # in-process (a fresh interpreter per case costs seconds); test_bad_input_in_a_real_process
    # checks that the exit code and the one line reach a real process's caller the same way
    result = _invoke([*args, "--db", str(tmp_path / "k.duckdb")])
    assert result.exit_code == 2, (result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert not (tmp_path / "k.duckdb").exists()  # nothing is created for a refused command


@pytest.mark.parametrize("args, words", [
    (["run", "nope"], "unknown kernel 'nope'; valid: "),
    (["run", "swiglu", "--rep-ms", "nan"], "--rep-ms 'nan': must be a finite number > 0"),
])
def test_bad_input_in_a_real_process(args, words, tmp_path):
    out = kc(*args, "--db", str(tmp_path / "k.duckdb"))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], out.stderr
    assert not (tmp_path / "k.duckdb").exists()


def test_list_shows_kernels_and_availability():
    out = CliRunner().invoke(main, ["list", "--device", "cpu"])  # in-process: what it prints is the test
    assert out.exit_code == 0, (out.stderr, out.exception)
    assert "swiglu" in out.stdout and "quick" in out.stdout.splitlines()[0]
    assert re.search(r"liger +.* no +liger_kernel is not installed", out.stdout), out.stdout


def test_help_explains_every_run_option():
    out = CliRunner().invoke(main, ["run", "--help"])
    assert out.exit_code == 0, out.exception
    for opt in ("--all", "--quick", "--mode", "--provider", "--dtype", "--device", "--warmup-ms", "--rep-ms",
                "--min-reps", "--ci", "--cuda-graph", "--seed", "--db", "--commit", "--machine", "--gpus", "--workers",
                "--measure-timeout", "--shard", "--cache-dir", "--fail-on-incorrect", "--where", "--profile"):
        assert opt in out.stdout


# the variables a run records when the user has not set them (test_run_records_the_cuda_allocator_and_ptxas)
UNSET = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "TRITON_PTXAS_PATH")}


@pytest.fixture(scope="module")
def swiglu_run(tmp_path_factory):
    """One real run of swiglu (our Triton kernel, interpreted, and torch) for the tests below:
    (its folder, the process's result)."""
    tmp = tmp_path_factory.mktemp("swiglu-run")
    out = kc("run", "swiglu", "--mode", "fwd", "--provider", "triton", "--provider", "torch", "--db",
             str(tmp / "k.duckdb"), "--rep-ms", "5", "--warmup-ms", "1", "--profile", str(tmp / "prof"), env=UNSET)
    return tmp, out


def test_run_summary_export_import(swiglu_run, tmp_path):
    folder, out = swiglu_run
    db = folder / "k.duckdb"
    assert out.returncode == 0, out.stderr
    assert "swiglu" in out.stdout and "triton" in out.stdout and "1.00x" in out.stdout
    with Store(db, read_only=True) as s:
        rows = s.query("SELECT * FROM results_v")
    # --profile: one profile per measuring process, named by its run, naming the measuring code
    (run_id,) = {r["run_id"] for r in rows}
    assert sorted(p.name for p in (folder / "prof").iterdir()) == [f"{run_id}.prof", f"{run_id}.txt"]
    assert "_measure_case" in (folder / "prof" / f"{run_id}.txt").read_text()
    assert rows and {r["status"] for r in rows} == {"ok"}
    assert {r["device_kind"] for r in rows} == {"cpu"} and all(r["interpreted"] for r in rows)
    assert {r["run_status"] for r in rows} == {"finished"}
    assert all(r["git_commit"] for r in rows)

    summary = kc("summary", "--db", str(db), "--markdown")
    assert summary.returncode == 0 and summary.stdout.startswith("| kernel |")

    runs = tmp_path / "runs"
    assert kc("export", "--db", str(db), "--out", str(runs)).returncode == 0
    other = tmp_path / "other.duckdb"
    first = kc("import", str(runs), "--db", str(other))
    again = kc("import", str(runs), "--db", str(other))
    assert "1 run(s) imported" in first.stdout and "0 run(s) imported, 1 already present" in again.stdout


def test_run_records_the_cuda_allocator_and_ptxas(swiglu_run, tmp_path):
    # expandable segments unless the user set PYTORCH_CUDA_ALLOC_CONF, which is then kept; a
    # TRITON_PTXAS_PATH the user set is kept too, and otherwise the CPU wheel has no
    # torch/bin/ptxas, so Triton's own stays (""). Unset: swiglu_run's; set: the planted kernels,
    # since what is measured does not matter here
    import json

    db = tmp_path / "k.duckdb"
    preset = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256", "TRITON_PTXAS_PATH": "/opt/cuda/bin/ptxas"}
    out = kc("run", "doubled", "--device", "cpu", "--kernel-module", PLANTED, "--mode", "fwd", "--provider", "torch",
             "--dtype", "float32", "--db", str(db), "--rep-ms", "1", "--warmup-ms", "0", "--min-reps", "2",
             env={**UNSET, **preset})
    assert out.returncode == 0, out.stderr
    confs = []
    for path in (swiglu_run[0] / "k.duckdb", db):
        with Store(path, read_only=True) as s:
            confs += [json.loads(r["config"]) for r in s.query("SELECT config FROM runs")]
    assert [(c["alloc_conf"], c["ptxas"]) for c in confs] == [("expandable_segments:True", ""),
                                                             ("max_split_size_mb:256", "/opt/cuda/bin/ptxas")]


def test_pin_ptxas_takes_torchs_bundled_ptxas(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    from kcollect import common

    torch_dir = tmp_path / "torch"
    (torch_dir / "bin").mkdir(parents=True)
    (torch_dir / "__init__.py").write_text("")
    ptxas = torch_dir / "bin" / "ptxas"
    ptxas.write_text("#!/bin/sh\n")
    ptxas.chmod(0o755)
    spec = importlib.machinery.ModuleSpec("torch", None, origin=str(torch_dir / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "torch" else None)
    # setenv first, so that teardown restores the variable as it was (pin_ptxas sets it directly)
    monkeypatch.setenv("TRITON_PTXAS_PATH", "-")
    monkeypatch.delenv("TRITON_PTXAS_PATH")
    assert common.pin_ptxas() == str(ptxas) == os.environ["TRITON_PTXAS_PATH"]
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/elsewhere/ptxas")  # the user's choice wins
    assert common.pin_ptxas() == "/elsewhere/ptxas"


def test_corrupt_db_exits_2_and_is_untouched(tmp_path):
    db = tmp_path / "k.duckdb"
    db.write_bytes(b"garbage" * 1000)
    out = _invoke(["run", "swiglu", "--provider", "torch", "--db", str(db)])  # in-process, as above
    assert out.exit_code == 2, out.exception  # a file this kcollect cannot use, like any bad input
    assert "not a readable DuckDB file" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert db.read_bytes() == b"garbage" * 1000


PLANTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "planted_kernels.py")


def _start_slow_run(db):
    # The planted kernels, each call sleeping, so the run can be hit midway (4 measurements a case).
    return subprocess.Popen(KCOLLECT + ["run", "doubled", "--device", "cpu", "--kernel-module", PLANTED,
                                        "--db", str(db), "--rep-ms", "1", "--warmup-ms", "0", "--min-reps", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "KCOLLECT_TEST_SLEEP": "0.3"})


def _wait_for_second_case(proc):
    deadline = time.time() + 300
    for line in proc.stderr:
        if line.startswith("[5/"):  # the first measurement of the second case: the first is stored
            return
        assert time.time() < deadline
    pytest.fail("the run ended before its second case began")


@pytest.mark.parametrize("sig, status, code", [(signal.SIGKILL, "unfinished", -9), (signal.SIGINT, "interrupted", 130)])
def test_killed_run_keeps_finished_rows(tmp_path, sig, status, code):
    db = tmp_path / "k.duckdb"
    proc = _start_slow_run(db)
    _wait_for_second_case(proc)
    os.kill(proc.pid, sig)
    proc.communicate(timeout=120)
    assert proc.returncode == code
    with Store(db, read_only=True) as s:
        runs = s.query("SELECT status FROM runs")
        rows = s.query("SELECT shape, status FROM results")
    assert runs == [{"status": status}]
    kept = {r["shape"] for r in rows}
    assert "M=4,N=8" in kept and len(kept) < 3, kept  # the first case survived, the run did not finish


def test_where_keeps_only_the_matching_shapes():
    from kcollect.plan import RunConfig, plan
    from kcollect.registry import load

    spec = load().get("backbone")
    config = RunConfig(kernels=("backbone",), grid="full", device="cpu")
    every = plan([spec], config)

    def picked(*where):
        return [c.shape.dims for c in plan([spec], dataclasses.replace(config, where=where))]

    streamed = picked(("stream", "1"))
    assert streamed and all(d["stream"] == 1 for d in streamed)
    assert len(streamed) < len(every)
    both = picked(("stream", "1"), ("net", "lstm"), ("net", "mamba"))  # one dim's values are alternatives
    assert both and {d["net"] for d in both} == {"lstm", "mamba"} and all(d["stream"] == 1 for d in both)
    assert len(both) == len([d for d in streamed if d["net"] in ("lstm", "mamba")])


def test_caches_go_under_one_folder_unless_the_user_set_them(tmp_path, monkeypatch):
    # every compiler whose artefacts a warm run reuses (Triton, inductor, the CuTe DSL peers) gets
    # its folder under --cache-dir; one the user pointed elsewhere keeps the user's
    from kcollect import caches

    for var in (*caches.VARIABLES, *caches.SWITCHES):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("QUACK_CACHE_DIR", str(tmp_path / "mine"))
    described = caches.use(tmp_path / "root")
    for var, sub in caches.VARIABLES.items():
        want = tmp_path / ("mine" if var == "QUACK_CACHE_DIR" else f"root/{sub}")
        assert os.environ[var] == str(want) and f"{var}={want}" in described
        assert var == "QUACK_CACHE_DIR" or want.is_dir()
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1" and os.environ["TRITON_CACHE_AUTOTUNING"] == "1"
