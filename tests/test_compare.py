"""`kcollect compare`: verdicts against measured noise, what never gates, formats, bad input."""
import csv
import io
import json
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

import compare_store
from compare_store import commit_files, make_db, ok
from kcollect.compare import compare_cmd
from kcollect.formats import IDENTITY

C1, C2, C3 = "a1" * 20, "b2" * 20, "c3" * 20
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def db(store, tmp_path):
    # a copy per test: some damage theirs (written once through the Store API, half a second)
    shutil.copyfile(store, tmp_path / "k.duckdb")
    return str(tmp_path / "k.duckdb")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_db(tmp_path_factory.mktemp("compare") / "k.duckdb", [
        # C1 on the H100, measured twice (a rerun is one point)
        ("h100", C1, 0, [ok("triton", 1.00), ok("torch", 2.00), ok("compile", 1.50), ok("liger", 1.2)]),
        ("h100", C1, 0, [ok("triton", 1.01), ok("torch", 2.02), ok("compile", 1.49), ok("liger", 1.2)]),
        # C2: ours 20% slower, compile 20% faster, liger fails its gate, torch unchanged
        ("h100", C2, 1, [ok("triton", 1.20), ok("torch", 2.01), ok("compile", 1.20),
                         dict(provider="liger", ms=None, status="failed")]),
        # the same commits on the CPU: never mixed with the H100 rows, never gating
        ("cpu", C1, 0, [ok("triton", 100.0)]),
        ("cpu", C2, 1, [ok("triton", 200.0)]),
        # the H200's latest commit is C3
        ("h200", C2, 1, [ok("triton", 0.90), ok("torch", 1.50)]),
        ("h200", C3, 2, [ok("triton", 0.70), ok("torch", 1.50)]),
    ])


def kc(*args):
    return CliRunner().invoke(compare_cmd, [str(a) for a in args])


def rows_of(result):
    """The JSON lines of a --format json answer (stdout only)."""
    return json.loads(result.stdout)


def line_of(out, provider, device=H100):
    (line,) = [ln for ln in out.splitlines() if f" {provider} " in ln and device in ln]
    return line


def test_regression_of_ours_exits_1_and_others_never_gate(db):
    r = kc(C1[:7], C2[:7], "--db", db)
    assert r.exit_code == 1, r.output
    triton = line_of(r.stdout, "triton")
    assert "REGRESSION" in triton and "+19.4%" in triton and "unknown" in triton  # 1.2 / 1.005; no git here
    # compile's code does not change between our commits: it moved, it is not our improvement
    assert "moved, code unchanged" in line_of(r.stdout, "compile") and "-19.7%" in line_of(r.stdout, "compile")
    assert "NOW FAILING" in line_of(r.stdout, "liger") and "FAILED" in line_of(r.stdout, "liger")
    assert line_of(r.stdout, "torch").rstrip().endswith(" no")
    assert "REGRESSION" in line_of(r.stdout, "triton", device=" cpu ")  # shown, but it never gates
    assert ("1 significant regression(s), 0 newly failing, 0 significant improvement(s), 0 fixed "
            "(2 more on the CPU or of code that did not change, which never fail)") in r.stdout
    assert "CPU (interpreted) series are shown but never decide the exit status" in r.stderr


def test_same_commit_twice_is_quiet(db):
    r = kc(C1, C1, "--db", db)
    assert r.exit_code == 0, r.output
    assert "REGRESSION" not in r.stdout and "faster" not in r.stdout


def test_cpu_rows_never_decide_the_exit_status(tmp_path):
    path = make_db(tmp_path / "k.duckdb", [("cpu", C1, 0, [ok("triton", 1.0)]), ("cpu", C2, 1, [ok("triton", 2.0)])])
    r = kc(C1, C2, "--db", path)
    assert r.exit_code == 0 and "REGRESSION" in r.stdout, r.output


