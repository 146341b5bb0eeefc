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


def test_the_last_benchmarked_commit_is_the_newest_ancestor_measured_on_this_machine(repo, tmp_path):
    root, first = repo
    second = commit(root, {"kernels/gelu/kernels.py": "def gelu(x):\n    return x\n"}, "gelu")
    git(root, "checkout", "-q", "-b", "side", first)
    side = commit(root, {"kernels/swiglu/spec.py": "GRID = 3\n"}, "side")
    git(root, "checkout", "-q", "-")
    with Store(tmp_path / "k.duckdb") as store:
        for i, (sha, machine, t) in enumerate([(first, "m1", 1), (side, "m1", 3), (second, "m2", 2)]):
            store.start_run(Run(run_id=f"r{i}", env_id="e", started_at=datetime(2026, 1, t), finished_at=None,
                                status="finished", git_commit=sha, commit_time=datetime(2026, 1, t), git_dirty=False,
                                grid="full", copy_gbps=1.0, matmul_tflops=1.0, config="{}", machine=machine))
        # m1's newest run is on a branch HEAD does not contain; m2 measured HEAD itself
        assert changed.last_benchmarked(store, second, "cuda", "m1", root=root) == first
        assert changed.last_benchmarked(store, second, "cuda", "m2", root=root) == second
        assert changed.last_benchmarked(store, second, "cuda", "m3", root=root) is None


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
