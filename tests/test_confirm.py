"""`kcollect compare --confirm`: the decision on interleaved samples, the worktree's imports, and one
real confirmation on the CPU: two commits of a planted repository whose kernel got slower."""
import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from compare_store import commit_files, git, make_db, ok
from kcollect import confirm, confirm_worker
from kcollect.compare import compare_cmd
from kcollect.verdicts import Line, Side
from kcollect.regress import Point
from kcollect.store import Store

OP = '''"""A planted kernel: ours sleeps DELAY seconds before doubling its input."""
import time

import torch

from kcollect.spec import KernelSpec, Provider, Shape

DELAY = {delay}


def ours(x):
    time.sleep(DELAY)
    return x * 2


SPEC = KernelSpec(
    name="planted", description="x*2 after a planted sleep", modes=("fwd",),
    providers=(Provider("triton", ours, ours=True), Provider("torch", lambda x: x * 2)), baseline="torch",
    reference=lambda x: x * 2,
    make_inputs=lambda dims, dtype, device, seed: {{"x": torch.randn(dims["N"], dtype=dtype, device=device)}},
    grad_inputs=("x",), grids={{"quick": (Shape({{"N": 64}}, "tiny"), Shape({{"N": 32}}, "tinier")),
                               "full": (Shape({{"N": 96}}, "the one to confirm"),)}},
    bytes_moved=lambda dims, dtype, mode: 8 * dims["N"], flops=lambda dims, mode: float(dims["N"]),
    bound="memory", tolerance={{torch.float32: 1e-6}}, dtypes=(torch.float32,), bench_dtypes=(torch.float32,))
'''


def line(verdict="regression", code="changed", change=0.2, gpu="NVIDIA H100", ours=True):
    p = Point(commit="c", commit_time=None, median_ms=1.0, p20_ms=1.0, p80_ms=1.0, runs=1)
    side = Side(p, "ok", "cuda-graph", gpu, None)
    return Line(key=("k", "fwd", "triton", "N=64", "float32"), a=side, b=side, code=code, verdict=verdict,
                change=change, corrected=change, ours=ours)


def test_candidates_are_ours_and_doubtful_or_regressed():
    lines = [line(), line("within noise", change=0.05), line("within noise", change=0.01),
             line("regression", code="unchanged"), line("environment changed", change=0.1), line("same", change=0.0),
             line("changed with the environment", change=0.2), line("partial run", change=0.2),
             line("method changed", code="method", change=0.2), line(ours=False)]
    assert confirm.candidates(lines, 0.03) == [lines[0], lines[1], lines[4], lines[6], lines[7]]


def test_decision_on_interleaved_samples():
    slow = confirm.decide(line(), [1.0, 1.01, 0.99, 1.0, 1.02], [1.2, 1.21, 1.19, 1.22, 1.2], 0.03)
    assert slow.verdict == "regression" and "confirmed here" in slow.note and "p=0.004" in slow.note
    same = confirm.decide(line(), [1.0, 1.01, 0.99, 1.0, 1.02], [1.0, 1.02, 0.98, 1.01, 1.0], 0.03)
    assert same.verdict == "not confirmed" and "not confirmed here" in same.note
    small = confirm.decide(line(), [1.0, 1.0, 1.0], [1.01, 1.01, 1.01], 0.03)  # separated, under the threshold
    assert small.verdict == "not confirmed"
    few = confirm.decide(line(), [1.0, 1.0], [1.5, 1.5], 0.03)
    assert few.verdict == "regression" and "too few samples" in few.note


