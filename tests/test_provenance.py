"""Which code a run measured. kcollect installed from one commit (not editable: a copy in a folder of
its own, as pip installs it) and run from a checkout at a newer commit of the same repository would
key its rows to code that never ran: refused, unless --commit says which commit to key them by. A
run records the installed kcollect's version and the commit it was built from, with the dirty state."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kcollect.store import Store

ROOT = Path(__file__).resolve().parent.parent
PLANTED = str(Path(__file__).resolve().parent / "planted_kernels.py")
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
RUN = ["run", "doubled", "--kernel-module", PLANTED, "--device", "cpu", "--mode", "fwd", "--provider", "torch",
       "--dtype", "float32", "--rep-ms", "1", "--warmup-ms", "0", "--min-reps", "2"]


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def pip_install(src: Path, target: Path) -> None:
    """`pip install --target` of the tree (no dependencies: they are this venv's): with the build
    tools installed here first (offline), else in pip's own build environment."""
    base = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", "--target",
            str(target)]
    for extra in (["--no-build-isolation"], []):
        out = subprocess.run(base + extra + [str(src)], capture_output=True, text=True, timeout=600)
        if out.returncode == 0:
            return
        shutil.rmtree(target, ignore_errors=True)
    pytest.fail(f"pip could not install the copy: {out.stderr[-2000:]}")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A repository holding this checkout's files (as they are, committed: commit A), kcollect
    installed from it into a folder of its own, then a newer commit B that changes a note.
    -> dict(src, a, b, env): env runs the installed copy."""
    tmp = tmp_path_factory.mktemp("provenance")
    src = tmp / "src"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True, text=True).stdout.split("\n")
    for name in filter(None, listed):
        if name.startswith("data/") or not (ROOT / name).is_file():
            continue
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    git(src, "init", "-q")
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "the installed code")
    a = git(src, "rev-parse", "HEAD")
    site = tmp / "site-packages"
    pip_install(src, site)
    (src / "NOTES").write_text("a newer commit\n")
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "newer")
    b = git(src, "rev-parse", "HEAD")
    env = {**os.environ, "PYTHONPATH": str(site)}
    return {"src": src, "a": a, "b": b, "env": env, "tmp": tmp}


def kc(*args, cwd, env):
    return subprocess.run([sys.executable, "-m", "kcollect.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_installed_copy_runs_not_the_checkout(installed):
    out = subprocess.run([sys.executable, "-c", "import kcollect; print(kcollect.__file__)"], env=installed["env"],
                         capture_output=True, text=True)
    assert out.stdout.startswith(str(installed["tmp"] / "site-packages")), out.stdout + out.stderr


def test_a_run_from_a_newer_checkout_is_refused_unless_commit_says_so(installed):
    src, a, b, env = installed["src"], installed["a"], installed["b"], installed["env"]
    db = installed["tmp"] / "refused.duckdb"
    out = kc(*RUN, "--db", str(db), cwd=src, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("kcollect: error: ")
    assert f"was built from {a[:12]}" in out.stderr and f"is at {b[:12]}" in out.stderr
    assert "code that did not run" in out.stderr and not db.exists()

    # --commit says which commit the rows are keyed by: a warning, and the run records both commits
    db = installed["tmp"] / "keyed.duckdb"
    out = kc(*RUN, "--db", str(db), "--commit", b, cwd=src, env=env)
    assert out.returncode == 0, out.stderr
    assert f"kcollect: warning: the kcollect that runs here (version 0.1.0) was built from {a[:12]}, not {b[:12]}" \
        in out.stderr
    with Store(db, read_only=True) as s:
        (run,) = s.query("SELECT git_commit, kcollect_commit, kcollect_version FROM runs")
    assert run == {"git_commit": b, "kcollect_commit": a, "kcollect_version": "0.1.0"}


def test_a_run_from_the_installed_commit_records_its_dirty_state(installed):
    src, a, env = installed["src"], installed["a"], installed["env"]
    tree = installed["tmp"] / "at-a"
    git(src, "worktree", "add", "-q", "--detach", str(tree), a)
    db = installed["tmp"] / "at-a.duckdb"
    out = kc(*RUN, "--db", str(db), cwd=tree, env=env)
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr, out.stderr
    with Store(db, read_only=True) as s:
        (run,) = s.query("SELECT git_commit, git_dirty, kcollect_commit FROM runs")
    # the build's state (committed, clean), not unknown
    assert run == {"git_commit": a, "git_dirty": False, "kcollect_commit": a}


def test_a_checkout_of_another_repository_or_unknown_code_keeps_its_own_commit(tmp_path):
    # a user's own kernels in a repository of theirs: git there does not know kcollect's commit, so
    # the run is keyed by theirs (kcollect's own identity recorded beside it); and where kcollect
    # cannot say what it was built from, the checkout's commit and dirty state stand
    from kcollect.environment import Code, Commit, key_commit

    git(tmp_path, "init", "-q")
    found = Commit(sha="a" * 40, dirty=True)
    for code in (Code("0.1.0", "b" * 40, False), Code("0.1.0", None, None)):
        keyed, warning = key_commit(found, code, None, tmp_path)
        assert (keyed.sha, keyed.dirty, keyed.kcollect_version, keyed.kcollect_commit, warning) == (
            "a" * 40, True, "0.1.0", code.commit, None)