def test_noise_is_measured_from_the_history(tmp_path, monkeypatch):
    # ours on two shapes over 12 commits that did not touch its code: a quiet series (0.2% run to
    # run) and a noisy one (+-6%); then a commit that changes the kernel, both +8%
    repo = tmp_path / "repo"
    commits = [commit_files(repo, {"kernels/swiglu/kernels.py": "x = 1\n", "README": str(i)}, f"c{i}") for i in range(12)]
    head = commit_files(repo, {"kernels/swiglu/kernels.py": "x = 2\n"}, "the kernel")
    runs = []
    for i, c in enumerate(commits):
        quiet, noisy = 1.0 * (1 + 0.002 * (-1) ** i), 1.0 * (1 + 0.06 * (-1) ** i)
        runs.append(("h100", c, i, [ok("triton", quiet), ok("triton", noisy, shape="M=1,N=64")]))
    runs.append(("h100", head, 20, [ok("triton", 1.08), ok("triton", 1.08, shape="M=1,N=64")]))
    path = make_db(tmp_path / "k.duckdb", runs)
    monkeypatch.chdir(repo)
    r = kc(commits[-1], head, "--db", path, "--format", "json")
    lines = {ln["shape"]: ln for ln in rows_of(r)}
    quiet, noisy = lines["M=4096,N=14336"], lines["M=1,N=64"]
    assert quiet["verdict"] == "regression" and quiet["noise"] < 0.01 and quiet["z"] > 4
    assert noisy["verdict"] == "within noise" and noisy["noise"] > 0.04, noisy
    assert r.exit_code == 1
    assert [c for c in quiet][:len(IDENTITY)] == list(IDENTITY)  # identity columns first


def test_machine_drift_is_corrected_for(tmp_path):
    # between C1 and C2 every series is 6% slower: the machine, not our kernel
    shapes = [f"M={m},N=4096" for m in (1, 2, 3, 4, 5, 6)]
    runs = [("h100", c, h, [ok(p, 1.0 * f, shape=s) for s in shapes for p in ("torch", "compile", "triton")])
            for c, h, f in ((C1, 0, 1.0), (C2, 1, 1.06))]
    path = make_db(tmp_path / "k.duckdb", runs)
    r = kc(C1, C2, "--db", path, "--format", "json")
    assert r.exit_code == 0, r.output
    assert {ln["verdict"] for ln in rows_of(r) if ln["provider"] == "triton"} == {"same"}
    assert "machine drift +6.00% (fitted to 12 series whose code did not change)" in r.stderr


def test_a_cost_per_call_is_the_machine_too(tmp_path):
    # C2's host takes 0.5 us more a call (seen between two H200 hosts of one machine name): a 5 us
    # line 10% slower, a 1 ms line 0.05%, ours with the others; our 6.25 us line 30% slower beyond
    # that is still a regression. One level for all lines (their median) called ours' short lines
    # regressions
    times = [0.005 * 1.25 ** i for i in range(30)]  # 5 us to 3.2 ms, 11 of them under 50 us
    shapes = [f"M={i},N=64" for i in range(30)]
    a = [ok(p, t, shape=s) for s, t in zip(shapes, times) for p in ("torch", "compile", "triton")]
    b = [ok(p, t + 0.0005, shape=s) for s, t in zip(shapes, times) for p in ("torch", "compile", "triton")]
    b[3 * 1 + 2] = ok("triton", (times[1] + 0.0005) * 1.3, shape=shapes[1])
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, a), ("h100", C2, 1, b)])
    r = kc(C1, C2, "--db", path, "--format", "json")
    verdicts = {ln["shape"]: ln["verdict"] for ln in rows_of(r) if ln["provider"] == "triton"}
    assert verdicts.pop(shapes[1]) == "regression" and r.exit_code == 1, r.output
    assert set(verdicts.values()) == {"same"}, verdicts
    assert "and +0.50 us a call (+5.00% at 10 us)" in r.stderr, r.stderr


