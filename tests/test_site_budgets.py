"""The budgets page from a real DuckDB store with planted backbone rows: which run is latest, what
fits which budget with how much headroom, failed rows without times, the trend, CPU rows left out,
p99 once the store has it, escaping. Rendered through the site's own writer, as build-site wires it."""
from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

import site_store
from kcollect import site, site_budgets, site_data
from kcollect.store import Run, Store

H100_LABEL = site_store.H100.gpu_name
MAMBA = {"net": "mamba", "B": 1, "T": 60, "H": 512, "L": 4, "stream": 0}
ATTN = {"net": "attention", "B": 32, "T": 60, "H": 512, "L": 4, "stream": 0}
LSTM = {"net": "lstm", "B": 1, "T": 60, "H": 256, "L": 2, "stream": 1}
# p80 times in ms on the H100's last commit: mamba kcollect fits both budgets, eager fits 60 FPS only;
# attention eager fits neither; the compile rows fail the gate or error
P80 = {("mamba", "kcollect"): 4.0, ("mamba", "eager"): 12.0, ("attention", "kcollect"): 9.0,
       ("attention", "eager"): 20.0, ("lstm", "kcollect"): 0.5, ("lstm", "eager"): 0.75, ("lstm", "compile"): 0.6}
FAILED_MS = 0.0123456  # left on the failed row: it must never reach the page
COMMITS = 5


def _label(dims):
    return ",".join(f"{k}={v}" for k, v in dims.items())


def _row(run_id, dims, provider, p80, seq, status="ok", error=None):
    ok = status == "ok"
    return dict(run_id=run_id, kernel="backbone", mode="fwd", provider=provider, shape=_label(dims),
                dims=json.dumps(dims), dtype="bfloat16", baseline="eager", bound="compute", status=status,
                error=error, rel_err=5e-3 if ok else None, tolerance=2e-2, timing="cuda-graph" if ok else None,
                median_ms=p80 * 0.9 if p80 else None, p20_ms=p80 * 0.85 if p80 else None, p80_ms=p80,
                mean_ms=p80, std_ms=0.01, min_ms=p80 * 0.8 if p80 else None, reps=50, peak_mem_bytes=None,
                bytes=10**6, flops=1e9, seq=seq)


def _rows(run_id, commit, scale):
    """The H100's times fall 10% a commit to P80 at the last one; `scale` for the other devices."""
    late = (1.1 ** (COMMITS - 1 - commit)) * scale
    rows = []
    for dims in (MAMBA, ATTN, LSTM):
        for provider in ("kcollect", "eager", "compile"):
            p80 = P80.get((dims["net"], provider))
            if p80 is not None:
                rows.append(_row(run_id, dims, provider, p80 * late, len(rows)))
            elif dims is MAMBA:
                rows.append(_row(run_id, dims, provider, FAILED_MS, len(rows), "failed",
                                 "relative error 0.05 over the tolerance 0.02"))
            else:
                rows.append(_row(run_id, dims, provider, None, len(rows), "error", "OutOfMemoryError: boom"))
    other = _row(run_id, MAMBA, "kcollect", 99.0, len(rows))
    return rows + [{**other, "kernel": "not_backbone"}]


def write_store(path: Path) -> Path:
    plans = [(site_store.H100, range(COMMITS), 1.0), (site_store.H200, range(COMMITS - 2, COMMITS), 0.7),
             (site_store.CPU, range(2), 300.0)]
    with Store(path) as store:
        for env, commits, scale in plans:
            store.add_environment(env)
            for c in commits:
                _add_run(store, env, c, lambda run_id: _rows(run_id, c, scale))
    return path


def _add_run(store: Store, env, commit: int, rows) -> str:
    """A finished run of `env` at commit index `commit`, with rows(run_id) as its results."""
    run_id = f"{env.env_id}-bb-{commit:03d}".ljust(36, "0")
    started = site_store.T0 + timedelta(days=commit, hours=1)
    store.start_run(Run(run_id=run_id, env_id=env.env_id, started_at=started, finished_at=None, status="unfinished",
                        git_commit=site_store.sha(commit), commit_time=site_store.T0 + timedelta(days=commit),
                        git_dirty=False, grid="full", copy_gbps=3000.0, matmul_tflops=700.0, config="{}"))
    store.add_results(rows(run_id))
    store.finish_run(run_id, "finished", started + timedelta(minutes=5))
    return run_id


def build(db: Path, out: Path) -> str:
    """build-site as the command runs it (no history folder, no git), then the budgets page."""
    site.build_site(db, out)
    return (out / "budgets.html").read_text()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return write_store(tmp_path_factory.mktemp("budgets") / "k.duckdb")


