"""kcollect build-site: the output folder, what the pages and their data files say, escaping, CPU/GPU
separation, failed and unstable rows, the regression analysis (states, changes of conditions) and
its cache, the overview's ranking and leaderboard, the site's config (acknowledged flags, providers
of another function), commit links, the feed, the partial plotly.js, the page data as JSON, and the
committed history. Browser behaviour is in test_site_browser.py."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from statistics import median

import duckdb
import pytest
from click.testing import CliRunner

import site_store
from kcollect import charts, regress, site, site_cache, site_config, site_data, site_flags, site_index, site_pages
from kcollect.cli import main
from kcollect.history import export_runs
from kcollect.series import canonical
from kcollect.site import MARKER, SiteError, build_site, plotly_js
from kcollect.store import Store
from site_store import data_file, flag_rows, part_rows

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


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """The command's cache (its default under the user's home) goes to each test's own folder."""
    monkeypatch.setenv("KCOLLECT_CACHE_DIR", str(tmp_path / "kcollect-cache"))


def read(site: Path, rel: str) -> str:
    return (site / rel).read_text()


def section(html: str, group_id: str) -> str:
    """The HTML of one device section of a page."""
    start = html.index(f'data-gpu="{group_id}" id="g-{group_id}"')
    end = html.find('<section class="group', start)
    return html[start:end if end >= 0 else len(html)]


def first_box(html: str) -> str:
    start = html.index('<section class="box')
    return html[start:html.index("</section>", start)]


# -- the output --------------------------------------------------------------------------------


def test_every_page_its_json_and_the_assets_are_written(built):
    for rel in (*PAGES, "assets/style.css", "assets/site.js", MARKER, ".nojekyll"):
        assert (built / rel).is_file(), rel
    for rel in PAGES:  # every page's data, as JSON, linked from the page
        data = json.loads(read(built, "json/" + rel.replace(".html", ".json")))
        assert data is not None
        assert f'json/{rel.replace(".html", ".json")}"' in read(built, rel)
    # plotly.js is the package's own bundle with the scatter trace only, shipped once (a fifth of it,
    # or less), and every page loads assets locally
    partial, full = (built / "assets/plotly.min.js").read_bytes(), plotly_js().read_bytes()
    assert partial.startswith(full[:200]) and len(partial) < len(full) / 4
    assert b".register([])" in partial  # no trace type but scatter, which the core registers itself
    for gone in (b"AttributionControl", b"Aksai Chin", b"parcoords"):  # maps, their country data, parcoords
        assert gone in full and gone not in partial, gone
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


def test_the_partial_bundle_keeps_what_is_reached_and_drops_the_rest():
    """plotly_bundle on a bundle laid out as esbuild writes plotly.js: regular expressions, template
    literals and strings that hold brackets do not confuse it; what the core reaches stays."""
    from kcollect import plotly_bundle

    src = ('/* head */var Plotly=(()=>{var W=(e,t)=>()=>{try{return t||e((t={exports:{}}).exports,t),t.exports}'
           'catch(r){throw t=0,r}},Ea=(e,t,r)=>()=>{if(r)throw r[0];try{return e&&(t=e(e=0)),t}catch(i){throw r=[i],i}},'
           'Fp=(e,t)=>{for(var r in t)S6(e,r,{get:t[r],enumerable:!0})};'
           'var A=W((e,t)=>{t.exports=/a\\/b[/({]/.test("x")?1:2/3});'
           'var B=W((e,t)=>{t.exports=`${A()}}`+"})"+(4)/2});'
           'var C=W((e,t)=>{t.exports="a 3D trace, unused"});'
           'var x,D=Ea(()=>{x=C()});var N={};Fp(N,{d:()=>D});function helper(){return N}'
           'var Core=W((e,t)=>{t.exports={register:()=>0,b:B()}});'
           'var R=W((e,t)=>{var c=Core();c.register([C(),D()]);t.exports=c});return R();})();')
    out = plotly_bundle.partial(src)
    for kept in ("var A=W(", "var B=W(", "var Core=W(", "var R=W(", "c.register([])", "var x;"):
        assert kept in out, kept
    for gone in ("a 3D trace", "var x,D=Ea(", "var N={}", "Fp(N,", "function helper"):
        assert gone not in out, gone
    with pytest.raises(plotly_bundle.BundleLayoutError):
        plotly_bundle.partial("window.Plotly = {}; /* a webpack bundle */")



# statements written as esbuild writes them, each with what makes JavaScript's tokens ambiguous: a
# slash after a value or a keyword, regular expressions holding quotes and brackets, strings holding
# brackets and slashes, template literals with nested substitutions, comments, `?.`, `...`, numbers
_AWKWARD = [
    'var A=W((e,t)=>{var r=a/b/c,s=(x)/2,u=[1]/3,q=typeof/re"/.source;t.exports=r+s});',
    'var B=W((e,t)=>{t.exports=/[/"\']+/g.test("a/b(")?/\\//:`x${`${t?.y}`+"}"}z${{a:1}.a}`});',
    'var C=W((e,t)=>{/* a (comment) */t.exports=o?.p?.(q)??[...r,...s.t];return;// ( "\n});',
    'var D=W((e,t)=>{t.exports={a:1..toString(),b:.5e-3,c:0x1F,d:e.return/2,g:`${1}`/2}});',
    'function F(a,b){if(a){return b/a}switch(b){case"(":return/x/}}',
    'var G={};Fp(G,{f:()=>F,d:()=>D});',
    'var n,E=Ea(()=>{n={k:`a${B()}b${[C()].map(x=>x*2/3)}c`}});',
    'function H(){}',
    ';',
    'var I=W((e,t)=>{t.exports=["é",\'\\\'\',"\\"("]});',
]


def _bundle(statements: list[str]) -> tuple[str, int, int]:
    head = ('var Plotly=(()=>{var W=(e,t)=>()=>{try{return t||e((t={exports:{}}).exports,t),t.exports}'
            'catch(r){throw t=0,r}},Ea=(e,t,r)=>()=>{if(r)throw r[0];try{return e&&(t=e(e=0)),t}catch(i){throw r=[i],i}},'
            'Fp=(e,t)=>{for(var r in t)S6(e,r,{get:t[r],enumerable:!0})};')
    src = head + "\n".join(statements) + "return A();})();"
    return src, len("var Plotly=(()=>{"), src.rfind("})();")