@pytest.mark.parametrize("b_row, verdict", [
    (ok("triton", 1.5, status="unstable"), "unstable"),  # disturbed while timed: not compared
    (ok("triton", 1.5, timing="cuda-events"), "timing changed"),
])
def test_what_is_never_a_regression(tmp_path, b_row, verdict):
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, [ok("triton", 1.0)]), ("h100", C2, 1, [b_row])])
    r = kc(C1, C2, "--db", path, "--format", "json")
    assert r.exit_code == 0, r.output
    assert rows_of(r)[0]["verdict"] == verdict


def test_a_case_that_failed_for_every_provider_is_not_ours(tmp_path):
    oom = dict(ms=None, status="error")
    path = make_db(tmp_path / "k.duckdb", [
        ("h100", C1, 0, [ok("triton", 1.0), ok("torch", 1.0), ok("triton", 1.0, shape="M=1,N=8")]),
        ("h100", C2, 1, [dict(provider="triton", **oom), dict(provider="torch", **oom),
                         dict(provider="triton", shape="M=1,N=8", **oom)])])
    r = kc(C1, C2, "--db", path, "--format", "json")
    verdicts = {(ln["shape"], ln["provider"]): ln["verdict"] for ln in rows_of(r)}
    assert verdicts == {("M=4096,N=14336", "triton"): "case failed", ("M=4096,N=14336", "torch"): "case failed",
                        ("M=1,N=8", "triton"): "failing"}  # alone in its case: nothing says it is not ours
    assert r.exit_code == 1


def test_environment_change_is_reported_as_such_and_never_hides_ours(tmp_path):
    # torch 2.12 at C2: eager torch 50% slower is the environment's; ours 50% slower with its code
    # changed (git cannot tell here: taken as changed) is shown for confirmation, not dropped
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, [ok("triton", 1.0), ok("torch", 1.0)]),
                                           ("h100", C2, 1, [ok("triton", 1.5), ok("torch", 1.5)], {"torch": "2.12.0"})])
    r = kc(C1, C2, "--db", path, "--format", "json")
    assert r.exit_code == 0, r.output
    lines = {ln["provider"]: ln for ln in rows_of(r)}
    assert lines["torch"]["verdict"] == "environment changed"
    assert lines["triton"]["verdict"] == "changed with the environment"
    assert "environment: torch 2.11.0 -> 2.12.0" in lines["triton"]["note"]
    assert "environment changed (torch 2.11.0 -> 2.12.0)" in r.stderr
    table = kc(C1, C2, "--db", path)
    assert "changed with the environment: confirm" in table.stdout


@pytest.mark.parametrize("spelling", ["liger-kernel", "liger_kernel"])
def test_a_peer_upgrade_is_a_change_for_that_peer_only(tmp_path, monkeypatch, spelling):
    # liger-kernel 0.5 -> 0.6 between the commits: liger's own series changed conditions; ours and
    # torch did not, so ours' +20% is judged as usual (and fails). Rows name the peer as its wheel
    # spells it (Liger's: liger_kernel), the environment's list by its canonical name.
    monkeypatch.setitem(compare_store.PACKAGES, "liger", spelling)
    peers = ('{"liger-kernel": "0.5.0", "quack-kernels": "0.1"}', '{"liger-kernel": "0.6.0", "quack-kernels": "0.1"}')
    shapes = [f"M={m},N=64" for m in range(1, 7)]
    rows = lambda f: ([ok("torch", 1.0, shape=x) for x in shapes] + [ok("liger", 1.0 * f, shape=x) for x in shapes]  # noqa: E731
                      + [ok("quack", 1.0, shape=x) for x in shapes] + [ok("triton", 1.0 * f, shape=shapes[0])])
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, rows(1.0), {"peers": peers[0]}),
                                           ("h100", C2, 1, rows(1.2), {"peers": peers[1]})])
    r = kc(C1, C2, "--db", path, "--format", "json")
    verdicts = {(ln["provider"], ln["shape"]): ln["verdict"] for ln in rows_of(r)}
    assert {v for (p, _), v in verdicts.items() if p == "liger"} == {"environment changed"}
    assert {v for (p, _), v in verdicts.items() if p in ("torch", "quack")} == {"same"}
    assert verdicts[("triton", shapes[0])] == "regression" and r.exit_code == 1, r.output