@pytest.fixture(scope="module")
def html(store, tmp_path_factory) -> str:
    return build(store, tmp_path_factory.mktemp("site"))


def test_latest_run_per_gpu_and_trends(store):
    with Store(store, read_only=True) as s:
        data = site_budgets.load(s)
    assert data.tail == "p80_ms" and data.cpu_rows == 2 * 9
    h100 = "cuda:" + H100_LABEL
    assert set(data.latest) == {h100, "cuda:" + site_store.H200.gpu_name}  # the CPU interpreter left out
    assert [u["commit"] for u in data.runs[h100]] == [site_store.sha(COMMITS - 1)]
    assert {r["kernel"] if "kernel" in r else "backbone" for r in data.latest[h100]} == {"backbone"}
    assert len(data.latest[h100]) == 9
    trend = data.trends[(h100, _label(MAMBA), "bfloat16", "kcollect")]
    assert len(trend) == COMMITS and trend[-1] == pytest.approx(4.0) and trend[0] == pytest.approx(4.0 * 1.1 ** 4)
    assert (h100, _label(MAMBA), "bfloat16", "compile") not in data.trends  # failed rows make no trend


def test_fit_and_headroom_against_each_budget():
    sixty, onetwenty = site_budgets.fit(12.0)
    assert sixty["ok"] and sixty["room_ms"] == pytest.approx(1000 / 60 - 12)
    assert sixty["badge"] == "72% of the frame" and sixty["text"] == "4.67 ms left for the rest of the frame (28%)"
    assert not onetwenty["ok"] and onetwenty["badge"] == "1.4× the frame" and "3.67 ms over (1.4× the budget)" in onetwenty["text"]
    assert site_budgets.fit(0.05)[0]["badge"] == "<1% of the frame"  # a small backbone: the badge says how small
    assert all(f["ok"] for f in site_budgets.fit(1000 / 120))  # exactly at the budget fits


def test_page_model_picks_the_fastest_passing_provider(store):
    with Store(store, read_only=True) as s:
        data, groups = site_budgets.load(s), site_data.load(s).groups
    model = site_budgets.page(data, groups)
    assert [g.label for g in model["gpus"]] == [H100_LABEL, site_store.H200.gpu_name]
    h100 = model["sections"][0]
    assert h100["providers"] == ["kcollect", "eager", "compile"]
    assert [r["net"] for r in h100["rows"]] == ["lstm", "attention", "mamba"]  # net order, then H, B
    mamba = next(r for r in h100["rows"] if r["net"] == "mamba")
    assert mamba["best"] == "kcollect" and not mamba["cells"]["compile"]["ok"]
    assert "median" not in mamba["cells"]["compile"] and "tail" not in mamba["cells"]["compile"]
    attention = next(line for line in model["glance"] if line["net"] == "attention")
    h200_id = model["gpus"][1].id
    assert attention["cells"][h200_id]["provider"] == "kcollect"
    assert attention["cells"][h200_id]["tail"] == pytest.approx(9.0 * 0.7)
    assert [f["ok"] for f in attention["cells"][h200_id]["fit"]] == [True, True]  # 6.3 ms on the H200


def test_page_says_what_fits_and_never_shows_a_failed_time(html):
    assert "0.0123" not in html and "0.0111" not in html  # the failed row's median and p80
    h100 = html[html.index(f'id="g-{site_data.slug(H100_LABEL, set())}"'):]
    mamba = re.search(r"<tr[^>]*><th>mamba</th>.*?</tr>", h100, re.S).group(0)
    assert ">4 ms<" in mamba and "12 ms" in mamba and "badge failed" in mamba and "relative error 0.05" in mamba
    assert ">72% of the frame</span> <span class=\"small\">4.67 ms left for the rest of the frame (28%)" in mamba  # eager, 60 FPS
    assert ">1.4× the frame</span> <span class=\"small\">3.67 ms over (1.4× the budget)" in mamba  # eager at 120 FPS
    assert mamba.count('<abbr class="q older"') == 2  # each time names its quantile: p80 on these older rows
    attention = re.search(r"<tr[^>]*><th>attention</th>.*?</tr>", h100, re.S).group(0)
    # eager is over both budgets, kcollect (9 ms) over 120 FPS's alone
    assert "OutOfMemoryError" in attention and attention.count('class="badge failed" title="over') == 3
    assert 'class="spark"' in mamba and "5 commits: 5.86 → 4 ms" in mamba


