"""The committed history (data/runs) replayed through the one verdict engine: the gate on every pair
of runs of one commit (A/A), on every commit against the one before, on the issue's named pairs, and
the site's flags against compare's verdicts for the same commits."""
import itertools
from pathlib import Path

import pytest

import site_store
from kcollect import codechange, regress, site_data, site_flags
from kcollect.compare import History, Sides, compare_sides, resolve_commit
from kcollect.series import commit_rank
from kcollect.store import Store
from kcollect.verdicts import CHANGED

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "data" / "runs"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    if not RUNS.is_dir():
        pytest.skip("no committed history in data/runs")
    # imported once per process for this module, test_site's and the browser's
    db = site_store.history_store(tmp_path_factory.mktemp("replay") / "k.duckdb")
    with Store(db, read_only=True) as store:
        rows = store.query(regress.QUERY)
        data = site_data.load(store)
    if site_store.commits_missing(r["git_commit"] for r in rows):
        pytest.skip("the history's commits are not in this clone (shallow?)")
    repo = codechange.Repo(ROOT)
    analysed = regress.analyse(rows, code=repo)
    return rows, History(rows, analysed, commit_rank(r.points for r in analysed.values()), repo), data


def on(rows, commit, gpu):
    return [r for r in rows if r["git_commit"] == commit and regress.device(r) == gpu]


def gate(h, rows, a, b, gpu, monkeypatch):
    monkeypatch.chdir(ROOT)  # git of the checkout compare runs in
    known = {r["git_commit"]: r["commit_time"] for r in rows}
    ca, cb = resolve_commit(a, known)[0], resolve_commit(b, known)[0]
    return compare_sides(Sides(on(rows, ca, gpu), on(rows, cb, gpu), ca[:8], cb[:8], (ca, cb), []), h, "commits",
                         regress.DEFAULT_THRESHOLD)


def test_reruns_of_one_commit_compared_as_if_our_code_changed_rarely_fail(history):
    rows, h, _ = history
    by_run: dict[str, list[dict]] = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append(r)
    runs: dict[tuple, list] = {}
    for rid, rr in by_run.items():
        runs.setdefault((regress.device(rr[0]), rr[0]["git_commit"]), []).append((rr[0]["started_at"], rid))
    pairs, failing = 0, []
    for (gpu, commit), ids in runs.items():
        for (_, a), (_, b) in itertools.combinations(sorted(ids), 2):
            cmp = compare_sides(Sides(by_run[a], by_run[b], a, b, (commit, commit), []), h, "runs",
                                regress.DEFAULT_THRESHOLD, force_code=CHANGED)
            if any(ln.a.point and ln.b.point for ln in cmp.lines):
                pairs += 1
                failing += [(gpu, commit[:8], a[:8], b[:8])] if any(ln.gates for ln in cmp.lines) else []
    assert pairs >= 59  # every pair of runs of one commit in the history (52 on the H100, 7 on the H200)
    assert len(failing) <= pairs / 50, failing  # the bar: at most one comparison in 50


def test_replayed_history_fails_only_on_changes_of_our_code(history, monkeypatch):
    rows, h, _ = history
    for gpu in (H100, H200):
        commits = sorted({r["git_commit"] for r in rows if regress.device(r) == gpu}, key=h.rank.get)
        for a, b in zip(commits, commits[1:]):
            for ln in gate(h, rows, a, b, gpu, monkeypatch).lines:
                if ln.gates:
                    assert ln.ours and ln.code == CHANGED, (a, b, ln)
                    before = ln.a.commit or a
                    assert h.repo.status(ln.key[0], before, b) == CHANGED  # git agrees, independently


def test_the_swiglu_regression_at_fea1ddc4_is_caught(history, monkeypatch):
    # the H200 commit before fea1ddc4 measured layer_norm and softmax only: swiglu is compared with
    # the last commit that measured it
    rows, h, _ = history
    cmp = gate(h, rows, "d948912c", "fea1ddc4", H200, monkeypatch)
    caught = {(ln.key[1], ln.key[3]): ln for ln in cmp.lines if ln.gates and ln.key[0] == "swiglu"}
    assert ("bwd", "M=16384,N=14336") in caught, sorted(caught)
    line = caught[("bwd", "M=16384,N=14336")]
    assert line.change == pytest.approx(0.11, abs=0.01) and "the last commit that measured it" in line.note


@pytest.mark.parametrize("gpu, a, b", [(H100, "0d6a1bbf", "f2cc07b"), (H200, "c5778478", "291df4e5")])
def test_the_input_generation_pairs_do_not_fail(history, monkeypatch, gpu, a, b):
    rows, h, _ = history
    cmp = gate(h, rows, a, b, gpu, monkeypatch)
    assert not [ln for ln in cmp.lines if ln.gates]
    # between the two commits only the kernels' inputs changed (series last measured earlier may
    # have seen their code change since)
    assert {ln.code for ln in cmp.lines if ln.ours and ln.a.commit.startswith(a)} == {"method"}


def test_the_backbones_own_provider_gates(history):
    _, h, _ = history
    ours = [r for k, r in h.analysed.items() if k.kernel == "backbone" and k.provider == "kcollect"]
    assert ours and all(r.ours for r in ours)
    judged = [ln for r in ours for ln in r.lines if ln is not None and ln.code == CHANGED and ln.p is not None]
    assert judged and any(ln.verdict in ("regression", "improvement") for ln in judged)


def test_the_site_and_compare_show_the_same_regressions_for_the_same_commits(history, monkeypatch):
    rows, h, data = history
    monkeypatch.chdir(ROOT)
    site = site_flags.analyse(data, git_root=ROOT)
    commits = {(g.key, i): c["sha"] for g in data.groups for i, c in enumerate(g.commits)}
    on_site = {(f["gkey"][5:], f["kernel"], f["mode"], f["provider"], f["shape"], f["dtype"],
                commits[(f["gkey"], f["after_ci"])]) for f in site.flags if f["ours"] and f["kind"] == "regression"}
    in_compare = set()
    for gpu in (H100, H200):
        order = sorted({r["git_commit"] for r in rows if regress.device(r) == gpu}, key=h.rank.get)
        for a, b in zip(order, order[1:]):
            for ln in gate(h, rows, a, b, gpu, monkeypatch).lines:
                if ln.gates and ln.verdict == "regression":
                    in_compare.add((gpu, *ln.key[:3], ln.key[3], ln.key[4], b))
    in_compare = {(g, k, m, p, s, d, c) for g, k, m, p, s, d, c in in_compare}
    assert on_site == in_compare
    assert in_compare  # the history has some (the swiglu and geglu +11% at fea1ddc4 among them)