def test_rows_from_before_packages_were_recorded_take_their_provider_s_package(tmp_path):
    # C1's rows predate schema 8 (package NULL) and ran beside another set of peers (cortexcore,
    # which neither compile nor liger runs): not a change of conditions for their series, whose
    # package LEGACY_PACKAGES names; liger's own version still counts
    shapes = [f"M={m},N=64" for m in range(1, 7)]
    rows = [ok(p, 1.0, shape=x) for x in shapes for p in ("compile", "liger")] + [ok("triton", 1.0, shape=shapes[0])]
    peers = ('{"cortexcore": "0.1.6", "liger-kernel": "0.5.0"}', '{"liger-kernel": "0.5.0"}',
             '{"liger-kernel": "0.6.0"}')
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, rows, {"peers": peers[0]}),
                                           ("h100", C2, 1, rows, {"peers": peers[1]}),
                                           ("h100", C3, 2, rows, {"peers": peers[2]})])
    import duckdb
    with duckdb.connect(path) as con:
        con.execute("UPDATE results SET package = NULL WHERE run_id LIKE 'run-0000%'")
    r = kc(C1, C2, "--db", path, "--format", "json")
    assert not [ln for ln in rows_of(r) if "environment" in (ln["note"] or "")], r.output
    r = kc(C2, C3, "--db", path, "--format", "json")
    assert {"liger-kernel 0.5.0 -> 0.6.0" in (ln["note"] or "") for ln in rows_of(r)
            if ln["provider"] == "liger"} == {True}, r.output


def test_two_runs_of_one_commit_never_gate(tmp_path):
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, [ok("triton", 1.0), ok("torch", 1.0)]),
                                           ("h100", C1, 0, [ok("triton", 1.3), ok("torch", 1.0)])])
    r = kc("run-0000", "run-0001", "--run", "--db", path, "--format", "json")
    assert r.exit_code == 0, r.output
    assert {ln["provider"]: ln["verdict"] for ln in rows_of(r)} == {"triton": "moved", "torch": "same"}


def test_gpus_compares_each_latest_commit(db):
    r = kc("h100", "H200", "--gpus", "--db", db)
    assert r.exit_code == 0, r.output
    first = r.stdout.splitlines()[0]
    assert f"{H100} @ {C2[:12]}" in first and f"NVIDIA H200 @ {C3[:12]}" in first
    triton = [ln for ln in r.stdout.splitlines() if " triton " in ln][0]
    assert "1.2000" in triton and "0.7000" in triton and "faster" in triton
    assert "2 series in both" in r.stdout  # liger and compile ran on the H100 only


@pytest.mark.parametrize("args, words", [
    (["deadbeef", C2], "unknown commit 'deadbeef'"),
    (["h100", "cpu", "--gpus"], "never compared with GPU timings"),
    (["NVIDIA", "h100", "--gpus"], "matches several"),
    (["a100", "h100", "--gpus"], "unknown GPU 'a100'; known: NVIDIA H100 80GB HBM3, NVIDIA H200, cpu"),
    ([C1, C2, "--threshold", "5"], "'5' would mean 500%; a threshold is a fraction: write 0.05 or 5% for 5%"),
    ([C1, C2, "--threshold", "nan"], "must be a finite number"),
    ([C1, C2, "--threshold", "-0.1"], "must be a finite number at least 0"),
    ([C1, C2, "--threshold", "five"], "is not a number"),
    (["run-9", C2, "--run"], "unknown run 'run-9'"),
    ([C1, C2, "--run", "--gpus"], "give --gpus or --run, not both"),
    ([C1, C2, "--gpus", "--confirm"], "--confirm re-measures two commits"),
    ([C1, C3, "--db"], "ran on NVIDIA H100 80GB HBM3, cpu and c3c3c3c3c3c3 on NVIDIA H200: no series in common"),
])
def test_bad_input_exits_2_with_one_line(db, args, words):
    if args[-1] == "--db":
        args = args[:-1]
    r = kc(*args, "--db", db)
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert words in line
    if "unknown commit" in words:
        assert C3[:12] in line and C1[:12] in line  # a few known commits are listed


