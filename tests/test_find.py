"""`kcollect find`: bisection over the commits of a planted git repository, where one commit makes
a kernel slower (a sleep in a --kernel-module file), measured on the CPU with real `kcollect run`
processes in git worktrees; and the bisection rule itself, in-process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from click.testing import CliRunner

from kcollect import find
from kcollect.cli import main
from kcollect.find import Point

KCOLLECT = [sys.executable, "-m", "kcollect.cli"]

OPS = '''\
"""x * 2, with a delay that one commit plants, on a virtual clock injected into the CPU timing: a
call takes exactly DELAY plus 0.1 ms whatever the machine's load (a real sleep does not)."""
import torch

from kcollect import timing
from kcollect.spec import KernelSpec, Provider, Shape

DELAY = {delay}
NOW = [0.0]


def virtual_clock():
    NOW[0] += 5e-5  # each reading 0.05 ms on
    return NOW[0]


def double(x):
    # from the first call on, the timing reads the virtual clock (the device's ceilings, measured
    # before any case, read the real one)
    timing.clock = virtual_clock
    NOW[0] += DELAY
    return x * 2


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return {{"x": torch.randn(dims["M"], dims["N"], generator=g).to(device=device, dtype=dtype)}}


SHAPES = (Shape.rows(4, 64, "the series bisected"), Shape.rows(8, 64, "another, to be ignored"))
SPEC = KernelSpec(
    name="planted", description="x * 2", modes=("fwd",), providers=(Provider("torch", double),),
    baseline="torch", reference=lambda x: x * 2, make_inputs=make_inputs, grad_inputs=(),
    grids={{"quick": SHAPES, "full": SHAPES}},
    bytes_moved=lambda dims, dtype, mode: 2 * dims["M"] * dims["N"] * dtype.itemsize,
    flops=lambda dims, mode: float(dims["M"] * dims["N"]), bound="memory",
    tolerance={{torch.float32: 1e-6}}, dtypes=(torch.float32,), bench_dtypes=(torch.float32,))
