"""`kcollect compare`: two commits or two GPUs from a real DuckDB file built through Store."""
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner

from kcollect.compare import compare_cmd
from kcollect.store import Environment, Run, Store

C1, C2, C3 = "a1" * 20, "b2" * 20, "c3" * 20
T0 = datetime(2026, 11, 1)
GPUS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200", "cpu": None}


def env(key):
    return Environment(env_id=key, device_kind="cpu" if key == "cpu" else "cuda", gpu_name=GPUS[key], sm_count=None,
                       gpu_mem_bytes=None, driver=None, cuda=None, torch="2.13", triton="3.6", python="3.11",
                       interpreted=key == "cpu")


def result(run_id, provider, ms, status="ok", kernel="swiglu", spread=0.01):
    ok = status == "ok"
    return dict(run_id=run_id, kernel=kernel, mode="fwd", provider=provider, shape="4096x14336", dims="{}",
                dtype="bfloat16", baseline="torch", bound="memory", status=status,
                error=None if ok else "relative error 0.5 over the tolerance 0.01", timing="cuda-events",
                median_ms=ms if ok else None, p20_ms=ms * (1 - spread) if ok else None,
                p80_ms=ms * (1 + spread) if ok else None, reps=100, bytes=1 << 30, flops=0.0, seq=1)


def make_db(path, runs):
    """runs: [(env key, commit, hours after T0, [(provider, ms, status, spread)])]"""
    with Store(path) as s:
        for key in GPUS:
            s.add_environment(env(key))
        for n, (key, commit, hours, rows) in enumerate(runs):
            rid = f"run-{n:04d}-{key}"
            t = T0 + timedelta(hours=hours)
            s.start_run(Run(run_id=rid, env_id=key, started_at=t + timedelta(minutes=n), finished_at=None,
                            status="finished", git_commit=commit, commit_time=t, git_dirty=False, grid="full",
                            copy_gbps=3000.0, matmul_tflops=800.0, config="{}"))
            s.add_results([result(rid, p, ms, st, spread=sp) for p, ms, st, sp in rows])
    return str(path)


def ok(provider, ms, spread=0.01):
    return (provider, ms, "ok", spread)


@pytest.fixture
def db(tmp_path):
    return make_db(tmp_path / "k.duckdb", [
        # C1 on the H100, measured twice (a rerun is one point)
        ("h100", C1, 0, [ok("triton", 1.00), ok("torch", 2.00), ok("compile", 1.50), ok("liger", 1.2)]),
        ("h100", C1, 0, [ok("triton", 1.01), ok("torch", 2.02), ok("compile", 1.49), ok("liger", 1.2)]),
        # C2: triton 20% slower, compile 20% faster, liger fails its gate, torch unchanged
        ("h100", C2, 1, [ok("triton", 1.20), ok("torch", 2.01), ok("compile", 1.20),
                         ("liger", None, "failed", 0)]),
        # the same commits on the CPU: never mixed with the H100 rows
        ("cpu", C1, 0, [ok("triton", 100.0)]),
        ("cpu", C2, 1, [ok("triton", 100.0)]),
        # the H200's latest commit is C3
        ("h200", C2, 1, [ok("triton", 0.90), ok("torch", 1.50)]),
        ("h200", C3, 2, [ok("triton", 0.70), ok("torch", 1.50)]),
    ])


def kc(*args):
    return CliRunner().invoke(compare_cmd, list(args))


def line_of(out, provider, device="NVIDIA H100 80GB HBM3"):
    (line,) = [ln for ln in out.splitlines() if f" {provider} " in ln and device in ln]
    return line


def test_regression_between_commits_exits_1(db):
    r = kc(C1[:7], C2[:7], "--db", db)
    assert r.exit_code == 1, r.output
    assert "REGRESSION" in line_of(r.output, "triton") and "+19.4%" in line_of(r.output, "triton")  # 1.2 / 1.005
    assert "faster" in line_of(r.output, "compile") and "-19.7%" in line_of(r.output, "compile")  # 1.2 / 1.495
    assert "NOW FAILING" in line_of(r.output, "liger") and "FAILED" in line_of(r.output, "liger")
    assert line_of(r.output, "torch").rstrip().endswith(" no")
    cpu = line_of(r.output, "triton", device="cpu")
    assert "100.0000" in cpu and "+0.0%" in cpu  # CPU rows are their own series
    assert "1 significant regression(s), 1 newly failing, 1 significant improvement(s)" in r.output


def test_same_commit_twice_is_quiet(db):
    r = kc(C1, C1, "--db", db)
    assert r.exit_code == 0, r.output
    assert "REGRESSION" not in r.output and "faster" not in r.output
    assert "0 significant regression(s), 0 newly failing" in r.output