def test_threshold_accepts_a_percentage(tmp_path):
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, [ok("triton", 1.0)]), ("h100", C2, 1, [ok("triton", 1.08)])])
    assert kc(C1, C2, "--db", path).exit_code == 1
    for t in ("10%", "0.1"):
        r = kc(C1, C2, "--db", path, "--threshold", t)
        assert r.exit_code == 0 and "threshold 10.0%" in r.stdout, r.output


def test_missing_store_exits_1(tmp_path):
    r = kc(C1, C2, "--db", tmp_path / "none.duckdb")
    assert r.exit_code == 1 and "no store at" in r.output


@pytest.mark.parametrize("damage", ["truncate", "newer"])
def test_damaged_store_exits_2_with_one_line(db, damage):
    import duckdb

    if damage == "newer":
        con = duckdb.connect(db)
        con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        con.close()
    else:
        with open(db, "r+b") as f:
            f.truncate(f.seek(0, 2) // 2)
    r = kc(C1, C2, "--db", db)
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert ("truncated" if damage == "truncate" else "newer than this kcollect") in line


def test_formats(db):
    md = kc(C1, C2, "--db", db, "--markdown")
    assert md.exit_code == 1
    lines = md.stdout.splitlines()
    assert lines[0] == f"### kcollect compare: `{C1[:12]}` → `{C2[:12]}`"
    head = [ln for ln in lines if ln.startswith("| kernel | mode | provider | shape | dtype | gpu | machine |")]
    assert len(head) == 2  # the gating rows, then all of them in <details>
    first_table = lines[lines.index(head[0]):lines.index("<details><summary>All series</summary>")]
    assert sum("REGRESSION" in ln for ln in first_table) == 1 and "NOW FAILING" not in "\n".join(first_table)
    assert lines[-1] == "</details>"
    assert kc(C1, C2, "--db", db, "--format", "markdown").stdout == md.stdout
    table = list(csv.reader(io.StringIO(kc(C1, C2, "--db", db, "--format", "csv").stdout)))
    assert table[0][:len(IDENTITY)] == list(IDENTITY) and len(table) == 1 + 5
    data = rows_of(kc(C1, C2, "--db", db, "--format", "json"))
    (triton,) = [d for d in data if d["provider"] == "triton" and d["gpu"] == H100]
    # two runs are one point: their geometric mean
    assert triton["a_ms"] == pytest.approx((1.0 * 1.01) ** 0.5) and triton["b_ms"] == 1.2
    assert triton["verdict"] == "regression"
    assert kc(C1, C2, "--db", db, "--markdown", "--format", "csv").exit_code == 2


def test_git_decides_whose_code_changed(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    lib = {"kernels/_lib/__init__.py": "from .rows import helper\n", "kernels/_lib/rows.py": "def helper():\n    return 1\n",
           "kernels/_lib/grids.py": "G = 1\n", "kernels/_lib/launch.py": "L = 1\n"}
    c1 = commit_files(repo, {**lib, "kernels/foo/__init__.py": "from .._lib import helper\nx = 1\n",
                             "kernels/bar/__init__.py": "from ..foo import x\n",
                             "kernels/baz/__init__.py": "from .._lib.launch import L\ny = 1\n",
                             "kernels/baz/spec.py": "from .._lib.grids import G\nfrom . import y\n"}, "c1")
    c2 = commit_files(repo, {"kernels/foo/__init__.py": "from .._lib import helper\nx = 2\n"}, "foo; bar imports foo")
    c3 = commit_files(repo, {"README": "docs only\n"}, "nothing of the kernels")
    c4 = commit_files(repo, {"kernels/_lib/rows.py": "def helper():\n    return 2\n"}, "a shared module foo imports")
    c5 = commit_files(repo, {"kernels/_lib/grids.py": "G = 2\n", "kernels/baz/spec.py": "from .._lib.grids import G\n"
                             "from . import y\nZ = 3\n"}, "baz's inputs only (its spec and what only the spec imports)")
    # ours of foo and bar +30% at c2 and c4; every provider of baz +30% at c5, where its inputs changed
    ours = {c1: 1.0, c2: 1.3, c3: 1.3, c4: 1.69, c5: 1.69}
    baz = {c1: 1.0, c2: 1.0, c3: 1.0, c4: 1.0, c5: 1.3}
    path = make_db(tmp_path / "k.duckdb", [("h100", c, h, [ok("triton", ours[c], kernel=k) for k in ("foo", "bar")]
                                            + [ok("triton", baz[c], kernel="baz"), ok("torch", baz[c], kernel="baz")]
                                            + [ok("torch", 1.0, kernel=k) for k in ("foo", "bar")])
                                           for h, c in enumerate(ours)])
    monkeypatch.chdir(repo)
    verdicts = {}
    for a, b in ((c1, c2), (c2, c3), (c3, c4), (c4, c5)):
        r = kc(a, b, "--db", path, "--format", "json")
        verdicts[b] = {(ln["kernel"], ln["provider"]): (ln["code"], ln["verdict"]) for ln in rows_of(r)}
        assert r.exit_code == (1 if b in (c2, c4) else 0), r.output
    ours = lambda b: {k: v for (k, p), v in verdicts[b].items() if p == "triton"}  # noqa: E731
    assert ours(c2) == {"foo": ("changed", "regression"), "bar": ("changed", "regression"), "baz": ("unchanged", "same")}
    assert ours(c3) == {k: ("unchanged", "same") for k in ("foo", "bar", "baz")}
    # a module of _lib changes the kernels that import it (foo through the package's re-export; bar imports foo)
    assert ours(c4) == {"foo": ("changed", "regression"), "bar": ("changed", "regression"), "baz": ("unchanged", "same")}
    # baz's spec and a module only its spec imports: a change of method, every provider of baz alike, never ours
    assert verdicts[c5][("baz", "triton")] == ("method", "method changed")
    assert verdicts[c5][("baz", "torch")] == ("method", "method changed")
    assert "kernels whose method only changed (inputs, what is measured or how it is timed): baz" in kc(c4, c5, "--db", path).stderr


def test_git_revisions_and_data_only_commits(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    shas = [commit_files(repo, {"f": str(i)}, f"c{i}") for i in range(3)]
    # runs at the first two commits; the third is a data-only commit with no runs of its own
    path = make_db(tmp_path / "k.duckdb", [("h100", shas[0], 0, [ok("triton", 1.0)]),
                                           ("h100", shas[1], 1, [ok("triton", 1.3)])])
    monkeypatch.chdir(repo)
    r = kc("HEAD~2", "HEAD~1", "--db", path)
    assert r.exit_code == 1 and "REGRESSION" in r.stdout, r.output
    r = kc("HEAD~2", "HEAD", "--db", path)
    assert r.exit_code == 1, r.output
    assert f"has no runs; using its nearest ancestor with runs, {shas[1][:12]}" in r.stderr


def test_registered_in_the_cli(db):
    out = subprocess.run([sys.executable, "-m", "kcollect.cli", "compare", C1, C2, "--db", db],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "REGRESSION" in out.stdout, out.stderr


def test_a_series_is_compared_with_the_last_commit_that_measured_it(tmp_path):
    # C1 measured swiglu and gelu, C2 gelu only, C3 both: swiglu's +20% at C3 is against C1 (the
    # history's swiglu +11% at fea1ddc4 was missed because its previous commit had not measured it)
    path = make_db(tmp_path / "k.duckdb", [
        ("h100", C1, 0, [ok("triton", 1.0), ok("triton", 1.0, kernel="gelu")]),
        ("h100", C2, 1, [ok("triton", 1.0, kernel="gelu")]),
        ("h100", C3, 2, [ok("triton", 1.2), ok("triton", 1.0, kernel="gelu")])])
    r = kc(C2, C3, "--db", path, "--format", "json")
    lines = {ln["kernel"]: ln for ln in rows_of(r)}
    assert lines["swiglu"]["verdict"] == "regression" and lines["swiglu"]["a_ms"] == 1.0
    assert f"A side: {C1[:8]}, the last commit that measured it" in lines["swiglu"]["note"]
    assert lines["gelu"]["verdict"] == "same" and "A side" not in lines["gelu"]["note"]
    assert r.exit_code == 1


def test_a_full_sha_finds_runs_stored_under_its_short_sha(tmp_path):
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, [ok("triton", 1.0)]), ("h100", C2[:7], 1, [ok("triton", 1.3)])])
    r = kc(C1, C2, "--db", path)
    assert r.exit_code == 1 and "REGRESSION" in r.stdout, r.output
    assert f"B = {C2[:7]}" in r.stdout


def test_only_changed_shows_the_lines_that_moved(db):
    full = kc(C1, C2, "--db", db)
    only = kc(C1, C2, "--db", db, "--only-changed")
    assert only.exit_code == full.exit_code == 1
    assert " torch " in full.stdout and " torch " not in only.stdout  # unchanged: left out
    assert "REGRESSION" in only.stdout and "NOW FAILING" in only.stdout and "moved" in only.stdout
    assert only.stdout.splitlines()[-1] == full.stdout.splitlines()[-1]  # the summary counts every line


def test_ours_is_what_the_row_says_not_a_provider_name(tmp_path):
    # the backbone's own provider is called 'kcollect'; a 'triton' row that is not ours never gates
    path = make_db(tmp_path / "k.duckdb", [
        ("h100", C1, 0, [ok("kcollect", 1.0, kernel="backbone", ours=True), ok("triton", 1.0, ours=False)]),
        ("h100", C2, 1, [ok("kcollect", 1.3, kernel="backbone", ours=True), ok("triton", 1.3, ours=False)])])
    r = kc(C1, C2, "--db", path, "--format", "json")
    verdicts = {ln["provider"]: ln["verdict"] for ln in rows_of(r)}
    assert verdicts == {"kcollect": "regression", "triton": "moved"} and r.exit_code == 1, r.output


def test_interrupted_runs_are_partial(tmp_path):
    # B's run was interrupted: a slowdown there is shown for confirmation and never fails; its errors
    # are not the kernel's failures
    path = make_db(tmp_path / "k.duckdb", [
        ("h100", C1, 0, [ok("triton", 1.0), ok("triton", 1.0, shape="M=1,N=8")]),
        ("h100", C2, 1, [ok("triton", 1.3), dict(provider="triton", shape="M=1,N=8", ms=None, status="error")],
         {"status": "interrupted"})])
    r = kc(C1, C2, "--db", path, "--format", "json")
    verdicts = {ln["shape"]: ln["verdict"] for ln in rows_of(r)}
    assert verdicts == {"M=4096,N=14336": "partial run", "M=1,N=8": "partial run"} and r.exit_code == 0, r.output
    assert "interrupted or did not finish (partial runs)" in r.stderr


def test_a_row_its_recheck_contradicts_is_no_time(tmp_path):
    # stored 'ok' by an older rule at 0.0468 ms beside a recheck of 0.006 ms (the history's f2cc07b)
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, [ok("triton", 0.006)]),
                                           ("h100", C2, 1, [ok("triton", 0.0468, recheck=0.006, spread=2.0)])])
    r = kc(C1, C2, "--db", path, "--format", "json")
    assert rows_of(r)[0]["verdict"] == "unstable" and r.exit_code == 0, r.output