def _read(found) -> list:
    return [(a, b, st.first, st.top, st.used) for a, b, st in found]


@pytest.mark.parametrize("extra", [[], ["x=1\u00a0+2;"], ["var J=/re/;"], ["a. b;"], ["f(`t`);"], ["x(/re/.test(y));"], ["x=0xe+n;"]],
                         ids=["read-fast", "non-ascii-code", "top-level-regex", "spaced-member", "template-first", "regex-first", "exponent"])
def test_the_bundle_statements_are_those_of_the_token_by_token_scan(extra):
    """plotly_bundle.statements() reads the bundle as statements_by_token does (the reference: a
    token at a time), whether it counts the brackets itself or leaves something to the reference."""
    from kcollect import plotly_bundle

    src, body, end = _bundle(_AWKWARD + extra)
    expected = _read(plotly_bundle.statements_by_token(src, body, end))
    assert _read(plotly_bundle.statements(src, body, end)) == expected
    if extra:
        with pytest.raises(plotly_bundle._Unsure):
            plotly_bundle._statements(src, body, end)
    else:
        assert _read(plotly_bundle._statements(src, body, end)) == expected
        for k, piece in enumerate(_AWKWARD):  # one statement at a time too (what each holds is compared)
            src, body, end = _bundle([piece])
            assert _read(plotly_bundle._statements(src, body, end)) == _read(
                plotly_bundle.statements_by_token(src, body, end)), piece


def test_the_partial_bundle_of_the_installed_plotly_is_the_token_by_token_scans():
    from kcollect import plotly_bundle

    src = plotly_js().read_text()
    start = src.find(plotly_bundle.HEAD) + len(plotly_bundle.HEAD)
    end = src.rfind("})();")
    assert _read(plotly_bundle._statements(src, start, end)) == _read(
        plotly_bundle.statements_by_token(src, start, end))

def test_internal_links_point_at_files(built):
    for page in built.rglob("*.html"):
        for ref in re.findall(r'(?:src|href)="([^"#]+)', page.read_text()):
            if not ref.startswith("https://"):
                assert (page.parent / ref).resolve().is_file(), (page.name, ref)


# -- the overview ------------------------------------------------------------------------------


def test_overview_shows_speedup_sol_and_latest_run(built):
    html = read(built, "index.html")
    assert html.index('id="grids"') > html.index('id="board-h"')  # every provider's grid comes after the answers
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
    box = first_box(html)
    assert "What regressed" in box
    latest = re.findall(r"<li data-f data-gpu=.*?</li>", box[:box.index('<ol class="open-list">')], re.S)
    assert len(latest) == 2 and site_store.sha(11)[:8] in latest[0] and "none new" in latest[0]
    items = re.findall(r"<li .*?</li>", box[box.index('<ol class="open-list">'):], re.S)
    assert len(items) == 1  # the recovered regression is not open, the others are not ours
    assert "alpha" in items[0] and "+25." in items[0] and "Unroll alpha&#39;s inner loop twice" in items[0]
    assert re.search(r"\(\d+\.\d× noise\)", items[0]) and "2026-03-07" in items[0]  # the commit's date
    assert re.search(r'href="regressions.html#flag=[0-9a-f]{10}"', items[0])
    assert f'href="{site_store.URL}{site_store.sha(6)}"' in items[0]  # its commit, linked
    assert re.search(r'<span class="count"[^>]*>1<', html)  # the nav badge counts open regressions of ours
    read_box = html[html.index('id="read"'):]
    for words in ("measured on the same run", "Over 100%", "not like for like", "unstable"):
        assert words in read_box


def test_a_commit_that_raised_a_regression_says_so(tmp_path):
    # the step at STEP_AT is clear at its own commit: the gate decides it there, as compare would
    db = site_store.build_store(tmp_path / "k.duckdb", commits=site_store.STEP_AT + 1, cpu=False, lab=False)
    with Store(db, read_only=True) as store:
        flag = next(f for f in site_flags.analyse(site_data.load(store), git_root=None).flags
                    if (f["kernel"], f["mode"], f["state"]) == ("alpha", "fwd", "open"))
    assert flag["decided_ci"] == flag["after_ci"] == site_store.STEP_AT and flag["by_gate"]
    html = read(build_site(db, tmp_path / "site").out, "index.html")
    h100 = next(li for li in re.findall(r"<li data-f data-gpu=.*?</li>", first_box(html), re.S) if H100 in li)
    assert site_store.sha(site_store.STEP_AT)[:8] in h100 and "1 new regression</strong>" in h100
    assert "alpha fwd</a>" in h100 and "+25." in h100
    db = site_store.build_store(tmp_path / "k2.duckdb", commits=site_store.STEP_AT + 2, cpu=False, lab=False)
    html = read(build_site(db, tmp_path / "site2").out, "index.html")
    assert "new regression" not in first_box(html)  # a commit later, it is no longer new
    # a step found with more points is new at the commit that decided it, not at its own
    late = dict(flag, after_ci=3, decided_ci=5)
    assert site_index.raised_by_latest(late, 5) and not site_index.raised_by_latest(late, 3)


def test_leaderboard_sets_ours_against_the_best_other_provider(built):
    html = read(built, "index.html")
    board = html[html.index('id="board-h"'):html.index("</section>", html.index('id="board-h"'))]
    alpha = re.search(r'<tr><th scope="row"><a href="kernels/alpha.html">.*?</tr>', board, re.S).group(0)
    cells = re.findall(r'<td data-f data-gpu="([^"]+)"[^>]*data-csv=\'([^\']+)\'', alpha)
    assert [g for g, _ in cells] == [H100, "nvidia-h200"]  # the GPUs side by side
    speedup, rival, ahead, measured, sol = json.loads(cells[1][1])
    # on the H200: triton 2x torch, liger 1.6x, compile 1.25x: ours is 1.25x liger, the fastest other, in
    # five cases, and 1.6x compile in the one where liger errs in the latest run
    assert rival == "liger" and speedup == pytest.approx((1.25**5 * 1.6) ** (1 / 6), rel=0.01) and ahead == measured == 6
    assert 0 < sol < 2