def test_the_worker_imports_the_worktree_s_kcollect(tmp_path):
    # this venv has the caller's kcollect installed (editable): the worktree's must win, submodules too
    for name, text in (("collector/__init__.py", "WHERE = 'the tree'\n"), ("collector/store.py", "WHERE = 'its store'\n"),
                       ("kernels/__init__.py", "WHERE = 'its kernels'\n")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    code = (f"import sys; sys.path.insert(0, {str(Path(confirm.WORKER).parent)!r}); import confirm_worker as w; "
            f"sys.meta_path.insert(0, w.Tree(w.Path({str(tmp_path)!r}))); import kcollect, kcollect.kernels, "
            "kcollect.store; print(kcollect.WHERE, '|', kcollect.kernels.WHERE, '|', kcollect.store.WHERE)\n"
            "try:\n    import kcollect.regress\nexcept ModuleNotFoundError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["the tree | its kernels | its store",
                                       f"no module named 'kcollect.regress' in the worktree {tmp_path}"], out.stderr


def confirmed(tmp_path, monkeypatch, delay_a, delay_b):
    """`compare A B --confirm` (3 rounds, JSON) on a planted repository of two commits whose kernel
    sleeps delay_a, then delay_b, where the history says it got 30% slower."""
    repo = tmp_path / "repo"
    a = commit_files(repo, {"op.py": OP.format(delay=delay_a)}, "planted kernel")
    b = commit_files(repo, {"op.py": OP.format(delay=delay_b)}, "planted kernel changed")
    path = make_db(tmp_path / "k.duckdb", [
        ("cpu", c, h, [ok("triton", ms, kernel="planted", shape="N=64", dtype="float32")])
        for c, h, ms in ((a, 0, 0.4), (b, 1, 0.52))])
    monkeypatch.chdir(repo)
    return CliRunner().invoke(compare_cmd, [a, b, "--db", path, "--confirm", "--rounds", "3",
                                            "--kernel-module", "op.py", "--format", "json"])


def test_confirm_remeasures_both_commits_here(tmp_path, monkeypatch):
    r = confirmed(tmp_path, monkeypatch, 0.0002, 0.015)  # 75x slower: confirmed by measurement
    assert r.exit_code == 0, r.output  # CPU rows never gate
    (result,) = json.loads(r.stdout)
    assert result["verdict"] == "regression" and result["note"].startswith("confirmed here: "), result
    assert "over 3 interleaved rounds, p=0.050" in result["note"]
    assert "confirm round 3/3: B done" in r.stderr
    assert git(tmp_path / "repo", "worktree", "list").count("\n") == 0  # the worktrees are gone


def test_the_worker_measures_only_the_cases_it_is_given(tmp_path):
    # the run's measuring processes plan for themselves (a GPU's are spawned, here --measure-timeout's):
    # only options they are given restrict them; a filter patched into the worker alone measured the
    # kernel's default grid
    repo = tmp_path / "repo"
    head = commit_files(repo, {"op.py": OP.format(delay=0.0)}, "planted kernel")
    db = tmp_path / "w.duckdb"
    out = subprocess.run(
        [sys.executable, str(confirm.WORKER), "--root", str(repo), "--cases", json.dumps([["planted", "N=96", "float32"]]),
         "--", "run", "--device", "cpu", "--measure-timeout", "120", "--commit", head, "--kernel-module", "op.py",
         "--db", str(db)],
        input="go\n", capture_output=True, text=True, timeout=120, cwd=repo)
    assert out.stdout == "done 0\n", out.stderr
    with Store(db) as store:
        assert {r["shape"] for r in store.query("SELECT shape FROM results")} == {"N=96"}


def test_commits_before_run_shape_are_restricted_by_where():
    import click

    old = click.Command("run", params=[click.Option(["--where"], multiple=True), click.Option(["--full"], is_flag=True)])
    assert confirm_worker.filter_args(old, ["B=8,T=1024,resets=0", "B=4,T=1024,resets=0.1"]) == [
        "--where", "B=8", "--where", "B=4", "--where", "T=1024", "--where", "resets=0", "--where", "resets=0.1"]
    new = click.Command("run", params=[click.Option(["--shape", "shapes"], multiple=True), *old.params])
    assert confirm_worker.filter_args(new, ["B=8,T=1024,resets=0"]) == ["--shape", "B=8,T=1024,resets=0"]
    assert confirm_worker.filter_args(click.Command("run", params=[]), ["B=8"]) == []


def test_a_side_whose_run_fails_says_why(tmp_path, monkeypatch):
    r = confirmed(tmp_path, monkeypatch, "1 / 0  # a kernel module that cannot load", 0.0)
    (result,) = json.loads(r.stdout)
    assert "too few samples (0 A, 3 B)" in result["note"], result
    assert "A's run failed in 3 of 3 rounds: " in result["note"] and "ZeroDivisionError" in result["note"], result


def test_a_failed_run_s_reason_is_its_last_error_line():
    log = ("measuring the device's ceilings...\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
           "RuntimeError: CUDA error: an illegal memory access\n0 rows in /tmp/A.duckdb (run none started, unfinished)\n")
    assert confirm.last_error(log) == "RuntimeError: CUDA error: an illegal memory access"
    assert confirm.last_error("kcollect: error: no such option: --shape\n") == "kcollect: error: no such option: --shape"
    assert confirm.last_error("a\nlast words\n") == "last words" and confirm.last_error("") == "no output"


def test_the_processes_a_run_starts_measure_the_worktree_s_code(tmp_path):
    # a GPU run (here the CPU's with --measure-timeout) measures in spawned processes, which import
    # kcollect afresh: they must get the worktree's kernels, not the caller's installed ones
    import shutil

    repo = Path(__file__).resolve().parents[1]
    tree = tmp_path / "tree"
    for part in ("collector", "kernels", "templates"):
        shutil.copytree(repo / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    spec = tree / "kernels" / "gelu" / "spec.py"
    text = spec.read_text()
    assert "standard_providers(gelu, " in text
    assert "\nSPEC = " in text
    spec.write_text(text.replace("standard_providers(gelu, ", "standard_providers(_planted, ").replace(
        "\nSPEC = ", "\ndef _planted(*args, **kwargs):\n    raise RuntimeError('planted in the worktree')\n\n\nSPEC = "))
    db = tmp_path / "w.duckdb"
    out = subprocess.run(
        [sys.executable, str(confirm.WORKER), "--root", str(tree), "--cases", json.dumps([["gelu", "M=1,N=4099,approx=tanh",
                                                                                          "float32"]]),
         "--", "run", "--mode", "fwd", "--provider", "triton", "--dtype", "float32", "--device", "cpu",
         "--measure-timeout", "300", "--commit", "f" * 40, "--commit-time", "2026-11-30T00:00:00", "--db", str(db)],
        input="go\n", capture_output=True, text=True, timeout=300, cwd=tree,
        # as a user's shell starts it: no PYTHONPATH of a harness's own (lab/mutations.py's finder)
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.stdout.startswith("done "), out.stderr[-2000:]  # (3: ours failed, as planted)
    with Store(db) as store:
        rows = store.query("SELECT shape, status, error FROM results")
    assert [(r["shape"], r["status"]) for r in rows] == [("M=1,N=4099,approx=tanh", "error")], rows
    assert "planted in the worktree" in rows[0]["error"]