def test_lab_runs_are_never_compared(tmp_path):
    path = make_db(tmp_path / "k.duckdb", [("h100", C1, 0, [ok("triton", 1.0)]),
                                           ("h100", C2, 1, [ok("triton", 1.0)]),
                                           ("h100", C2, 2, [ok("triton", 5.0)], {"grid": "lab"})])
    r = kc(C1, C2, "--db", path, "--format", "json")
    assert rows_of(r)[0]["verdict"] == "same" and rows_of(r)[0]["b_ms"] == 1.0, r.output


def test_a_point_its_own_recheck_contradicts_is_less_certain(tmp_path):
    # an H200 A/A pair at 0adeb72: conv1d's bimodal row stored its median at 1.03 ms on the rarer
    # level, beside its own recheck's 1.106 ms (both within the row's p20-p80) and a rerun's 1.109
    # ms; the series' history said +-0.2%, and the pair failed at +7.6%. The point's recheck widens
    # it; a real step of the same size, whose rechecks agree, still fails.
    shapes = [f"M={m},N=4096" for m in (1, 3, 7, 64, 128, 256, 1000, 2048, 4096, 8192)]
    jitter = [0.999, 1.001, 1.0, 1.002, 0.998]  # the history's run-to-run scatter, +-0.2%

    def commit(i, level=None):
        level = level or {}
        rows = []
        for n, shape in enumerate(shapes):
            ms = 1.0 * jitter[(i + n) % len(jitter)]
            ms, recheck, spread = level.get(shape, (ms, ms * 1.001, 0.002))
            rows.append(ok("triton", ms, shape=shape, recheck=recheck, spread=spread))
        return rows

    history = [("h200", f"{i:02d}" * 20, i, commit(i)) for i in range(6)]
    bimodal, stepped = shapes[3], shapes[5]
    a = commit(6, {bimodal: (0.930, 1.000, 0.04)})
    b = commit(7, {stepped: (1.075, 1.076, 0.002)})
    path = make_db(tmp_path / "k.duckdb", history + [("h200", C1, 6, a), ("h200", C2, 7, b)])
    r = kc(C1, C2, "--db", path, "--format", "json")
    verdicts = {ln["shape"]: ln["verdict"] for ln in rows_of(r)}
    assert verdicts[bimodal] != "regression" and verdicts[stepped] == "regression", r.output
    assert r.exit_code == 1