def test_leaderboard_never_sets_ours_against_another_function(tmp_path):
    db = site_store.build_store(tmp_path / "k.duckdb", cpu=False, lab=False)
    config = _config(tmp_path, '[other_function.alpha]\nliger = "pretend: another function"\n')
    html = read(build_site(db, tmp_path / "site", config=config).out, "index.html")
    alpha = re.search(r'<tr><th scope="row"><a href="kernels/alpha.html">.*?</tr>', html, re.S).group(0)
    assert "liger: another function" in alpha
    rivals = [json.loads(c)[1] for c in re.findall(r"data-csv='([^']+)'", alpha)]
    assert rivals == ["compile", "compile"]  # liger was the fastest other; compile is the next


def test_standing_counts_cases_and_leaves_other_functions_out():
    def row(p, shape, ms, status="ok", frac=0.5):
        return dict(provider=p, ours=p.startswith("triton"), mode="fwd", shape=shape, dtype="bfloat16", status=status,
                    median_ms=ms, frac_of_peak=frac)

    rows = [row("triton", "a", 1.0, frac=0.9), row("torch", "a", 2.0), row("liger", "a", 0.8), row("linear", "a", 0.1),
            row("triton", "b", 1.0, frac=0.7), row("torch", "b", 1.5), row("liger", "b", 1.2), row("linear", "b", 0.1),
            row("triton", "c", 1.0, "failed"), row("torch", "c", 3.0),
            row("triton", "d", 1.0, frac=0.8), row("triton[wide]", "d", 0.5)]
    got = site_index.standing(rows, excluded={"linear"})
    # a: liger is faster (0.8), b: ours ahead of liger (1.2); c failed; d has no other provider
    assert got["measured"] == 2 and got["ahead"] == 1 and got["rival"] == "liger"
    assert got["speedup"] == pytest.approx(math.sqrt(0.8 * 1.2)) and got["sol"] == pytest.approx(0.8)
    assert site_index.standing(rows, excluded=set())["rival"] == "linear"  # what the exclusion prevents
    assert site_index.standing([row("triton", "a", 1.0, "failed")], set())["status"] == "failed"


def test_open_regressions_rank_by_size_times_the_engines_confidence_across_gpus():
    def flag(change, p, ci, gpu):
        return dict(kind="regression", state="open", ours=True, change=change, p=p, after_ci=ci, gkey=gpu)

    big_new, small_sure, big_unsure = flag(0.30, 1e-6, 3, "a"), flag(0.05, 1e-12, 40, "b"), flag(0.35, 0.3, 1, "a")
    ranked = site_pages.open_regressions([small_sure, big_unsure, big_new])
    assert ranked == [big_new, big_unsure, small_sure]  # never by a GPU's own commit index
    assert site_pages.confidence(0.3) == pytest.approx(0.7)  # 1 - the p-value the engine decided it with
    assert site_pages.confidence(None) == 1  # a change of conditions: by its size alone
    acked = dict(big_new, ack={"state": "acknowledged", "reason": "known"})
    assert site_pages.open_regressions([acked, small_sure]) == [small_sure]


def test_open_steps_of_our_kernels_that_something_else_explains_are_not_counted_as_a_peers():
    # a step of ours from a partial run, or where our code did not change, is not a regression of our
    # code, nor one of a baseline or a peer (the committed history's mlstm bwd +63% at c7e020aa, from
    # interrupted runs, was counted among the peers')
    def flag(ours, mine, state="open"):
        return dict(kind="regression", state=state, ours=ours, mine=mine)

    rows = [flag(True, True), flag(False, True), flag(False, True), flag(False, False), flag(False, True, "recovered")]
    c = site_pages.counts(rows)
    assert (c["open_ours"], c["open_confirm"], c["open_other"], c["recovered"]) == (1, 2, 1, 1)


def test_the_stated_threshold_is_the_detectors(tmp_path, monkeypatch):
    db = site_store.build_store(tmp_path / "k.duckdb", cpu=False, second_gpu=False, lab=False)
    pct = f"{100 * regress.DEFAULT_THRESHOLD:.0f}%"
    for threshold, shown in ((regress.DEFAULT_THRESHOLD, pct), (0.07, "7%")):
        monkeypatch.setattr(regress, "DEFAULT_THRESHOLD", threshold)
        out = build_site(db, tmp_path / f"site{threshold}").out
        for page in ("index.html", "regressions.html", "kernels/alpha.html", "compare.html"):
            html = read(out, page)
            assert shown in html and not re.search(r"(?<![\d.])5%", html), page
        assert json.loads(read(out, "json/compare.json"))["threshold"] == threshold


# -- kernel pages ------------------------------------------------------------------------------


def test_kernel_table_shows_config_memory_reps_and_tolerance(built):
    part, rows = part_rows(built, "alpha", H100, "fwd", "bfloat16")
    row = next(r for r in rows if r["provider"] == "triton" and r["shape"] == "M=64,N=1024")
    assert row["config"] == "block: BLOCK=1024 num_warps=4"  # the plan this number came from
    assert row["peak_mem_bytes"] == 3 * 2**20 and 100 < row["reps"] < 200
    assert row["tolerance"] == pytest.approx(1.6e-2) and row["rel_err"] == pytest.approx(2e-3)
    # the latency distribution of the timed calls beside the median
    assert row["min_ms"] < row["mean_ms"] < row["p99_ms"] < row["max_ms"]
    assert row["p20_ms"] < row["median_ms"] < row["p80_ms"]
    assert part["shapes"] == list(site_store.KERNELS["alpha"]["shapes"])  # in grid order
    assert [r["provider"] for r in rows[:4]] == ["triton", "torch", "compile", "liger"]  # the site's provider order
    assert part["has_config"] and not part["has_tokens"]  # alpha's rows carry no tokens
    assert part["ticks"] == ["64×1k", "37×1000", "4k×14k"] and part["xtitle"] == "shape (M × N)"
    assert part["ylog"] is False and part["unit"] == "GB/s"
    html = read(built, "kernels/alpha.html")
    assert 'data-kind="memory"' in html and 'data-kind="rate"' in html  # memory against shape beside the rate
    # results first: the first part's table comes before every flag of the kernel but the open ones
    assert html.index('class="jtable results"') < html.index('id="all-flags"')
    assert html.index('class="box open-box"') < html.index('class="jtable results"')


