"""`kcollect run --changed`: the kernels whose code or method changed since the last benchmarked
commit, plus the sentinels; in a real git repository and a real store."""
import subprocess
from datetime import datetime

import pytest

from kcollect import changed
from kcollect.registry import builtin_spec
from kcollect.store import Run, Store
from test_collect import kc_here

SPECS = [builtin_spec(k) for k in ("gelu", "rms_norm", "softmax", "swiglu")]


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit(root, files: dict[str, str], message: str) -> str:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    """kernels/ of two ops: gelu imports a shared module, swiglu does not."""
    git(tmp_path, "init", "-q")
    first = commit(tmp_path, {
        "kernels/__init__.py": "", "kernels/_lib/__init__.py": "", "kernels/_lib/shared.py": "X = 1\n",
        "kernels/gelu/__init__.py": "from .kernels import gelu\n",
        "kernels/gelu/kernels.py": "from .._lib.shared import X\n\ndef gelu(x):\n    return x * X\n",
        "kernels/gelu/spec.py": "GRID = 1\n",
        "kernels/swiglu/__init__.py": "def swiglu(x):\n    return x\n", "kernels/swiglu/spec.py": "GRID = 1\n",
    }, "first")
    return tmp_path, first


def test_a_shared_module_changes_only_the_kernels_that_import_it(repo):
    root, first = repo
    second = commit(root, {"kernels/_lib/shared.py": "X = 2\n"}, "shared")
    got = changed.select(SPECS, first, second, root=root)
    assert got.kernels == {"gelu": "changed"}
    # the sentinels of kernels not measured in full, at their full-grid shapes
    assert dict(got.sentinels) == {"rms_norm": ("M=8192,N=4096", "M=1,N=4096"), "softmax": ("M=4096,N=4096",)}
    assert got.names == ["gelu", "rms_norm", "softmax"]


def test_an_edit_of_comments_or_docstrings_only_changes_nothing_that_runs(repo):
    root, first = repo
    kernels = '"""Gelu."""\nfrom .._lib.shared import X  # the scale\n\n\ndef gelu(x):\n    """x times X."""\n    return x * X\n'
    second = commit(root, {"kernels/gelu/kernels.py": kernels, "kernels/_lib/shared.py": "# shared\nX = 1\n",
                           "kernels/swiglu/spec.py": '"""The grid."""\nGRID = 1  # one\n'}, "words")
    assert changed.select(SPECS, first, second, root=root).kernels == {}
    # the same words with one change of code; a file that does not parse counts as changed
    third = commit(root, {"kernels/gelu/kernels.py": kernels.replace("x * X", "x * X * 2")}, "code")
    assert changed.select(SPECS, second, third, root=root).kernels == {"gelu": "changed"}
    fourth = commit(root, {"kernels/swiglu/spec.py": "GRID = (\n"}, "broken")
    assert changed.select(SPECS, third, fourth, root=root).kernels == {"swiglu": "method"}


def test_a_spec_only_edit_is_a_change_of_method_and_nothing_changed_means_sentinels_only(repo):
    root, first = repo
    second = commit(root, {"kernels/swiglu/spec.py": "GRID = 2\n"}, "grid")
    assert changed.select(SPECS, first, second, root=root).kernels == {"swiglu": "method"}
    same = changed.select(SPECS, second, second, grid="quick", root=root)
    assert same.kernels == {} and {k for k, _ in same.sentinels} == {"rms_norm", "softmax", "gelu"}
    # on the quick grid (the CPU) each sentinel kernel's first quick shape, once
    assert dict(same.sentinels)["rms_norm"] == (builtin_spec("rms_norm").grid("quick")[0].label,)


def test_an_edit_of_how_cases_are_timed_is_a_change_of_every_kernels_method(repo):
    # the timer is the ruler: every series may move with it (eager's M=1 layer_norm moved +32% at a
    # runner edit on the H200), so every kernel's method changed; a kernel edited with it changed
    root, first = repo
    harness = commit(root, {"collector/timing.py": "WARMUP = 2\n", "collector/site.py": "X = 1\n"}, "timer")
    assert changed.select(SPECS, first, harness, root=root).kernels == {"gelu": "method", "swiglu": "method"}
    both = commit(root, {"collector/runner.py": "R = 1\n", "kernels/gelu/kernels.py": "def gelu(x):\n    return x\n"},
                  "runner and gelu")
    assert changed.select(SPECS, harness, both, root=root).kernels == {"gelu": "changed", "swiglu": "method"}
    # the collector's other modules are not the ruler
    other = commit(root, {"collector/site.py": "X = 2\n"}, "site")
    assert changed.select(SPECS, both, other, root=root).kernels == {}