@pytest.mark.parametrize("slower, verdict", [(0.05, "within noise"), (0.3, "regression")])
def test_a_commits_speed_ups_do_not_lower_the_bar_for_its_slowdowns(tmp_path, slower, verdict):
    # Benjamini-Hochberg's bar rises with its rejections: decided in one family, 60 real speed-ups let
    # a +5% of noise through (the H200's fb7d83b -> 5b9bd58 flagged a 20 us series at +5.5%, back at
    # its level of the runs before); the gate asks which lines got slower on its own
    def verdict_of(others_after):
        rows_a = [ok("triton", 1.0, shape=f"M={i},N=8") for i in range(60)] + [ok("triton", 1.0)]
        rows_b = [ok("triton", others_after, shape=f"M={i},N=8") for i in range(60)] + [ok("triton", 1.0 + slower)]
        refs = [ok("torch", 1.0, shape=f"M={i},N=8") for i in range(8)]  # the machine's drift: none
        path = make_db(tmp_path / f"k{others_after}.duckdb", [("h100", C1, 0, rows_a + refs), ("h100", C2, 1, rows_b + refs)])
        lines = {ln["shape"]: ln for ln in rows_of(kc(C1, C2, "--db", path, "--format", "json"))}
        return lines["M=4096,N=14336"]["verdict"], lines["M=0,N=8"]["verdict"]

    assert verdict_of(1.0) == (verdict, "same")
    assert verdict_of(0.7) == (verdict, "improvement")