def test_kernel_table_shows_tokens_per_second_where_rows_have_tokens(built):
    part, rows = part_rows(built, "beta", H100, "fwd", "bfloat16")
    row = next(r for r in rows if r["provider"] == "triton" and r["status"] == "ok")
    assert part["has_tokens"] and part["unit"] == "TFLOP/s"
    assert row["tokens_per_s"] == pytest.approx(1024 * 1e3 / row["median_ms"], rel=1e-5)  # M=1024 tokens


def test_failed_and_unstable_rows_never_show_a_speed(built):
    text = "".join(p.read_text() for p in built.rglob("*") if p.suffix in (".html", ".js", ".json"))
    assert "0.04242" not in text and "0.03131" not in text  # the times stored on those rows appear nowhere
    _, alpha = part_rows(built, "alpha", H100, "fwd", "bfloat16")
    failed = next(r for r in alpha if r["provider"] == "compile" and r["shape"] == "M=37,N=1000")
    assert failed["status"] == "failed" and failed["rel_err"] == pytest.approx(0.05)
    speeds = ("median_ms", "rate", "vs_base", "vs_best", "frac_of_peak", "p20_ms", "p80_ms", "max_ms")
    assert all(failed[k] is None for k in speeds)
    _, bwd = part_rows(built, "alpha", H100, "bwd", "bfloat16")
    err = next(r for r in bwd if r["provider"] == "liger" and r["status"] == "error")
    assert "OutOfMemoryError" in err["error"] and all(err[k] is None for k in speeds)
    _, beta = part_rows(built, "beta", H100, "fwd", "float16")
    unstable = next(r for r in beta if r["status"] == "unstable")
    assert "disturbed while timed" in unstable["error"] and all(unstable[k] is None for k in speeds)
    # and no other row compares itself with them
    others = [r for r in beta if r["shape"] == unstable["shape"] and r["status"] == "ok"]
    assert others and all(r["vs_best"] is not None for r in others)


def test_cpu_rows_are_a_separate_group(built):
    overview = read(built, "index.html")
    cpu = section(overview, "cpu-interpreter")
    assert "CPU (Triton interpreter)" in cpu and "not GPU numbers" in cpu
    assert 'class="group cpu"' in overview
    alpha = read(built, "kernels/alpha.html")
    assert "not GPU numbers" in section(alpha, "cpu-interpreter")
    # each group's numbers live in files of its own: the CPU's times (around CPU_MS) never in a GPU's
    for name, slow in (("cpu-interpreter", True), ("nvidia-h100-80gb-hbm3", False), ("nvidia-h200", False)):
        parts = [site_store.table_rows(data_file(f)) for f in (built / "data").glob(f"*.{name}.*.part.js")]
        times = [r["median_ms"] for rows in parts for r in rows if r["median_ms"] is not None]
        assert parts and times and all((t > site_store.CPU_MS / 10) == slow for t in times), name
    leaderboard = overview[overview.index('id="board-h"'):overview.index('id="trust-h"')]
    assert "CPU" not in leaderboard  # GPUs only


# -- regressions -------------------------------------------------------------------------------


def test_regressions_page_orders_open_recovered_improvements_then_conditions(built):
    rows = flag_rows(built)
    commits = data_file(built / "data" / "commits.js")
    kinds = [r["filter_kind"] for r in rows]
    # the changes of conditions last, the largest move first
    assert kinds == ["open", "recovered", "improvement", "method"] + ["environment"] * 4, kinds
    opened, recovered, fix = rows[:3]
    assert (opened["kernel"], opened["mode"], opened["gid"], opened["machine"]) == ("alpha", "fwd", H100, "h100-a")
    assert opened["change"] == pytest.approx(0.25, abs=0.01) and opened["z"] > 1 and opened["noise"] > 0
    short, date, subject, url = commits[H100][opened["a"]]
    assert url == site_store.URL + site_store.sha(6) and subject == site_store.subject(6) and date.startswith("2026-03-07")
    assert commits[H100][opened["b"]][0] == site_store.sha(5)[:8]
    assert opened["spark"]["points"] and opened["slug"] == "alpha"
    assert recovered["mode"] == "bwd" and recovered["label"] == "recovered regression"
    assert commits[H100][recovered["end"]][0] == site_store.sha(6)[:8]  # back at
    assert fix["kind"] == "improvement" and commits[H100][fix["undoes"]][0] == site_store.sha(3)[:8]
    method = rows[3]
    assert method["provider"] == "compile" and method["state"] == "condition" and "cuda-events → cuda-graph" in method["what"]
    assert all("torch 2.11.0 → 2.12.0" in r["what"] and r["provider"] == "torch" for r in rows[4:])
    # the CPU series' 50% step is not analysed, the A/A rerun and the H200 raise nothing
    assert {r["gid"] for r in rows} == {H100}
    html = read(built, "regressions.html")
    assert 'data-flags data-name="regressions"' in html and "8 rows" in html
    # the kernel page lists its open flag above the results, folds the rest, and leaves the changes of
    # conditions to this page
    alpha = read(built, "kernels/alpha.html")
    assert alpha.count('class="flag-link"') == 1 and 'data-flags data-kernel="alpha"' in alpha
    beta = read(built, "kernels/beta.html")
    assert "5 series of beta moved where their timing method, machine or environment" in beta
    assert "No step in any series of beta" in beta


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
    assert reg["counts"]["open_ours"] == 1 and reg["flags"]["rows"][0][reg["flags"]["cols"].index("kernel")] == "alpha"
    assert "spark" not in reg["flags"]["cols"] and {len(r) for r in reg["flags"]["rows"]} == {len(reg["flags"]["cols"])}
    alpha = json.loads(read(built, "json/kernels/alpha.json"))
    rows = [dict(zip(p["cols"], r)) for p in alpha["parts"] for r in p["rows"]]
    assert {r["status"] for r in rows} >= {"ok", "failed", "error"}
    assert all(r["median_ms"] is None and r["max_ms"] is None for r in rows if r["status"] != "ok")
    assert all(r["p99_ms"] > r["median_ms"] for r in rows if r["status"] == "ok")
    assert len(alpha["open_flags"]) == 1
    index = json.loads(read(built, "json/index.json"))
    assert index["n_open"] == 1 and [x["gpu"] for x in index["latest"]] == [site_store.H100_NAME, "NVIDIA H200"]
    assert {r["kernel"] for r in index["leaderboard"]} == {"alpha", "beta"}


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
    # the data files carry the names as JSON strings, which site.js sets as text; no link to script
    assert not any("javascript:" in f.read_text() for f in (result.out / "data").iterdir())
    feed = read(result.out, "regressions.atom")
    assert "<script>" not in feed and "<b>" not in feed


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
    db.parent.mkdir()  # a --db's folder must exist (only the default's data/ is made)
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
                           "machine, median_ms, status, driver, cuda, torch, triton, python, peers, package, ours "
                           "FROM results_v WHERE device_kind = 'cuda'")
    return data, site_flags.analyse(data), rows