'''

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Five commits; the third makes `planted` 30 ms slower. Returns (repo, [shas])."""
    repo = tmp_path_factory.mktemp("planted")
    git(repo, "init", "-q")
    shas = []
    for i, (delay, subject) in enumerate([(0.0, "the op"), (0.0, "notes"), (0.03, "a slower op"),
                                          (0.03, "more notes"), (0.03, "the last")]):
        (repo / "ops.py").write_text(OPS.format(delay=delay))
        (repo / "NOTES").write_text(f"{i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", subject)
        shas.append(git(repo, "rev-parse", "HEAD"))
    return repo, shas


def kc_find(repo, *args):
    return subprocess.run(KCOLLECT + ["find", *args, "--repo", str(repo)], capture_output=True, text=True,
                          timeout=900)


@pytest.mark.e2e
def test_find_names_the_commit_that_planted_the_delay(planted):
    repo, shas = planted
    out = kc_find(repo, "planted", "M=4,N=64", shas[0], shas[-1], "--provider", "torch", "--device", "cpu",
                  "--kernel-module", "ops.py", "--warmup-ms", "0", "--rep-ms", "1", "--min-reps", "3",
                  "--samples", "2", "--format", "json")
    assert out.returncode == 0, out.stderr[-3000:]
    recs = json.loads(out.stdout)
    by_commit = {r["commit"]: r for r in recs}
    assert by_commit[shas[2]]["verdict"] == "first bad" and by_commit[shas[2]]["subject"] == "a slower op"
    assert by_commit[shas[0]]["verdict"] == "good" and by_commit[shas[-1]]["verdict"] == "bad"
    assert by_commit[shas[0]]["max_ms"] < 10 < by_commit[shas[-1]]["min_ms"]
    assert len(recs) == 4  # GOOD, BAD and two midpoints: a bisection, not a walk over every commit
    assert all(r["runs"] == 2 for r in recs)  # --samples runs at each
    # only the shape asked for was run (run --shape), never the grid's other one
    assert "M=8,N=64" not in out.stderr and "1 cases" in out.stderr
    # every worktree is gone again
    assert git(repo, "worktree", "list").count("\n") == 0


@pytest.mark.e2e
def test_find_between_commits_that_change_no_kernel_is_not_significant(planted):
    # the last three commits change only a note: runs of one code differ by noise, and find says
    # so rather than name a commit (with one run each and a 5% rule, noise could name one)
    repo, shas = planted
    out = kc_find(repo, "planted", "M=4,N=64", shas[2], shas[4], "--provider", "torch", "--device", "cpu",
                  "--kernel-module", "ops.py", "--warmup-ms", "0", "--rep-ms", "1", "--min-reps", "3",
                  "--samples", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("not significant") == 3  # GOOD's and BAD's verdicts, and the conclusion
    assert "nothing to bisect" in out.stdout and "over 2 runs each" in out.stdout
    assert "first bad" not in out.stdout


def test_the_readme_example_is_a_series_of_the_cpu_grid():
    # checked before anything is measured: the README's example as written must pass on the CPU
    import re

    from kcollect.find import Series, check_series

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (example,) = re.findall(r"`kcollect find (rms_norm \S+ GOOD BAD[^`]*)`", readme)
    kernel, shape, _, _, *rest = example.split()
    opts = dict(zip(rest[::2], rest[1::2]))
    root = Path(__file__).resolve().parent.parent
    got = check_series(Series(kernel, shape, opts.get("--mode", "fwd"), "triton", None), "quick", "cpu", (), root,
                       "HEAD")
    assert got == Series(kernel, shape, opts.get("--mode", "fwd"), "triton", "bfloat16")


@pytest.mark.parametrize("args, words", [
    (["planted", "M=5,N=64"], "planted has no shape M=5,N=64 in its quick grid (this machine's default; --quick or "
                              "--full picks); valid: M=4,N=64, M=8,N=64"),
    (["planted", "M=4,N=64", "--provider", "triton"], "planted has no provider 'triton'; valid: torch"),
    (["planted", "M=4,N=64", "--mode", "bwd"], "planted has no mode 'bwd'; valid: fwd"),
    (["nope", "M=4,N=64"], "unknown kernel 'nope'"),
    (["planted", "M=4,N=64", "--kernel-module", "other.py"], "--kernel-module other.py: not in the tree of"),
])
def test_the_series_is_checked_before_anything_is_measured(planted, args, words):
    repo, _ = planted
    modules = [] if "--kernel-module" in args else ["--kernel-module", "ops.py"]
    provider = [] if "--provider" in args else ["--provider", "torch"]
    out = CliRunner().invoke(main, ["find", *args[:2], "HEAD~1", "HEAD", *args[2:], "--device", "cpu", *modules,
                                    *provider, "--repo", str(repo)])
    assert out.exit_code == 2, out.output
    assert out.stderr.strip().count("\n") == 0 and words in out.stderr, out.stderr
    assert "find: run" not in out.stderr


# -- the bisection rule ---------------------------------------------------------------------------

def fake(times, noise=(1.0, 1.01, 0.99)):
    """sample(i): the i-th commit's time, times a cycle of small run-to-run factors."""
    calls = []

    def sample(i):
        calls.append(i)
        return times[i] * noise[calls.count(i) % len(noise)]

    return sample, calls


def subject(i):
    return f"subject {i}"


@pytest.mark.parametrize("times, first_bad", [
    ([1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0], 3),
    ([1.0, 2.0], 1),
    ([1.0, 1.02, 0.98, 1.01, 1.0, 0.99, 1.03, 1.0, 1.5], 8),  # noise stays on the good side
    ([2.0, 2.0, 1.0, 1.0, 1.0], 2),  # an improvement is found the same way
])
def test_bisect_finds_the_step(times, first_bad):
    sample, calls = fake(times)
    found = find.bisect([f"c{i}" for i in range(len(times))], sample, subject, samples=3)
    assert found.first_bad == first_bad and found.p < find.ALPHA
    assert len(set(calls)) <= 2 + max(1, (len(times) - 1).bit_length())
    assert all(calls.count(i) == 3 for i in set(calls))  # three runs at every commit measured
    assert calls[:6] == [0, len(times) - 1] * 3  # GOOD's and BAD's runs interleaved


def test_bisect_does_not_name_a_commit_for_noise():
    # BAD 8% over GOOD on average, but runs of one commit spread over 20%: not significant
    sample, calls = fake([1.0, 1.5, 1.08], noise=(1.0, 1.2, 0.9))
    found = find.bisect(["a", "b", "c"], sample, subject, samples=3)
    assert found.first_bad is None and found.p >= find.ALPHA
    assert sorted(set(calls)) == [0, 2]  # nothing bisected
    lines = find.report(["a", "b", "c"], found, "table")
    assert lines[-1].startswith("not significant: BAD") and "nothing to bisect" in lines[-1]


def test_bisect_does_not_name_a_commit_for_a_change_under_min_change():
    # steady runs, 2% apart: significant to the t-test, too small to be what find looks for
    sample, _ = fake([1.0, 1.5, 1.02], noise=(1.0, 1.001, 0.999))
    assert find.bisect(["a", "b", "c"], sample, subject).first_bad is None


def test_report_names_the_first_bad_commit():
    seen = {0: Point("a" * 40, "start", [1.0, 1.0]), 2: Point("b" * 40, "slow", [2.0, 2.0]),
            3: Point("c" * 40, "end", [2.0, 2.0])}
    lines = find.report(["a" * 40, "x" * 40, "b" * 40, "c" * 40], find.Found(2, seen, 1e-6), "table")
    assert lines[-1].startswith("first bad commit: " + "b" * 40 + " 'slow': 2 ms, against 1 ms")
    assert "+100.0%" in lines[-1]


# -- shapes named on the command line (find's SHAPE, and a run --shape option) ------------------

def test_restrict_keeps_grid_shapes_and_takes_new_ones():
    from kcollect.registry import builtin_spec
    from kcollect.shapes import restrict

    spec = builtin_spec("swiglu")
    known = spec.grid("quick")[0]
    got = restrict(spec, [known.label, "M=3,N=5", known.label])
    assert set(got.grids) == set(spec.grids)
    for shapes in got.grids.values():
        assert [s.label for s in shapes] == [known.label, "M=3,N=5"]
        assert shapes[0].why == known.why and shapes[1].why == "named on the command line"
    assert spec.grid("quick")[0] is known  # the registry's spec is left as it was


@pytest.mark.parametrize("label, words", [
    ("M=3", "swiglu has no dimensions M; valid: M,N"),
    ("M=3,K=4", "has no dimensions M,K"),
    ("M=3,,N=4", "is not NAME=VALUE"),
    ("M=3,M=4", "is not NAME=VALUE"),
    ("M=abc,N=5", "M must be an integer \\(as in every swiglu shape\\), got 'abc'"),
    ("M=3,N=2.5", "N must be an integer"),
    ("M=0,N=5", "M must be at least 1 \\(as in every swiglu shape\\), got 0"),
    ("M=-3,N=5", "M must be at least 1"),
])
def test_restrict_refuses_labels_the_kernel_cannot_take(label, words):
    from kcollect.registry import builtin_spec
    from kcollect.shapes import ShapeError, restrict

    with pytest.raises(ShapeError, match=words):
        restrict(builtin_spec("swiglu"), [label])


def test_a_new_shape_must_pass_the_kernels_own_check():
    from dataclasses import replace

    from kcollect.registry import builtin_spec
    from kcollect.shapes import ShapeError, restrict

    spec = replace(builtin_spec("swiglu"), check_shape=lambda dims: "N must be even" if dims["N"] % 2 else None)
    assert restrict(spec, ["M=3,N=6"]).grid("full")[0].dims == {"M": 3, "N": 6}
    with pytest.raises(ShapeError, match="cannot take M=3,N=5: N must be even"):
        restrict(spec, ["M=3,N=5"])
