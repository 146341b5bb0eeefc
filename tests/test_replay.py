"""The committed history replayed as the CI gate meets it: every pair of consecutive commits measured
on one GPU, compared. No pair may fail because of a provider whose code did not change, and every line
that fails must be a kernel of ours whose code the pair changed (git says so independently here)."""
import subprocess
from pathlib import Path

import pytest

import site_store
from kcollect import regress
from kcollect.compare import Sides, code_changes, noise_before
from kcollect.store import Store
from kcollect.verdicts import compare

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "data" / "runs"
# ops whose kernels import another op's (add_rms_norm runs rms_norm's kernels)
USES = {"add_rms_norm": "rms_norm", "fused_linear_cross_entropy": "cross_entropy", "geglu": "gelu"}


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    if not RUNS.is_dir():
        pytest.skip("no committed history in data/runs")
    # imported once per process for this module, test_site's and the browser's
    with Store(site_store.history_store(tmp_path_factory.mktemp("replay") / "k.duckdb"), read_only=True) as store:
        rows = store.query(regress.QUERY)
    assert rows
    commits = {r["git_commit"] for r in rows}
    if any(git("cat-file", "-e", f"{c}^{{commit}}").returncode for c in commits):
        pytest.skip("the history's commits are not in this clone (shallow?)")
    return rows, regress.analyse(rows)


def pairs(rows):
    """(gpu, machine, commit A, commit B) for consecutive commits measured on one GPU and machine."""
    order = {}
    for r in rows:
        where = (regress.device(r), r.get("machine"))
        order.setdefault(where, {})[r["git_commit"]] = r["commit_time"]
    for where, commits in order.items():
        ordered = sorted(commits, key=commits.get)
        yield from ((*where, a, b) for a, b in zip(ordered, ordered[1:]))


def test_replayed_history_fails_only_on_changes_of_our_code(history, monkeypatch):
    rows, analysed = history
    monkeypatch.chdir(ROOT)  # compare asks git of the checkout it runs in
    failing = {}
    by_run = {}
    for r in rows:
        by_run.setdefault((r["git_commit"], regress.device(r), r.get("machine")), []).append(r)
    for gpu, machine, a, b in pairs(rows):
        side = [by_run[(c, gpu, machine)] for c in (a, b)]
        s = Sides(side[0], side[1], a[:8], b[:8], (a, b), [])
        changed, _ = code_changes(s, "commits")
        lines = compare(s.a_rows, s.b_rows, regress.DEFAULT_THRESHOLD, True, noise_before(analysed, {a, b}),
                        changed).lines
        gating = [ln for ln in lines if ln.gates]
        assert all(ln.key[2] in regress.OURS for ln in gating), (a, b, [ln.key for ln in gating])
        diff = git("diff", "--name-only", a, b, "--", "kernels").stdout.split()
        for ln in gating:
            kernel = ln.key[0]
            touched = [p for p in diff if kernel in p or USES.get(kernel, "@") in p or "/_" in p]
            assert touched, f"{a[:8]} -> {b[:8]} fails {ln.key}, but git shows no change of its code"
        if gating:
            failing[(a[:8], b[:8])] = sorted({ln.key[0] for ln in gating})
    assert len(list(pairs(rows))) >= 39  # the 46 H200 runs of the evaluation, and whatever came since
    # the example of a false alarm (add_rms_norm fwd compile 1x4096 +10.8%) passes
    assert ("9870fff5", "9a31f4a5") not in failing
    assert len(failing) <= 5, failing  # 17 pairs failed with the p20-p80 rule


def test_recovered_regressions_are_not_open(history):
    _, analysed = history
    for key, r in analysed.items():
        for f in r.flags:
            if f.kind == "regression" and f.status == "open":
                # an open regression is one the series still stands on: no later level back near the old one
                later = [p.median_ms for p in r.points[f.index:]]
                assert sorted(later)[len(later) // 2] > f.before_ms * (1 + regress.DEFAULT_THRESHOLD / 2), (key, f)