def test_the_engine_reads_the_series_in_columns_as_from_rows(tmp_path):
    """series.group_store (the site's read of the history, grouped from hashed columns) gives the
    series, our keys and the commits that group_series gives from the same rows as dicts: on the
    committed history with the awkward rows it lacks planted in: a run outside git, a commit
    stored by its short SHA beside a run with the full one, an interrupted run, rows without
    p20/p80, with a NaN, zero or negative recheck, with no or a negative median, with a recheck at
    the edge of the tolerance or just inside it, unsteady."""
    from kcollect import series

    db = site_store.history_store(tmp_path / "h.duckdb")
    con = duckdb.connect(str(db))
    runs = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    twice = con.execute("SELECT git_commit FROM runs GROUP BY git_commit HAVING count(*) > 1 ORDER BY 1").fetchone()[0]
    short = con.execute("SELECT min(run_id) FROM runs WHERE git_commit = ?", [twice]).fetchone()[0]
    con.execute("UPDATE runs SET git_commit = left(git_commit, 7) WHERE run_id = ?", [short])
    con.execute("UPDATE runs SET git_commit = NULL WHERE run_id = ?", [runs[0]])
    con.execute("UPDATE runs SET status = 'interrupted' WHERE run_id = ?", [runs[1]])
    for where, change in (("hash(seq) % 7 = 0", "p20_ms = NULL, p80_ms = NULL"),
                          ("hash(seq) % 7 = 1", "recheck_ms = 'nan'::DOUBLE"), ("hash(seq) % 7 = 2", "recheck_ms = 0"),
                          ("hash(seq) % 7 = 3", "median_ms = NULL"), ("hash(seq) % 7 = 4", "median_ms = -1")):
        con.execute(f"UPDATE results SET {change} WHERE run_id = ? AND {where}", [runs[2]])
    tolerance = "ln(1 + greatest(0.05, 2 * least((p80_ms - p20_ms) / median_ms, 0.5)))"  # stability.tolerance on a GPU
    for where, change in (("hash(seq) % 4 = 0", f"recheck_ms = median_ms * exp({tolerance})"),  # at the edge
                          ("hash(seq) % 4 = 1", f"recheck_ms = median_ms / exp({tolerance} * 0.999)"),  # inside
                          ("hash(seq) % 4 = 2", "p80_ms = p20_ms + median_ms, recheck_ms = median_ms"),  # unsteady
                          ("hash(seq) % 4 = 3", "recheck_ms = -median_ms")):
        con.execute(f"UPDATE results SET {change} WHERE run_id = ? AND {where} AND p20_ms IS NOT NULL", [runs[3]])
    con.close()
    with Store(db, read_only=True) as store:
        rows = store.query(series.QUERY)
        want, want_ours = series.group_series(rows)
        got, got_ours, commits = series.group_store(store.con)
    assert got_ours == want_ours and sorted(set(commits)) == sorted({r["git_commit"] for r in rows if r["git_commit"]})
    assert any(c.startswith("run:") for pts in want.values() for c in (p.commit for p in pts))
    assert any(p.partial for pts in want.values() for p in pts) and any(p.runs > 1 for pts in want.values() for p in pts)
    assert got.keys() == want.keys()
    for key, points in want.items():
        assert repr(got[key]) == repr(points), key


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
            # up to the series' next flag, if any: a step back that the engine flags itself (an
            # improvement after the regression) is how that series shows its return
            same = (f["gkey"], f["kernel"], f["mode"], f["provider"], f["shape"], f["dtype"])
            nxt = min((g["after_ci"] for g in a.flags if g["after_ci"] > f["after_ci"] and (
                g["gkey"], g["kernel"], g["mode"], g["provider"], g["shape"], g["dtype"]) == same), default=math.inf)
            # each in the scale of the flag's levels: corrected for the machine's drift at its commit;
            # from the commit after the one that decided it (a step decided by persistence, commits after
            # it stepped, counts the points up to that decision as its evidence, not as its way back:
            # regress._recovered; rope bwd on the H200, stepped at aac9a5c and decided at cd54508)
            after = [median(v) / math.exp(f["drift"].get(ci, 0.0)) for ci, v in sorted(by_commit.items())
                     if max(f["after_ci"], f["decided_ci"]) < ci < nxt]
            mid = math.sqrt(f["before_ms"] * f["after_ms"])
            # open: no two commits in a row after it came back below halfway (regress.PERSIST)
            assert not any(x < mid and y < mid for x, y in zip(after, after[1:])), f
    swiglu = [f for f in a.flags if (f["kernel"], f["mode"], f["shape"]) == ("swiglu", "fwd+bwd", "M=16384,N=14336")
              and f["kind"] == "regression"]
    assert swiglu and all(f["state"] == "recovered" for f in swiglu)  # the issue's "+5.3%" at fea1ddc4


