"""The command line as a user meets it: real processes, a real DuckDB file, the CPU interpreter."""
import csv
import dataclasses
import io
import json
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
    (["run", "swiglu", "--all"], "only one of them"),
    (["run", "swiglu", "--rep-ms", "nan"], "--rep-ms 'nan': must be a finite number > 0"),
    (["run", "swiglu", "--rep-ms", "inf"], "--rep-ms 'inf': must be a finite number > 0"),
    (["run", "swiglu", "--rep-ms", "0"], "--rep-ms '0': must be a finite number > 0"),
    (["run", "swiglu", "--warmup-ms", "-1"], "--warmup-ms '-1': must be a finite number >= 0"),
    (["run", "swiglu", "--min-reps", "2.5"], "--min-reps '2.5': must be a whole number >= 1"),
    (["run", "swiglu", "--ci", "abc"], "--ci 'abc': must be a finite number >= 0"),
    (["run", "swiglu", "--commit-time", "yesterday"], "--commit-time 'yesterday' is not an ISO time"),
    (["run", "swiglu", "--commit", "0123abcd"], "--commit '0123abcd' is not a commit of the git checkout"),
    (["run", "swiglu", "--commit", "0123abcd", "--commit-time", "2026-01-02T03:04:05Z"],
     "--commit '0123abcd': git here does not know it, so give its full 40-character SHA"),
    (["run", "swiglu", "--shape", "M=3,K=4"], "--shape: swiglu has no dimensions M,K; valid: M,N"),
    (["run", "swiglu", "--shard", "3/2"], "--shard '3/2': K must be between 1 and N"),
    (["run", "swiglu", "--gpus", "all", "--device", "cpu"], "--gpus needs a CUDA device"),
    (["run", "swiglu", "--workers", "0"], "--workers '0': must be a whole number >= 1"),
    (["run", "swiglu", "--measure-timeout", "0"], "--measure-timeout '0': must be a finite number > 0"),
    (["run", "swiglu", "--where", "M"], "--where 'M': must be DIM=VALUE"),
    (["run", "swiglu", "--where", "stream=1"], "no shape of the selected kernels' quick grid has the dim 'stream'"),
    (["run", "swiglu", "--where", "M=7"], "the selection leaves nothing to run"),
    (["run", "swiglu", "--shape", "M=abc,N=4"], "--shape: M must be an integer (as in every swiglu shape), got 'abc'"),
    (["import", os.path.join(os.path.dirname(__file__), "vendor")], "no run folder in "),
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
    # run from its own checkout (an editable install): keyed to the code that ran, its state known
    assert all(r["kcollect_commit"] == r["git_commit"] and r["git_dirty"] is not None and r["kcollect_version"]
               for r in rows)

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
    return subprocess.Popen(KCOLLECT + ["run", "doubled", "--device", "cpu", "--kernel-module", PLANTED, "--verbose",
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


# A kernel of ours (its provider declared `ours=True`) that is wrong by an amount that
# depends on its inputs, beside a correct baseline: float32, so that the error of a row is the same
# to the last bit when its inputs are (and differs when they are not).
OURS = '''\
import torch

from kcollect.spec import KernelSpec, Provider, Shape


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(dims["M"], dims["N"], generator=g).to(device=device, dtype=dtype)}


SHAPES = tuple(Shape.rows(m, n, "small") for m, n in ((4, 8), (3, 5), (2, 7)))
SPEC = KernelSpec(
    name="mine", description="2x, ours off by a constant", modes=("fwd",),
    providers=(Provider("torch", lambda x: x * 2), Provider("triton", lambda x: x * 2 + 0.25, ours=True)),
    baseline="torch", reference=lambda x: x * 2, make_inputs=make_inputs, grad_inputs=(),
    grids={"quick": SHAPES, "full": SHAPES},
    bytes_moved=lambda dims, dtype, mode: 2 * dims["M"] * dims["N"] * dtype.itemsize,
    flops=lambda dims, mode: float(dims["M"] * dims["N"]), bound="memory",
    tolerance={torch.float32: 1e-5}, dtypes=(torch.float32,), bench_dtypes=(torch.float32,))
'''
TINY = ["--device", "cpu", "--rep-ms", "1", "--warmup-ms", "0", "--min-reps", "2"]


def test_a_failing_row_of_ours_exits_3_and_its_command_measures_it_again_alone(tmp_path):
    module = tmp_path / "mine.py"
    module.write_text(OURS)
    db = tmp_path / "k.duckdb"
    out = kc("run", "mine", "--kernel-module", str(module), *TINY, "--seed", "11", "--db", str(db), "--format", "json")
    assert out.returncode == 3, out.stderr  # README, run --help: a row of ours failed its gate
    rows = json.loads(out.stdout)  # --format json: the command's rows, on stdout
    assert {(r["provider"], r["status"]) for r in rows} == {("torch", "ok"), ("triton", "failed")} and len(rows) == 6
    assert "3 failed or errored (3 of ours)" in out.stderr
    assert not re.search(r"^\[\d+/6\] mine ", out.stderr, re.M)  # quiet: no line per measurement
    alone = [line.split("; alone: ", 1)[1] for line in out.stderr.splitlines() if "ours failed: mine" in line]
    assert len(alone) == 3
    # the last case's command: the same inputs as in the whole run (its seed does not depend on the
    # cases before it), so the same error to the last bit
    last = rows[-1]
    command = next(c for c in alone if f"--shape {last['shape']}" in c)
    assert command == (f"kcollect run mine --shape {last['shape']} --dtype float32 --mode fwd --provider triton "
                       "--seed 11 --device cpu")
    again = kc(*command.split()[1:], "--kernel-module", str(module), "--db", str(db), "--format", "csv", "--verbose",
               "--rep-ms", "1", "--warmup-ms", "0", "--min-reps", "2")
    assert again.returncode == 3, again.stderr
    (row,) = list(csv.DictReader(io.StringIO(again.stdout)))
    assert (row["shape"], row["provider"], row["status"]) == (last["shape"], "triton", "failed")
    assert float(row["rel_err"]) == last["rel_err"]
    assert re.search(r"^\[1/1\] mine ", again.stderr, re.M)  # --verbose: a line per measurement
    with Store(db, read_only=True) as s:
        assert len(s.query("SELECT * FROM runs")) == 2 and len(s.query("SELECT * FROM results")) == 7


def test_a_failing_row_that_is_not_ours_does_not_fail_the_run(tmp_path):
    module = tmp_path / "mine.py"
    module.write_text(OURS.replace('Provider("torch", lambda x: x * 2), Provider("triton", lambda x: x * 2 + 0.25, ours=True)',
                                   'Provider("torch", lambda x: x * 2), Provider("peer", lambda x: x * 2 + 0.25)'))
    out = _invoke(["run", "mine", "--kernel-module", str(module), *TINY, "--db", str(tmp_path / "k.duckdb"),
                   "--shape", "M=4,N=8"])
    assert out.exit_code == 0, (out.stderr, out.exception)
    assert "2 rows" in out.stderr and "1 failed or errored (0 of ours)" in out.stderr


def test_dry_run_prints_the_plan_and_measures_nothing(tmp_path):
    module = tmp_path / "mine.py"
    module.write_text(OURS)
    db = tmp_path / "k.duckdb"
    out = _invoke(["run", "mine", "swiglu", "--kernel-module", str(module), *TINY, "--db", str(db), "--dry-run",
                   "--format", "json"])
    assert out.exit_code == 0, (out.stderr, out.exception)
    plan = {r["kernel"]: r for r in json.loads(out.stdout)}
    assert plan["mine"]["cases"] == 3 and plan["mine"]["rows"] == 6 and plan["mine"]["seconds"] > 0
    # swiglu's quick grid on the CPU: its bench dtype, every mode, its providers (compile among them)
    assert plan["swiglu"]["rows"] == plan["swiglu"]["cases"] * 3 * len(plan["swiglu"]["providers"].split(","))
    table = _invoke(["run", "mine", "--kernel-module", str(module), *TINY, "--db", str(db), "--dry-run"])
    assert re.search(r"3 cases, grid quick; 6 measurements; estimated \d+s", table.stdout), table.stdout
    assert not db.exists()  # no store, no measurement


def test_shape_picks_shapes_by_label_and_refuses_what_the_kernel_cannot_take(tmp_path):
    from kcollect.plan import RunConfig, plan
    from kcollect.registry import load

    spec = load().get("swiglu")
    quick = [s.label for s in spec.grid("quick")]
    config = RunConfig(kernels=("swiglu",), grid="quick", device="cpu", shapes=(quick[1],))
    assert [c.shape.label for c in plan([spec], config)] == [quick[1]]
    out = _invoke(["run", "swiglu", "--shape", "M=3", "--db", str(tmp_path / "k.duckdb")])
    assert out.exit_code == 2 and out.stderr.count("\n") == 1
    assert "--shape: swiglu has no dimensions M; valid: M,N" in out.stderr


def test_progress_without_a_terminal_is_a_line_every_30_s_unless_verbose(monkeypatch):
    # a full grid is over a thousand measurements: a log gets a line every SPARSE_S seconds and one
    # at the end; --verbose, one per measurement
    import types

    from kcollect import progress
    from kcollect.plan import RunConfig, plan
    from kcollect.registry import load

    clock = [0.0]
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    spec = load([PLANTED], plugins=False).get("doubled")
    cases = plan([spec], RunConfig(kernels=("doubled",), grid="quick", device="cpu"))
    units = [(c, m, p) for c in cases for m in c.modes for p in c.providers]
    logs = {}
    for verbose in (False, True):
        out = io.StringIO()
        p = progress.Progress(cases, "cpu", out=out, tty=False, verbose=verbose)
        for c, m, n in units:
            p.event("start", c, m, n)
            clock[0] += 10.0
            p.event("end", c, m, n)
        logs[verbose] = out.getvalue().splitlines()
    assert len(units) == 12
    # ends at 10, 20, ..., 120 s: lines at 30, 60, 90, 120 s (the last)
    assert [ln.split(" |")[0] for ln in logs[False]] == ["[3/12] 25%", "[6/12] 50%", "[9/12] 75%", "[12/12] 100%"]
    assert len(logs[True]) == 12 and logs[True][0].startswith("[1/12] doubled ")