def test_threshold_and_noise(tmp_path):
    path = make_db(tmp_path / "k.duckdb", [
        ("h100", C1, 0, [ok("triton", 1.00), ok("torch", 1.00, spread=0.15)]),
        ("h100", C2, 1, [ok("triton", 1.08), ok("torch", 1.10, spread=0.15)]),
    ])
    r = kc(C1, C2, "--db", path)
    assert r.exit_code == 1 and "REGRESSION" in line_of(r.output, "triton")
    assert "no (noise)" in line_of(r.output, "torch")  # 10% slower, but inside each other's p20-p80 spread
    r = kc(C1, C2, "--db", path, "--threshold", "0.1")
    assert r.exit_code == 0, r.output
    assert line_of(r.output, "triton").rstrip().endswith(" no")


def test_only_improvements_exit_0(tmp_path):
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, [ok("triton", 1.0)]), ("h100", C2, 1, [ok("triton", 0.5)])])
    r = kc(C1, C2, "--db", path)
    assert r.exit_code == 0 and "faster" in r.output, r.output


def test_gpus_compares_each_latest_commit(db):
    r = kc("h100", "H200", "--gpus", "--db", db)
    assert r.exit_code == 0, r.output  # the H200 is faster
    first = r.output.splitlines()[0]
    assert f"NVIDIA H100 80GB HBM3 @ {C2[:12]}" in first and f"NVIDIA H200 @ {C3[:12]}" in first
    triton = [ln for ln in r.output.splitlines() if " triton " in ln][0]
    assert "1.2000" in triton and "0.7000" in triton and "faster" in triton
    assert "2 series in both" in r.output  # liger and compile ran on the H100 only


@pytest.mark.parametrize("args, words", [
    (["deadbeef", C2], "unknown commit 'deadbeef'"),
    (["h100", "cpu", "--gpus"], "never compared with GPU timings"),
    (["NVIDIA", "h100", "--gpus"], "matches several"),
    (["a100", "h100", "--gpus"], "unknown GPU 'a100'; known: NVIDIA H100 80GB HBM3, NVIDIA H200, cpu"),
])
def test_bad_input_exits_2_with_one_line(db, args, words):
    r = kc(*args, "--db", db)
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert words in line
    if "unknown commit" in words:
        assert C3[:12] in line and C1[:12] in line  # a few known commits are listed


def test_missing_store_exits_1(tmp_path):
    r = kc(C1, C2, "--db", str(tmp_path / "none.duckdb"))
    assert r.exit_code == 1 and "no store at" in r.output


def test_markdown_lists_regressions_then_everything(db):
    r = kc(C1, C2, "--db", db, "--markdown")
    assert r.exit_code == 1
    lines = r.output.splitlines()
    assert lines[0] == f"### kcollect compare: `{C1[:12]}` → `{C2[:12]}`"
    head = "| kernel | mode | provider | shape | dtype | gpu | A ms | B ms | change | significant? |"
    assert lines.count(head) == 2  # the significant rows, then all of them in <details>
    first_table = lines[lines.index(head):lines.index("<details><summary>All series</summary>")]
    assert sum("REGRESSION" in ln or "NOW FAILING" in ln for ln in first_table) == 2
    assert "faster" not in "\n".join(first_table)
    assert lines[-1] == "</details>"


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_git_revisions_and_data_only_commits(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    shas = []
    for i in range(3):
        (repo / "f").write_text(str(i))
        git(repo, "add", "f")
        git(repo, "commit", "-q", "-m", f"c{i}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    # runs at the first two commits; the third is a data-only commit with no runs of its own
    path = make_db(tmp_path / "k.duckdb", [("h100", shas[0], 0, [ok("triton", 1.0)]),
                                           ("h100", shas[1], 1, [ok("triton", 1.3)])])
    monkeypatch.chdir(repo)
    r = CliRunner().invoke(compare_cmd, ["HEAD~2", "HEAD~1", "--db", path])
    assert r.exit_code == 1 and "REGRESSION" in r.output, r.output
    r = CliRunner().invoke(compare_cmd, ["HEAD~2", "HEAD", "--db", path])
    assert r.exit_code == 1, r.output
    assert f"has no runs; using its nearest ancestor with runs, {shas[1][:12]}" in r.output


def test_registered_in_the_cli(db):
    out = subprocess.run([sys.executable, "-m", "kcollect.cli", "compare", C1, C2, "--db", db],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "REGRESSION" in out.stdout, out.stderr