def _condition(row: dict) -> tuple:
    """What a row was measured under, read from the store: timing method, machine, the software
    stack, and for a row not of ours the version of the package its provider comes from (the row's
    `package`: '' none, the stack alone, as eager, compile and cuDNN; NULL on rows older than that
    column, where the stack's own providers by name run on it alone and a peer's rows count every
    installed peer's version)."""
    stack = (row["timing"], row["machine"], row["driver"], row["cuda"], row["torch"], row["triton"], row["python"])
    package = row["package"]
    by_name = row["provider"] in ("triton", "torch", "compile") or row["provider"].startswith(("triton[", "torch_"))
    if row["ours"] or package == "" or package is None and by_name:
        return stack
    if package is None:
        return stack + (row["peers"],)
    peers = {canonical(name): v for name, v in json.loads(row["peers"] or "{}").items()}
    return stack + (peers.get(canonical(package)),)


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
              ("rms_norm", "bwd", "triton", "M=1,N=4096") and c["what"].startswith("timing method")]
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
    commits = [{"sha": sha}, {"sha": "f" * 40}, {"sha": sha, "subject": "recorded", "url": None}, {"sha": sha[:7]}]
    assert site_git.fill(commits, tmp_path) == 2
    assert commits[3]["subject"] == "Fix the tail of the last block"  # an abbreviated hash, as a copy's run records it
    assert commits[3]["url"] == f"https://github.com/example/kcollect/commit/{sha}"
    assert commits[0] == {"sha": sha, "subject": "Fix the tail of the last block", "author": "Grace Hopper",
                          "url": f"https://github.com/example/kcollect/commit/{sha}"}
    assert commits[1] == {"sha": "f" * 40}  # not in the checkout: stays a bare hash
    assert commits[2]["subject"] == "recorded"  # what the store recorded wins
    assert site_git.commit_url_template("https://user:secret@gitlab.com/g/r.git") == "https://gitlab.com/g/r/-/commit/{sha}"


def test_shape_labels_are_short():
    from kcollect.charts import compact

    labels, title = compact(["B=1,S=32,causal=0,window=0", "B=32,S=4096,causal=1,window=0"])
    assert labels == ["1×32×0", "32×4k×1"] and title == "shape (B × S × causal)\nwindow=0"
    assert compact(["M=7,N=<b>"]) == (["7×<b>"], "shape (M × N)")  # plain text: site.js escapes it
    many = ["B=1,Hq=1,Hkv=1,Sq=64,Skv=64,D=64", "B=16,Hq=32,Hkv=8,Sq=16384,Skv=16384,D=128"]
    assert compact(many) == (["#1", "#2"], "shape (# in grid order; hover a point for its dims)")


def test_every_provider_has_its_own_colour_and_ours_always_the_same():
    names = ["torch", "compile", "triton", *(f"peer{i}" for i in range(40))]
    colors = charts.provider_colors(names)
    assert len(set(colors.values())) == len(names) and colors["triton"] == charts.OURS_COLOR
    assert charts.provider_colors(["triton"])["triton"] == charts.OURS_COLOR
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in colors.values())
    assert charts.log_axis([0.5, 4.9]) is False and charts.log_axis([0.5, 5.01, None]) is True


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


# -- the site's config: acknowledged flags, providers of another function ----------------------


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return path


def test_an_acknowledged_regression_stays_listed_and_no_longer_counts_as_open(tmp_path):
    db = site_store.build_store(tmp_path / "k.duckdb", cpu=False, lab=False)
    config = _config(tmp_path, f"""
[[flag]]
commit = "{site_store.sha(site_store.STEP_AT)[:8]}"
kernel = "alpha"
state = "acknowledged"
reason = "unrolled for the H200; the H100 pays 25%"
by = "Ada"

[[flag]]
flag = "0123456789"
state = "ignored"
reason = "a flag long gone"
""")
    result = build_site(db, tmp_path / "site", config=config)
    assert result.notes == [f"{config}: [[flag]] entry 2 (0123456789) matches no flag"]
    index = read(result.out, "index.html")
    assert "None: no series of our kernels stands on a slower level than before that nobody has acknowledged" in index
    assert '<span class="count"' not in index and "1 acknowledged or ignored" in index
    row = next(r for r in flag_rows(result.out) if r["state"] == "open")
    assert row["ack"] == {"state": "acknowledged", "reason": "unrolled for the H200; the H100 pays 25%", "by": "Ada"}
    feed = read(result.out, "regressions.atom")
    assert "Acknowledged: unrolled for the H200" in feed  # acknowledged: still in the feed, with its reason


@pytest.mark.parametrize("text, says", [
    ('[[flag]]\ncommit = "0006ccc"\nstate = "acknowledged"\n', "has no reason"),
    ('[[flag]]\ncommit = "0006ccc"\nstate = "fine"\nreason = "x"\n', "state must be one of acknowledged, ignored"),
    ('[[flag]]\nkernel = "alpha"\nstate = "ignored"\nreason = "x"\n', "names no flag"),
    ('[[flag]]\nflag = "x"\ncolour = "red"\nstate = "ignored"\nreason = "x"\n', "unknown key(s) colour; valid: flag, commit"),
    ('[flags]\n', "unknown section(s) flags; valid: flag, other_function"),
    ('[[flag]\n', "is not valid TOML"),
    ('[other_function]\naxon = "linear"\n', "one table per kernel"),
])
def test_a_bad_site_config_exits_2_with_one_line(tmp_path, text, says):
    db = site_store.build_store(tmp_path / "k.duckdb", cpu=False, second_gpu=False, lab=False)
    result = CliRunner().invoke(main, ["build-site", "--db", str(db), "--out", str(tmp_path / "site"), "--data", "",
                                       "--no-cache", "--config", str(_config(tmp_path, text))])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("kcollect: error: ") and says in result.output, result.output
    assert not (tmp_path / "site").exists()