def test_without_a_benchmarked_ancestor_every_kernel_runs(repo):
    root, first = repo
    got = changed.select(SPECS, None, first, root=root)
    assert set(got.kernels) == {s.name for s in SPECS} and got.sentinels == ()
    assert "measuring every kernel" in got.note


def _runs(store, runs):
    """Runs (id, commit, machine, day, grid, [(kernel, ours)]) with one row a (kernel, provider)."""
    for run_id, sha, machine, day, grid, rows in runs:
        store.start_run(Run(run_id=run_id, env_id="e", started_at=datetime(2026, 1, day), finished_at=None,
                            status="finished", git_commit=sha, commit_time=datetime(2026, 1, day), git_dirty=False,
                            grid=grid, copy_gbps=1.0, matmul_tflops=1.0, config="{}", machine=machine))
        store.add_results([{"run_id": run_id, "kernel": k, "mode": "fwd", "provider": "triton" if ours else "torch",
                            "shape": "M=1", "dims": "{}", "dtype": "float32", "baseline": not ours, "ours": ours,
                            "status": "ok", "median_ms": 1.0} for k, ours in rows])


def test_each_kernel_is_compared_with_its_own_last_measured_commit(repo, tmp_path):
    # a kernel a run left out is measured at the next, against the last commit that measured it
    # (the machine's newest run measured gelu alone: swiglu's change after its own last run still runs)
    root, first = repo
    second = commit(root, {"kernels/swiglu/__init__.py": "def swiglu(x):\n    return x * 2\n"}, "swiglu")
    third = commit(root, {"kernels/gelu/kernels.py": "def gelu(x):\n    return x\n"}, "gelu")
    git(root, "checkout", "-q", "-b", "side", first)
    side = commit(root, {"kernels/swiglu/spec.py": "GRID = 3\n"}, "side")
    git(root, "checkout", "-q", "-")
    with Store(tmp_path / "k.duckdb") as store:
        _runs(store, [("r0", first, "m1", 1, "full", [("gelu", True), ("swiglu", True)]),
                      ("r1", third, "m1", 3, "full", [("gelu", True), ("swiglu", False)]),  # swiglu's peer alone
                      ("r2", side, "m1", 4, "full", [("swiglu", True)]),  # a branch HEAD does not contain
                      ("r3", third, "m1", 5, "quick", [("swiglu", True)]),  # another grid
                      ("r4", third, "m2", 2, "full", [("gelu", True), ("swiglu", True)])])  # another machine
        last = changed.last_measured(store, third, "cuda", "m1", "full", root=root)
        assert last == {"gelu": third, "swiglu": first}
        assert changed.last_measured(store, third, "cuda", "m2", "full", root=root) == {"gelu": third, "swiglu": third}
        assert changed.last_measured(store, third, "cuda", "m3", "full", root=root) == {}
    got = changed.select_each(SPECS, last, third, root=root)
    # swiglu changed since r0, gelu measured at HEAD; rms_norm and softmax never measured on m1
    assert got.kernels == {"rms_norm": "new", "softmax": "new", "swiglu": "changed"}, got
    assert dict(got.sentinels) == {"gelu": ("M=16384,N=4096,approx=tanh",)}
    assert f"swiglu (code since {first[:12]})" in got.note and "rms_norm (new)" in got.note
    # nothing measured here: every kernel, as without a benchmarked ancestor
    assert set(changed.select_each(SPECS, {}, third, root=root).kernels) == {s.name for s in SPECS}


def test_the_cli_plans_the_sentinels_when_nothing_changed_and_refuses_bad_input(tmp_path):
    out = kc_here("run", "--changed=HEAD", "--dry-run", "--device", "cpu", "--db", str(tmp_path / "k.duckdb"))
    assert out.exit_code == 0, out.output
    assert "--changed since" in out.stderr and "none" in out.stderr
    planned = out.stdout
    assert "rms_norm" in planned and "swiglu" not in planned
    bad = kc_here("run", "--changed=no-such-commit", "--dry-run", "--device", "cpu")
    assert bad.exit_code == 2 and "no such commit" in bad.stderr
    both = kc_here("run", "gelu", "--changed", "--dry-run", "--device", "cpu")
    assert both.exit_code == 2 and "only one of them" in both.stderr