def test_budget_toggle_shows_sixty_by_default(html):
    assert 'name="fps" value="60" checked' in html and 'name="fps" value="120"' in html
    spans = re.findall(r'<span class="fit" data-fps="(\d+)"( hidden)?>', html)
    assert spans and all((fps == "60") == (not hidden) for fps, hidden in spans)
    assert "16.67 ms" in html and "8.33 ms" in html


def test_page_names_its_quantile_and_leaves_the_cpu_out(html):
    assert "before kcollect kept p99" in html and "<strong>p80</strong>" in html and "These rows were measured" in html
    assert "18 rows from the CPU interpreter" in html
    assert "CPU (Triton interpreter)</th>" not in html  # no CPU column in the glance table
    for ref in re.findall(r'(?:src|href)="([^"]*)"', html):
        assert not re.match(r"^(https?:|//|/)", ref), ref


def test_p99_is_judged_where_a_row_has_it_and_p80_is_marked_where_not(store, tmp_path):
    # rows measured since schema 4 carry p99; the H200's here, the H100's are older (p80 only)
    db = tmp_path / "p99.duckdb"
    db.write_bytes(store.read_bytes())
    con = duckdb.connect(str(db))
    con.execute("UPDATE results SET p99_ms = p80_ms * 4 WHERE run_id IN (SELECT run_id FROM runs WHERE env_id = ?)",
                [site_store.H200.env_id])
    con.close()
    with Store(db, read_only=True) as s:
        data = site_budgets.load(s)
    assert data.tail == "p99_ms"
    cells = {(g, r["shape"], r["provider"]): (r["tail_q"], r["tail_ms"]) for g, rows in data.latest.items()
             for r in rows if r["status"] == "ok"}
    h100 = next(g for g in data.latest if H100_LABEL in g)
    h200 = next(g for g in data.latest if g != h100)
    assert cells[(h100, _label(MAMBA), "kcollect")] == ("p80", pytest.approx(4.0))
    assert cells[(h200, _label(MAMBA), "kcollect")] == ("p99", pytest.approx(4.0 * 0.7 * 4))
    page = build(db, tmp_path / "site")
    assert "Rows are judged on p99 where they have it" in page
    assert re.search(r'>p99</abbr> <span class="x best">11.2 ms</span>', page)  # the H200's mamba kcollect p99
    assert re.search(r'<abbr class="q older"[^>]*>p80</abbr> <span class="x best">4 ms</span>', page)  # the H100's, marked
    # the sparkline stays on the p80 of every commit: no jump where p99 begins
    assert data.trends[(h200, _label(MAMBA), "bfloat16", "kcollect")][-1] == pytest.approx(4.0 * 0.7)


def test_hostile_names_are_escaped_and_an_empty_store_says_so(tmp_path):
    db = write_store(tmp_path / "k.duckdb")
    con = duckdb.connect(str(db))
    con.execute("UPDATE results SET provider = '<script>alert(1)</script>' WHERE provider = 'compile'")
    con.close()
    page = build(db, tmp_path / "site")
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    con = duckdb.connect(str(db))
    con.execute("DELETE FROM results WHERE kernel = 'backbone'")
    con.close()
    assert "No GPU run of the backbone benchmark yet" in build(db, tmp_path / "site2")


def test_a_run_of_part_of_the_grid_hides_none_of_the_rest(tmp_path):
    # a later H100 run of the streamed LSTM configuration alone (kcollect run backbone --where
    # stream=1): its row is the newest; mamba's and attention's stay, from the run before, and the
    # page names both runs
    db = write_store(tmp_path / "k.duckdb")
    late = COMMITS + 1
    with Store(db) as store:
        _add_run(store, site_store.H100, late, lambda run_id: [_row(run_id, LSTM, p, 0.25, i)
                                                               for i, p in enumerate(("kcollect", "eager"))])
    with Store(db, read_only=True) as s:
        data = site_budgets.load(s)
    h100 = "cuda:" + H100_LABEL
    by_shape = {}
    for r in data.latest[h100]:
        by_shape.setdefault(r["shape"], set()).add(r["commit"])
    assert by_shape == {_label(LSTM): {site_store.sha(late)}, _label(MAMBA): {site_store.sha(COMMITS - 1)},
                        _label(ATTN): {site_store.sha(COMMITS - 1)}}
    assert [u["commit"] for u in data.runs[h100]] == [site_store.sha(late), site_store.sha(COMMITS - 1)]
    html = build(db, tmp_path / "site")
    section = html.split('id="g-')[1]
    assert "from the latest backbone run that measured it" in section
    assert site_store.sha(late)[:8] in section and site_store.sha(COMMITS - 1)[:8] in section