def test_the_site_config_names_every_provider_of_another_function_and_only_those():
    """data/site.toml's [other_function] must say what the registry's specs say (Provider.reference):
    the site reads the store alone, so the config carries it."""
    from kcollect.registry import load

    specs = load(plugins=False).specs
    declared = {s.name: {p.name for p in s.providers if p.reference is not None} for s in specs}
    config = site_config.load(Path(__file__).resolve().parent.parent / "data" / "site.toml")
    assert {k: set(v) for k, v in config.other_function.items()} == {k: v for k, v in declared.items() if v}


def test_commit_url_template_links_every_commit(tmp_path):
    db = site_store.build_store(tmp_path / "k.duckdb", cpu=False, second_gpu=False, lab=False)
    template = "https://github.com/owner/repo/commit/{sha}"
    out = build_site(db, tmp_path / "site", commit_url=template).out
    commits = data_file(out / "data" / "commits.js")[H100]
    assert [c[3] for c in commits] == [f"https://github.com/owner/repo/commit/{site_store.sha(i)}"
                                       for i in range(site_store.COMMITS)]  # the template wins over the store's
    assert f'href="https://github.com/owner/repo/commit/{site_store.sha(6)}"' in read(out, "index.html")
    for bad, says in (("ftp://x/{sha}", "must be an http(s) address with {sha}"),
                      ("https://x/commit/", "must be an http(s) address with {sha}"),
                      ("https://x/{sha}/{ref}", "no field but {sha}")):
        result = CliRunner().invoke(main, ["build-site", "--db", str(db), "--out", str(tmp_path / "s2"), "--data", "",
                                           "--no-cache", "--commit-url", bad])
        assert result.exit_code == 2 and result.output.count("\n") == 1 and says in result.output, result.output


def test_the_feed_lists_regressions_of_ours_newest_first(built):
    import xml.etree.ElementTree as ET

    ns = {"a": "http://www.w3.org/2005/Atom"}
    feed = ET.fromstring(read(built, "regressions.atom"))
    entries = feed.findall("a:entry", ns)
    titles = [e.find("a:title", ns).text for e in entries]
    # the open regression at commit 6 and the recovered one at commit 3 (ours); not the improvement
    assert len(entries) == 2 and titles[0].startswith("alpha fwd bfloat16 +25.") and "open regression" in titles[0]
    assert "recovered regression" in titles[1]
    assert entries[0].find("a:updated", ns).text == "2026-03-07T12:00:00Z"
    assert entries[0].find("a:link[@rel='alternate']", ns).get("href").startswith("regressions.html#flag=")
    assert entries[0].find("a:link[@rel='related']", ns).get("href") == site_store.URL + site_store.sha(6)
    assert feed.find("a:updated", ns).text == "2026-03-07T12:00:00Z"
    assert 'rel="alternate" type="application/atom+xml"' in read(built, "index.html")


# -- what a rebuild reuses -----------------------------------------------------------------------


def test_the_cached_analysis_is_the_analysis_of_the_whole(analysed, history, tmp_path):
    for n, (data, whole) in enumerate((analysed, history[:2])):
        cache = site_cache.Cache(tmp_path / f"cache{n}")
        assert site_cache.analyse(data, cache, ".") == whole  # analysed, then kept
        assert site_cache.analyse(data, cache, ".") == whole  # read back
        # what git knows is part of the key: without git, our code counts as changed at every commit
        assert site_cache.digest(data, None) != site_cache.digest(data, ".")
        assert site_cache.analyse(data, cache, None) == site_flags.analyse(data, git_root=None)


def test_a_rebuild_analyses_only_when_the_history_changed_and_skips_an_unchanged_import(tmp_path, monkeypatch):
    src = site_store.build_store(tmp_path / "src.duckdb", cpu=False, lab=False)
    with Store(src, read_only=True) as store:
        export_runs(store, tmp_path / "runs")
    db, cache = tmp_path / "k.duckdb", tmp_path / "cache"
    calls = []
    real = site_flags.analyse

    def counted(data, *args, **kwargs):
        calls.append(data)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(site_flags, "analyse", counted)
    first = build_site(db, tmp_path / "site", tmp_path / "runs", cache_dir=cache)
    assert first.imported == site_store.COMMITS + 1 + 4 and len(calls) == 1  # the whole history, once
    calls.clear()
    import kcollect.history

    def no_import(*args, **kwargs):
        raise AssertionError("imported again")

    monkeypatch.setattr(kcollect.history, "import_path", no_import)
    again = build_site(db, tmp_path / "site", tmp_path / "runs", cache_dir=cache)
    assert again.unchanged and again.imported == 0 and calls == []  # nothing changed: no import, no analysis
    assert read(again.out, "regressions.atom") == read(first.out, "regressions.atom")
    shutil.rmtree(again.out)  # the same history into a new folder: built, the analysis from the cache
    rebuilt = build_site(db, tmp_path / "site", tmp_path / "runs", cache_dir=cache)
    assert not rebuilt.unchanged and calls == [] and flag_rows(rebuilt.out) == flag_rows(first.out)
    monkeypatch.undo()
    monkeypatch.setattr(site_flags, "analyse", counted)
    with Store(db) as store:  # one more H200 run of beta: the verdicts of any series may change
        run = site_store._run(site_store.H200, site_store.COMMITS, 0)
        store.start_run(run)
        rows = site_store._rows(run.run_id, site_store.H200, {"beta": site_store.KERNELS["beta"]}, site_store.COMMITS,
                                0, last=False)
        store.add_results(rows)
        store.finish_run(run.run_id, "finished", run.started_at)
    more = build_site(db, tmp_path / "site", cache_dir=cache)
    assert len(calls) == 1 and flag_rows(more.out) == flag_rows(build_site(db, tmp_path / "fresh").out)


