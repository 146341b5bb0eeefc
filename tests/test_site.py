"""kcollect build-site: the output folder, what the pages say, escaping, CPU/GPU separation, failed
and unstable rows, the regression analysis (states, changes of conditions), the page data as JSON,
and the committed history. Browser behaviour is in test_site_browser.py."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from statistics import median

import duckdb
import pytest
from click.testing import CliRunner

import site_store
from kcollect import charts, regress, site_data, site_flags
from kcollect.cli import main
from kcollect.history import export_runs
from kcollect.site import MARKER, SiteError, build_site, plotly_js
from kcollect.store import Store

H100 = "nvidia-h100-80gb-hbm3"
PAGES = ("index.html", "kernels/alpha.html", "kernels/beta.html", "regressions.html", "compare.html",
         "experiments.html", "environments.html", "imports.html", "budgets.html")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("site")
    db = site_store.build_store(tmp / "k.duckdb")
    build_site(db, tmp / "site", problems=[("20260301T120000-nvidia-h100-deadbeef", "results.parquet is truncated")])
    return tmp / "site"


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> site_data.SiteData:
    db = site_store.build_store(tmp_path_factory.mktemp("an") / "k.duckdb")
    with Store(db, read_only=True) as store:
        data = site_data.load(store)
    return data, site_flags.analyse(data)


def read(site: Path, rel: str) -> str:
    return (site / rel).read_text()


def section(html: str, group_id: str) -> str:
    """The HTML of one device section of a page."""
    start = html.index(f'data-gpu="{group_id}" id="g-{group_id}"')
    end = html.find('<section class="group', start)
    return html[start:end if end >= 0 else len(html)]


def rows_of(html: str) -> list[str]:
    table = html[html.index('<table class="flags-table'):]
    return re.findall(r'<tr data-f[^>]*data-kind=.*?</tr>', table[:table.index("</table>")], re.S)


# -- the output --------------------------------------------------------------------------------


def test_every_page_its_json_and_the_assets_are_written(built):
    for rel in (*PAGES, "assets/style.css", "assets/site.js", MARKER, ".nojekyll"):
        assert (built / rel).is_file(), rel
    for rel in PAGES:  # every page's data, as JSON, linked from the page
        data = json.loads(read(built, "json/" + rel.replace(".html", ".json")))
        assert data is not None
        assert f'json/{rel.replace(".html", ".json")}"' in read(built, rel)
    # plotly.js is the package's own file, copied once, and every page loads assets locally.
    assert (built / "assets/plotly.min.js").read_bytes() == plotly_js().read_bytes()
    assert len(list(built.rglob("plotly*.js"))) == 1
    for page in built.rglob("*.html"):
        html = page.read_text()
        for tag in re.findall(r"<a [^>]*>|<(?:script|link) [^>]*>", html):
            ref = re.search(r'(?:src|href)="([^"]*)"', tag)
            if ref is None:
                continue
            if 'class="ext' in tag:  # a commit's page: the only links that leave the site
                assert ref.group(1).startswith(site_store.URL.split("/commit/")[0]), (page, tag)
            else:
                assert not re.match(r"^(https?:|//|/)", ref.group(1)), (page, tag)  # file:// and Pages


def test_internal_links_point_at_files(built):
    for page in built.rglob("*.html"):
        for ref in re.findall(r'(?:src|href)="([^"#]+)', page.read_text()):
            if not ref.startswith("https://"):
                assert (page.parent / ref).resolve().is_file(), (page.name, ref)


# -- the overview ------------------------------------------------------------------------------


def test_overview_shows_speedup_sol_and_latest_run(built):
    html = read(built, "index.html")
    h100 = section(html, H100)
    # triton is 2x torch on beta, and torch 12% slower since the torch upgrade: 2.24x
    assert re.search(r">2\.2[345]×<", h100)
    assert "Latest run <strong>2026-03-12 14:00</strong>" in h100  # the A/A rerun of commit 11, not the lab run
    assert site_store.sha(11)[:8] in h100 and "Commit number 11 of the test history" in h100
    assert "machine h100-a" in h100 and "machine (not recorded)" in section(html, "nvidia-h200")
    assert h100.count('class="spark"') > 0
    # a failed, an erroring and an unstable provider are marked
    assert "failed" in h100 and "error" in h100 and "1/4 unstable" in h100
    # liger is timed with events, torch with graphs: liger's speedup carries the mark
    liger = re.search(r'<td class="cell" data-f data-provider="liger".*?</td>', h100, re.S).group(0)
    assert 'class="mixed"' in liger


def test_overview_leads_with_the_open_regression_of_our_kernel(built):
    html = read(built, "index.html")
    box = html[html.index('class="open-box'):html.index('</section>', html.index('class="open-box'))]
    items = re.findall(r"<li .*?</li>", box, re.S)
    assert len(items) == 1  # the recovered regression is not open, the others are not ours
    assert "alpha" in items[0] and "+25." in items[0] and "Unroll alpha&#39;s inner loop twice" in items[0]
    assert re.search(r"\d+\.\d× its noise \(±0\.\d+%\)", items[0])
    assert re.search(r'href="regressions.html#flag=[0-9a-f]{10}"', items[0])
    assert re.search(r'<span class="count"[^>]*>1<', html)  # the nav badge counts open regressions of ours
    read_box = html[html.index('id="read"'):]
    for words in ("measured on the same run", "Over 100%", "not like for like", "unstable"):
        assert words in read_box


# -- kernel pages ------------------------------------------------------------------------------


def test_kernel_table_shows_config_memory_reps_and_tolerance(built):
    h100 = section(read(built, "kernels/alpha.html"), H100)
    row = re.search(r'<tr data-f data-provider="triton" class="ok first">.*?</tr>', h100, re.S).group(0)
    assert "block: BLOCK=1024 num_warps=4" in row  # the plan this number came from
    assert "MiB" in row and re.search(r'<td class="num">1\d\d</td>', row)  # peak memory, repetitions
    assert "/ 1.6e-02" in row  # the tolerance beside the error, not in a tooltip
    # the latency distribution of the timed calls on the p20-p80 cell
    spread = re.search(r'title="of 1\d\d timed calls: mean ([\d.]+), std [^,]+, min ([\d.]+), p99 ([\d.]+), '
                       r'max ([\d.]+) ms"', row)
    mean, low, p99, top = map(float, spread.groups())
    assert low < mean < p99 < top
    assert "<caption>" in h100 and 'scope="col"' in h100
    assert 'data-fig="s1p1-mem"' in read(built, "kernels/alpha.html")  # memory against shape beside time
    assert "tokens/s" not in h100  # alpha's rows carry no tokens


def test_kernel_table_shows_tokens_per_second_where_rows_have_tokens(built):
    beta = section(read(built, "kernels/beta.html"), H100)
    assert "tokens/s</abbr>" in beta
    row = re.search(r'<tr data-f data-provider="triton" class="ok first">.*?</tr>', beta, re.S).group(0)
    median = float(re.search(r'<td class="num" data-v="([\d.e-]+)">', row).group(1))
    shown = float(re.search(r'<td class="num" data-v="([\d.e+]+)">[\d.]+[kMG]</td>', row).group(1))
    assert shown == pytest.approx(1024 * 1e3 / median)  # M=1024 tokens over the median time


def test_failed_and_unstable_rows_never_show_a_speed(built):
    text = "".join(p.read_text() for p in built.rglob("*") if p.suffix in (".html", ".js", ".json"))
    assert "0.04242" not in text and "0.03131" not in text  # the times stored on those rows appear nowhere
    alpha = section(read(built, "kernels/alpha.html"), H100)
    row = re.search(r'<tr data-f data-provider="compile" class="failed[^"]*">.*?</tr>', alpha, re.S).group(0)
    assert "M=37,<wbr>N=1000" in row and 'badge failed' in row and "5.0e-02" in row
    assert "×" not in row and "GB/s" not in row  # no speedup, no rate
    err = re.search(r'<tr data-f data-provider="liger" class="error[^"]*">.*?</tr>', alpha, re.S).group(0)
    assert "OutOfMemoryError" in err and "×" not in err
    beta = section(read(built, "kernels/beta.html"), H100)
    unstable = re.search(r'<tr data-f data-provider="triton" class="unstable[^"]*">.*?</tr>', beta, re.S).group(0)
    assert "disturbed while timed" in unstable and "×" not in unstable


def test_cpu_rows_are_a_separate_group(built):
    overview = read(built, "index.html")
    cpu = section(overview, "cpu-interpreter")
    assert "CPU (Triton interpreter)" in cpu and "not GPU numbers" in cpu
    assert 'class="group cpu"' in overview
    for page in ("index.html", "kernels/alpha.html"):
        html = read(built, page)
        gpu_part = section(html, H100) + section(html, "nvidia-h200")
        assert "123.4" not in gpu_part and "61.7" not in gpu_part  # CPU times (CPU_MS / speed)
    assert "123.4" in section(read(built, "kernels/alpha.html"), "cpu-interpreter")
    # its trend data lives in files of its own
    cpu_files = list((built / "data").glob("*.cpu-interpreter.*.js"))
    assert cpu_files and all("123.4" in f.read_text() or "61.7" in f.read_text() for f in cpu_files)
    for f in (built / "data").glob("*.nvidia-*.js"):
        assert "123.4" not in f.read_text()


# -- regressions -------------------------------------------------------------------------------


def test_regressions_page_orders_open_recovered_improvements_then_conditions(built):
    html = read(built, "regressions.html")
    rows = rows_of(html)
    kinds = [re.search(r'data-kind="([^"]+)"', r).group(1) for r in rows]
    assert kinds == ["open", "recovered", "improvement"] + ["environment"] * 4 + ["method"], kinds
    opened, recovered, fix = rows[:3]
    assert 'data-kernel="alpha"' in opened and 'data-mode="fwd"' in opened and "+25.1%" in opened
    assert f'href="{site_store.URL}{site_store.sha(6)}"' in opened  # the commit, linked
    assert "Unroll alpha&#39;s inner loop twice" in opened and "Ada Lovelace" in opened
    assert f"/compare/{site_store.sha(5)}...{site_store.sha(6)}" in opened  # the range's diff
    assert "kernels/alpha.html#gpu=nvidia-h100-80gb-hbm3&amp;mode=fwd&amp;dtype=bfloat16&amp;shape=M%3D4096%2CN%3D14336" in opened
    assert re.search(r"\d+\.\d× <span class=\"small\">\(±0\.\d+%\)", opened)  # size against the series' noise
    assert 'data-mode="bwd"' in recovered and "recovered regression" in recovered
    assert re.search(r"back at <a [^>]*><code>" + site_store.sha(6)[:8], recovered)
    assert "undoes the regression at" in fix and site_store.sha(3)[:8] in fix
    method = rows[-1]
    assert 'data-provider="compile"' in method and "not a kernel change" in method and "cuda-events → cuda-graph" in method
    assert all("torch 2.11.0 → 2.12.0" in r and 'data-provider="torch"' in r for r in rows[3:-1])
    # the CPU series' 50% step is not analysed, the A/A rerun and the H200 raise nothing
    assert "cpu-interpreter" not in "".join(rows) and 'data-gpu="nvidia-h200"' not in "".join(rows)
    assert 'data-machine="h100-a"' in opened


def test_no_flag_spans_a_change_of_conditions(analysed):
    data, a = analysed
    keys = {(f["kernel"], f["mode"], f["provider"], f["shape"], f["dtype"]) for f in a.flags}
    assert keys == {site_store.STEP_SERIES[:5], site_store.RECOVERED[:5]}
    states = sorted((f["kind"], f["state"]) for f in a.flags)
    assert states == [("improvement", "held"), ("regression", "open"), ("regression", "recovered")]
    # the open regression stays open across the torch upgrade, which did not move our kernel
    opened = next(f for f in a.flags if f["state"] == "open")
    assert opened["values"][-1] > opened["before_ms"] * 1.2 and len(opened["values"]) == site_store.COMMITS
    method = [c for c in a.changes if c["kind"] == "method"]
    assert [(c["provider"], c["shape"], round(c["change"], 2)) for c in method] == [("compile", "M=1024,N=1024,K=1024", -0.38)]
    events = {(e["kind"], e["what"]) for e in a.events}
    assert ("environment", "torch 2.11.0 → 2.12.0, liger-kernel (none) → 0.6.1") in events


def test_the_adapter_shows_the_engines_flags(tmp_path):
    """The site's flags are regress.analyse's (the engine compare uses), mapped to the site's groups
    and commit indexes: every step of a GPU series that no change of conditions explains."""
    db = site_store.build_store(tmp_path / "k.duckdb")
    with Store(db, read_only=True) as store:
        data = site_data.load(store)
        rows = store.query(regress.QUERY)
    expected = {}
    for key, r in regress.analyse(rows).items():
        for f in r.flags:
            if key.gpu != "cpu" and not (f.cause or "").startswith(("environment", "method")):
                expected[(*key[:5], f.after_commit[:8])] = (f.kind, round(f.change, 9), f.noise_sigmas)
    mine = {(f["kernel"], f["mode"], f["provider"], f["shape"], f["dtype"],
             data.group(f["gkey"]).commits[f["after_ci"]]["short"]): (f["kind"], round(f["change"], 9), f["z"])
            for f in site_flags.analyse(data, git_root=None).flags}
    assert mine == expected and len(mine) >= 3


# -- other pages -------------------------------------------------------------------------------


def test_experiments_page_lists_lab_runs_and_keeps_them_out_of_the_rest(built, tmp_path):
    html = read(built, "experiments.html")
    assert "triton[default]" in html and "triton[wide]" in html and "does a wider block help alpha?" in html
    assert "1.25×" in html and "BLOCK=2048" in html  # against the default, with the config it forced
    for rel in ("index.html", "kernels/alpha.html", "regressions.html"):
        assert "triton[" not in read(built, rel)
    assert not any("triton[" in f.read_text() for f in (built / "data").iterdir())
    db = site_store.build_store(tmp_path / "k.duckdb", lab=False, cpu=False, second_gpu=False)
    empty = read(build_site(db, tmp_path / "site").out, "experiments.html")
    assert "No lab run in the store yet" in empty


def test_import_problems_page_names_the_folders(built, tmp_path):
    html = read(built, "imports.html")
    assert "20260301T120000-nvidia-h100-deadbeef" in html and "results.parquet is truncated" in html
    assert "Import problems (1)" in read(built, "index.html")
    db = site_store.build_store(tmp_path / "k.duckdb", cpu=False, second_gpu=False)
    assert "None: every run folder" in read(build_site(db, tmp_path / "site").out, "imports.html")


def test_environments_show_machines_and_peer_versions(built):
    html = read(built, "environments.html")
    assert "liger-kernel 0.6.1" in html and "h100-a" in html and "2.12.0" in html


def test_page_json_carries_the_data(built):
    reg = json.loads(read(built, "json/regressions.json"))
    assert reg["counts"]["open_ours"] == 1 and reg["rows"][0]["after"]["subject"] == site_store.subject(6)
    alpha = json.loads(read(built, "json/kernels/alpha.json"))
    rows = [r for s in alpha["sections"] for p in s["parts"] for r in p["rows"]]
    assert {r["status"] for r in rows} >= {"ok", "failed", "error"}
    assert all(r["median_ms"] is None and r["max_ms"] is None for r in rows if r["status"] != "ok")
    assert all(r["p99_ms"] > r["median_ms"] for r in rows if r["status"] == "ok")


# -- escaping, the output folder, the store ----------------------------------------------------


def test_hostile_names_are_escaped(tmp_path):
    evil = '<script>alert("k")</script>'
    kernels = {evil: dict(bound="memory", modes=("fwd",), dtypes=("bfloat16",),
                          shapes=("M=8,N=8",), providers=("triton", "torch", '"><img src=x onerror=alert(1)>'))}
    db = site_store.build_store(tmp_path / "k.duckdb", kernels=kernels, commits=2, cpu=False, second_gpu=False,
                                lab=False)
    with duckdb.connect(str(db)) as con:  # a commit URL that would run script, and a hostile subject
        con.execute("UPDATE runs SET commit_url = 'javascript:alert(1)', commit_subject = '<b>bold</b>'")
    result = build_site(db, tmp_path / "site")
    pages = list(result.out.rglob("*.html"))
    # the kernel page stays inside kernels/ under a safe name
    kpages = list((result.out / "kernels").iterdir())
    assert len(kpages) == 1 and re.fullmatch(r"[a-z0-9_-]+\.html", kpages[0].name)
    for page in pages:
        html = page.read_text()
        assert "<script>alert" not in html and "<img src=x" not in html and "javascript:" not in html, page
        assert "<b>bold" not in html, page
    assert "&lt;script&gt;alert(" in read(result.out, "index.html")


def test_rebuild_wipes_the_previous_output(tmp_path):
    db = site_store.build_store(tmp_path / "k.duckdb", cpu=False, second_gpu=False)
    out = tmp_path / "site"
    build_site(db, out)
    (out / "stale.html").write_text("old")
    (out / "kernels" / "gone.html").write_text("old")
    build_site(db, out)
    assert not (out / "stale.html").exists() and not (out / "kernels" / "gone.html").exists()
    assert (out / "index.html").is_file() and (out / MARKER).is_file()
    assert not list(tmp_path.glob(".site.*"))  # no staging folder left behind


def test_refuses_to_wipe_a_folder_it_did_not_write(tmp_path):
    db = site_store.build_store(tmp_path / "k.duckdb", cpu=False, second_gpu=False)
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    with pytest.raises(SiteError, match="refusing to wipe"):
        build_site(db, mine)
    assert (mine / "thesis.tex").read_text() == "precious"
    result = CliRunner().invoke(main, ["build-site", "--db", str(db), "--out", str(mine), "--data", ""])
    assert result.exit_code == 2
    assert result.output.strip().startswith("kcollect: error: refusing to wipe") and result.output.count("\n") == 1
    assert (mine / "thesis.tex").exists()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SiteError, match="not a folder"):
        build_site(db, tmp_path / "afile")
    empty = tmp_path / "empty"
    empty.mkdir()
    build_site(db, empty)  # an empty folder is fine
    assert (empty / "index.html").is_file()


@pytest.mark.parametrize("what", ["missing", "not duckdb", "foreign duckdb"])
def test_unreadable_store_exits_with_one_line(tmp_path, what):
    db = tmp_path / "k.duckdb"
    if what == "not duckdb":
        db.write_text("this is not a database\n" * 100)
    elif what == "foreign duckdb":
        con = duckdb.connect(str(db))
        con.execute("CREATE TABLE t (x INT)")
        con.close()
    result = CliRunner().invoke(main, ["build-site", "--db", str(db), "--out", str(tmp_path / "site"), "--data", ""])
    assert result.exit_code == (1 if what == "missing" else 2), result.output  # 2: a file it cannot use
    assert result.output.startswith("kcollect: error: ") and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "site").exists()


def test_clean_checkout_builds_from_the_parquet_history(tmp_path):
    src = site_store.build_store(tmp_path / "src.duckdb", cpu=False, second_gpu=False, lab=False)
    with Store(src, read_only=True) as store:
        export_runs(store, tmp_path / "runs")
    db, out = tmp_path / "fresh" / "k.duckdb", tmp_path / "site"
    result = CliRunner().invoke(main, ["build-site", "--db", str(db), "--out", str(out), "--data",
                                       str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert f"imported {site_store.COMMITS + 1} run(s)" in result.output
    assert (out / "kernels" / "alpha.html").is_file()
    again = CliRunner().invoke(main, ["build-site", "--db", str(db), "--out", str(out), "--data",
                                      str(tmp_path / "runs")])
    assert again.exit_code == 0 and "imported" not in again.output  # idempotent


# -- pure helpers ------------------------------------------------------------------------------


def test_cell_aggregates_only_passing_rows():
    rows = [dict(kernel="k", mode="fwd", provider=p, shape=s, dtype="bfloat16", baseline="torch", bound="memory",
                 status=st, median_ms=ms, gbps=1.0 / ms, tflops=None, frac_of_peak=f, error=None)
            for p, s, st, ms, f in [("torch", "a", "ok", 4.0, 0.2), ("triton", "a", "ok", 1.0, 0.8),
                                    ("torch", "b", "ok", 9.0, 0.1), ("triton", "b", "ok", 1.0, 0.9),
                                    ("torch", "c", "ok", 5.0, 0.3), ("triton", "c", "failed", 0.001, None),
                                    ("torch", "d", "ok", 5.0, 0.3), ("triton", "d", "unstable", 0.001, None)]]
    site_data.annotate(rows)
    c = site_data.cell([r for r in rows if r["provider"] == "triton"])
    assert c["speedup"] == pytest.approx(6.0)  # sqrt(4 * 9): the failed and unstable shapes are left out
    assert c["frac"] == pytest.approx(0.85) and c["ok"] == 2 and c["failed"] == 1 and c["unstable"] == 1
    assert rows[5]["vs_base"] is None and rows[5]["rate"] is None and rows[7]["vs_base"] is None


def test_sparkline_keeps_noise_small_and_steps_visible():
    flat = [1.0, 1.01, 0.99, 1.0]
    ys = [int(p.split(",")[1]) for p in charts.sparkline(flat).split()]
    assert max(ys) - min(ys) <= 2  # 1% noise is a wiggle, not the full height
    step = [1.0] * 5 + [1.3] * 5
    ys = [int(p.split(",")[1]) for p in charts.sparkline(step).split()]
    assert ys[0] - ys[-1] >= 15
    marked = charts.sparkline(step, mark=5)
    assert marked["x"] == 56 and marked["y"] == ys[-1]


def test_speedups_between_timing_methods_are_marked():
    # the graph-timed provider is compared with an event-timed one: the ratio carries a note
    rows = [dict(kernel="k", mode="fwd", provider=p, shape="a", dtype="bfloat16", baseline="torch", bound="memory",
                 status="ok", median_ms=ms, gbps=1.0 / ms, tflops=None, frac_of_peak=0.5, error=None, timing=t)
            for p, ms, t in [("torch", 2.0, "cuda-graph"), ("triton", 1.0, "cuda-graph"), ("liger", 1.5, "cuda-events")]]
    site_data.annotate(rows)
    torch_row, triton_row, liger_row = rows
    assert triton_row["vs_base_mixed"] is None  # both graph-timed
    assert "liger by cuda-events" in triton_row["vs_best_mixed"]  # best other is liger
    assert "triton by cuda-graph" in liger_row["vs_best_mixed"]
    assert torch_row["vs_best"] == pytest.approx(0.5) and torch_row["vs_best_mixed"] is None
    assert site_data.cell([liger_row])["mixed"] == 1


# -- the committed history ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    db = site_store.history_store(tmp_path_factory.mktemp("history") / "k.duckdb")
    with Store(db, read_only=True) as store:
        data = site_data.load(store)
        rows = store.query("SELECT kernel, mode, provider, shape, dtype, gpu_name, git_commit, timing, env_id, "
                           "machine, median_ms, status, driver, cuda, torch, triton, python, peers FROM results_v "
                           "WHERE device_kind = 'cuda'")
    return data, site_flags.analyse(data), rows


def test_history_no_recovered_regression_is_open(history):
    data, a, rows = history
    for f in a.flags:
        if f["kind"] == "regression" and f["state"] == "open":
            # the series' last three commits, straight from the store, still sit on the slow side
            mine = [r for r in rows if (r["kernel"], r["mode"], r["provider"], r["shape"], r["dtype"]) ==
                    (f["kernel"], f["mode"], f["provider"], f["shape"], f["dtype"]) and r["status"] == "ok"
                    and f"cuda:{r['gpu_name']}" == f["gkey"]]  # the flag's GPU, not another's runs
            order = {c["sha"]: i for i, c in enumerate(data.group(f["gkey"]).commits)}
            by_commit: dict[int, list[float]] = {}
            for r in mine:
                by_commit.setdefault(order[r["git_commit"]], []).append(r["median_ms"])
            after = [median(v) for ci, v in sorted(by_commit.items()) if ci > f["after_ci"]]
            mid = math.sqrt(f["before_ms"] * f["after_ms"])
            # open: no two commits in a row after it came back below halfway (regress.PERSIST)
            assert not any(x < mid and y < mid for x, y in zip(after, after[1:])), f
    swiglu = [f for f in a.flags if (f["kernel"], f["mode"], f["shape"]) == ("swiglu", "fwd+bwd", "M=16384,N=14336")
              and f["kind"] == "regression"]
    assert swiglu and all(f["state"] == "recovered" for f in swiglu)  # the issue's "+5.3%" at fea1ddc4


def _condition(row: dict) -> tuple:
    """What a row was measured under, read from the store: timing method, machine, the software
    stack, and the installed peers' versions for a peer's own rows (ours, eager and compile run on
    the stack alone: the peers installed beside them are not theirs)."""
    stack = row["provider"] in ("triton", "torch", "compile") or row["provider"].startswith(("triton[", "torch_"))
    return (row["timing"], row["machine"], row["driver"], row["cuda"], row["torch"], row["triton"], row["python"],
            None if stack else row["peers"])


def test_history_no_flag_comes_from_a_change_of_method_or_environment(history):
    data, a, rows = history
    assert a.flags
    for f in a.flags:
        commits = data.group(f["gkey"]).commits
        before, after = commits[f["before_ci"]]["sha"], commits[f["after_ci"]]["sha"]
        seen = {_condition(r) for r in rows if r["status"] == "ok"
                and r["git_commit"] in (before, after)
                and (r["kernel"], r["mode"], r["provider"], r["shape"], r["dtype"]) ==
                (f["kernel"], f["mode"], f["provider"], f["shape"], f["dtype"])}
        assert len(seen) == 1, (f, seen)
    # the issue's rms_norm bwd 1x4096 "-95.8%" is a change of timing method, listed as such
    method = [c for c in a.changes if (c["kernel"], c["mode"], c["provider"], c["shape"]) ==
              ("rms_norm", "bwd", "triton", "M=1,N=4096")]
    assert method and method[0]["kind"] == "method" and method[0]["change"] < -0.9
    assert not any((f["kernel"], f["mode"], f["provider"], f["shape"]) == ("rms_norm", "bwd", "triton", "M=1,N=4096")
                   and f["change"] < -0.9 for f in a.flags)


def test_commit_metadata_missing_from_the_store_comes_from_the_checkout(tmp_path):
    import subprocess

    from kcollect import site_git

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    git("-c", "user.name=Grace Hopper", "-c", "user.email=g@example.invalid", "commit", "-q", "--allow-empty",
        "-m", "Fix the tail of the last block")
    git("remote", "add", "origin", "git@github.com:example/kcollect.git")
    sha = git("rev-parse", "HEAD")
    commits = [{"sha": sha}, {"sha": "f" * 40}, {"sha": sha, "subject": "recorded", "url": None}]
    assert site_git.fill(commits, tmp_path) == 1
    assert commits[0] == {"sha": sha, "subject": "Fix the tail of the last block", "author": "Grace Hopper",
                          "url": f"https://github.com/example/kcollect/commit/{sha}"}
    assert commits[1] == {"sha": "f" * 40}  # not in the checkout: stays a bare hash
    assert commits[2]["subject"] == "recorded"  # what the store recorded wins
    assert site_git.commit_url_template("https://user:secret@gitlab.com/g/r.git") == "https://gitlab.com/g/r/-/commit/{sha}"


def test_shape_labels_leave_constant_dims_to_the_axis_title():
    from kcollect.charts import compact

    labels, title = compact(["B=1,S=32,causal=0,window=0", "B=32,S=512,causal=1,window=0"])
    assert labels == ["1×32×0", "32×512×1"] and title == "shape (B × S × causal)<br>window=0"
    assert compact(["M=7,N=<b>"]) == (["7×&lt;b&gt;"], "shape (M × N)")  # one shape: every dim, escaped


def test_a_run_of_part_of_the_grid_hides_none_of_the_other_cases(tmp_path):
    # a later H100 run that measured one case of alpha (kcollect run alpha --where ..., or a run
    # stopped early): that case comes from it, every other case still from the run before, and the
    # page says which run each comes from
    from dataclasses import replace
    from datetime import timedelta

    db = site_store.build_store(tmp_path / "k.duckdb")
    with Store(db) as store:
        before = store.query("""SELECT r.* FROM results r JOIN runs u USING (run_id)
                                WHERE r.kernel = 'alpha' AND u.env_id = ? ORDER BY u.started_at DESC, r.seq""",
                             [site_store.H100_NEW.env_id])
        old_run = before[0]["run_id"]
        rows = [r for r in before if r["run_id"] == old_run]
        case = (rows[0]["shape"], rows[0]["dtype"])
        later = site_store._run(site_store.H100_NEW, site_store.COMMITS, 0)
        later = replace(later, run_id="partial-" + later.run_id[8:],
                        started_at=later.started_at + timedelta(days=1), commit_time=later.commit_time + timedelta(days=1))
        store.start_run(later)
        store.add_results([{**r, "run_id": later.run_id, "median_ms": r["median_ms"] and r["median_ms"] * 0.5}
                           for r in rows if (r["shape"], r["dtype"]) == case])
        store.finish_run(later.run_id, "finished", later.started_at + timedelta(minutes=1))
        data = site_data.load(store)
    gkey = next(g.key for g in data.groups if g.key.endswith(site_store.H100.gpu_name))
    got = data.latest[(gkey, "alpha")]
    assert {r["run_id"] for r in got if (r["shape"], r["dtype"]) == case} == {later.run_id}
    assert {(r["shape"], r["dtype"]) for r in got if r["run_id"] == old_run} == \
        {(r["shape"], r["dtype"]) for r in rows} - {case}
    assert got[0]["run_id"] == later.run_id  # the newest run first: the page's header and ceiling
    build_site(db, tmp_path / "site")
    page = section(read(tmp_path / "site", "kernels/alpha.html"), H100)
    assert "That run measured part of the grid" in page and old_run[:8] in page


def test_a_row_stored_with_terminal_colour_codes_reads_plain_on_the_site():
    # rows stored before the runner dropped them (QuACK's CuTe DSL errors) are cleaned for the pages
    from kcollect.site_data import _clean

    row = _clean({"status": "error", "error": "DSLRuntimeError: \x1b[91m\x1b[1merror[INTERNAL]:\x1b[0m no IR"})
    assert row["error"] == "DSLRuntimeError: error[INTERNAL]: no IR" and row["median_ms"] is None