def test_the_site_of_the_committed_history_weighs_under_12_mb(tmp_path):
    # built as the Pages workflow builds it: with the checkout's whole git history, which says whose
    # code changed at each commit (without git every commit changes ours, and its flags double)
    db = site_store.history_store(tmp_path / "h.duckdb")
    with Store(db, read_only=True) as store:
        missing = site_store.commits_missing(r["git_commit"] for r in store.query("SELECT DISTINCT git_commit FROM runs"))
    if missing:
        pytest.skip(f"{missing} of the history's commits are not in this clone (shallow?)")
    out = build_site(db, tmp_path / "site", git_root=Path(__file__).resolve().parent.parent).out
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    # 12 MiB, from 10: the site holds the whole history, about 45 KB a run (9.8 MiB at 227 runs), and
    # the compare page's files of the newest commits' points (0.35 MB) keep its first load light (the
    # browser test's budget); a history window, not a budget, is what stops the growth
    assert total <= 12 * 2**20, f"{total / 2**20:.1f} MiB"


def test_a_run_narrowed_to_some_providers_hides_none_of_the_others(tmp_path):
    # the H200's A/A runs measured ours and eager alone: as "the latest run of each case" they made
    # eager the best other (ours 8x) where the full run before had faster peers
    path = site_store.build_store(tmp_path / "k.duckdb")
    with Store(path) as store:
        last = store.query("SELECT run_id, started_at, git_commit, commit_time FROM runs r JOIN environments e "
                           "USING (env_id) WHERE e.gpu_name = 'NVIDIA H200' ORDER BY started_at DESC LIMIT 1")[0]
        store.con.execute("CREATE TEMP TABLE u AS SELECT * FROM runs WHERE run_id = ?", [last["run_id"]])
        store.con.execute("UPDATE u SET run_id = 'narrowed', started_at = started_at + INTERVAL 1 HOUR, "
                          "config = '{\"providers\": [\"triton\"]}'")
        store.con.execute("INSERT INTO runs SELECT * FROM u")
        store.con.execute("CREATE TEMP TABLE n AS SELECT * FROM results WHERE run_id = ? AND provider = 'triton'",
                          [last["run_id"]])
        store.con.execute("UPDATE n SET run_id = 'narrowed', median_ms = median_ms * 1.01")
        store.con.execute("INSERT INTO results SELECT * FROM n")
        data = site_data.load(store)
    rows = [r for (gkey, _), rs in data.latest.items() if "H200" in gkey for r in rs]
    ours = {r["run_id"] for r in rows if r["provider"] == "triton"}
    others = {r["provider"] for r in rows if r["provider"] != "triton"}
    assert ours == {"narrowed"} and others, (ours, others)  # ours from the newest run, the peers kept
    assert all(r["run_id"] == last["run_id"] for r in rows if r["provider"] != "triton")


def test_compare_reads_recent_commits_from_files_of_their_points(tmp_path):
    """A trend file with points before a GPU's newest RECENT_COMMITS commits gets a file of the
    points from there on (commit index, median, condition: what the compare page reads), which the
    compare page's manifest names ("r", from index "rs")."""
    from kcollect import site

    payload = {"series": {"ours": {"old": [[0, 1], [1.0, 1.1], [1, 2], [3, 4], [7, 7], {"7": 0.01}],
                                   "both": [[1, 5, 9], [2.0, 2.1, 2.2], [0, 1, 2], [5, 6, 7], [7, 8, 8], {"8": 0.02}]},
                          "peer": {"new": [[5], [3.0], [0], [1], [8], {}]}}, "marks": [{"kind": "x"}], "bands": 1000}
    recent = site._recent(payload, 5)
    assert recent == {"series": {"ours": {"both": [[5, 9], [2.1, 2.2], 0, 0, [8, 8]]}, "peer": {"new": [[5], [3.0], 0, 0, [8]]}}}
    assert site._recent(payload, 0) is None  # nothing older: the whole file serves

    db = site_store.history_store(tmp_path / "k.duckdb")
    build_site(db, tmp_path / "site")
    manifest = json.loads(re.search(r'<script type="application/json" id="kc-page">(.*?)</script>',
                                    (tmp_path / "site" / "compare.html").read_text(), re.S).group(1))["manifest"]
    with_recent = [e for e in manifest if "r" in e]
    assert with_recent and all(e["rs"] > 0 and (tmp_path / "site" / e["r"]).exists() for e in with_recent)
    for e in with_recent[:20]:
        whole, part = (data_file(tmp_path / "site" / e[k]) for k in ("f", "r"))
        for provider, shapes in whole["series"].items():
            for shape, (ci, med, _lo, _hi, cond, _noise) in shapes.items():
                kept = [(c, m, k) for c, m, k in zip(ci, med, cond) if c >= e["rs"]]
                got = part["series"].get(provider, {}).get(shape)
                assert (list(zip(got[0], got[1], got[4])) if got else []) == kept


def test_a_listed_step_of_ours_that_something_else_explains_says_so():
    """A kernel page lists every open flag of its kernel. One of our provider's series whose code did
    not change (or a partial run) is a step to confirm, not a regression of our code, and its line
    says so with the engine's cause (conv1d's page showed +2.7% at a commit that changed no kernel,
    as if it were ours); a regression of ours and a peer's carry no such tag."""
    flag_line = site.environment().get_template("_macros.html").module.flag_line
    after = {"date": "2026-12-01", "short": "135401df", "hover": "", "subject": "a script", "url": None}
    base = dict(id="f1", kernel="conv1d", mode="bwd", dtype="bfloat16", provider="triton", shape="B=2,T=128",
                change=0.027, glabel="NVIDIA H200", z=3.4, after=after)
    for ours, mine, cause, want in ((False, True, "our code did not change", "to confirm: our code did not change"),
                                    (False, True, "partial run: confirm", "to confirm: partial run<"),
                                    (True, True, None, None), (False, False, None, None)):
        f = dict(base, ours=ours, mine=mine, cause=cause)
        html = str(flag_line(dict(f, confirm=site_pages.to_confirm(f)), ""))
        assert (want in html) if want else ("to confirm" not in html), html
    # and the regressions table's label
    assert site_pages._label(dict(state="open", ours=False, mine=True, cause="partial run: confirm")) == \
        "open regression to confirm: partial run"
    assert site_pages._label(dict(state="open", ours=True, mine=True, cause=None)) == "open regression"
