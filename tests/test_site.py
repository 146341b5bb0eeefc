"""kcollect build-site: the output folder, what the pages say, escaping, CPU/GPU separation, failed
rows, and the regression flags. Browser behaviour is in test_site_browser.py."""
from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

import site_store
from kcollect import charts, regress, site_data
from kcollect.cli import main
from kcollect.history import export_runs
from kcollect.site import MARKER, SiteError, analyse, build_site, plotly_js
from kcollect.store import Store


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("site")
    db = site_store.build_store(tmp / "k.duckdb")
    build_site(db, tmp / "site")
    return tmp / "site"


def read(site: Path, rel: str) -> str:
    return (site / rel).read_text()


def section(html: str, group_id: str) -> str:
    """The HTML of one device section of a page."""
    start = html.index(f'data-gpu="{group_id}" id="g-{group_id}"')
    end = html.find('<section class="group', start)
    return html[start:end if end >= 0 else len(html)]


def test_every_page_and_asset_is_written(built):
    for rel in ("index.html", "kernels/alpha.html", "kernels/beta.html", "regressions.html", "compare.html",
                "environments.html", "assets/style.css", "assets/site.js", MARKER, ".nojekyll"):
        assert (built / rel).is_file(), rel
    # plotly.js is the package's own file, copied once, and every page loads assets locally.
    assert (built / "assets/plotly.min.js").read_bytes() == plotly_js().read_bytes()
    assert len(list(built.rglob("plotly*.js"))) == 1
    for page in built.rglob("*.html"):
        refs = re.findall(r'(?:src|href)="([^"]*)"', page.read_text())
        assert refs
        for ref in refs:
            assert not re.match(r"^(https?:|//|/)", ref), (page, ref)  # relative only: file:// and Pages


def test_internal_links_point_at_files(built):
    for page in built.rglob("*.html"):
        for ref in re.findall(r'(?:src|href)="([^"#]+)', page.read_text()):
            assert (page.parent / ref).resolve().is_file(), (page.name, ref)


def test_overview_shows_speedup_sol_and_latest_run(built):
    html = read(built, "index.html")
    h100 = section(html, "nvidia-h100-80gb-hbm3")
    # triton is exactly 2x torch on every beta row (no failures there): 2.00x on the all-modes line
    assert "2.00×" in h100
    assert "Latest run <strong>2026-03-12 14:00</strong>" in h100  # the A/A rerun of commit 11
    assert site_store.sha(11)[:8] in h100
    assert h100.count('class="spark"') > 0
    # a failed provider is marked, and an erroring one too
    assert "failed" in h100 and "error" in h100


def test_failed_rows_never_show_a_speed(built):
    text = "".join(p.read_text() for p in built.rglob("*") if p.suffix in (".html", ".js"))
    assert "0.04242" not in text  # the time stored on the failed row appears nowhere
    alpha = section(read(built, "kernels/alpha.html"), "nvidia-h100-80gb-hbm3")
    row = re.search(r'<tr data-f data-provider="compile" class="failed[^"]*">.*?</tr>', alpha, re.S).group(0)
    assert "37x1000" in row and 'badge failed' in row and "5.0e-02" in row
    assert "×" not in row and "GB/s" not in row  # no speedup, no rate
    err = re.search(r'<tr data-f data-provider="liger" class="error[^"]*">.*?</tr>', alpha, re.S).group(0)
    assert "OutOfMemoryError" in err and "×" not in err


def test_cpu_rows_are_a_separate_group(built):
    overview = read(built, "index.html")
    cpu = section(overview, "cpu-interpreter")
    assert "CPU (Triton interpreter)" in cpu and "not GPU numbers" in cpu
    assert 'class="group cpu"' in overview
    for page in ("index.html", "kernels/alpha.html"):
        html = read(built, page)
        gpu_part = section(html, "nvidia-h100-80gb-hbm3") + section(html, "nvidia-h200")
        assert "123.4" not in gpu_part and "61.7" not in gpu_part  # CPU times (CPU_MS / speed)
    assert "123.4" in section(read(built, "kernels/alpha.html"), "cpu-interpreter")
    # its trend data lives in files of its own
    cpu_files = list((built / "data").glob("*.cpu-interpreter.*.js"))
    assert cpu_files and all("123.4" in f.read_text() or "61.7" in f.read_text() for f in cpu_files)
    for f in (built / "data").glob("*.nvidia-*.js"):
        assert "123.4" not in f.read_text()


def test_regressions_page_lists_the_planted_step_only(built):
    html = read(built, "regressions.html")
    rows = re.findall(r'<tr data-f data-gpu="([^"]+)"[^>]*class="(regression|improvement)', html)
    # the planted GPU step; the CPU series' 50% step is not analysed, the A/A rerun raises nothing
    assert rows == [("nvidia-h100-80gb-hbm3", "regression")]
    assert "+25.0%" in html
    assert f"{site_store.sha(5)[:8]}</code> → <code>{site_store.sha(6)[:8]}" in html
    assert "kernels/alpha.html#gpu=nvidia-h100-80gb-hbm3&amp;mode=fwd&amp;dtype=bfloat16&amp;shape=4096x14336" in html


def test_site_flags_equal_detect_all(tmp_path):
    """The site's flags are regress.detect_all's over every GPU row of results_v, keyed as the pages
    expect; CPU series are not analysed."""
    db = site_store.build_store(tmp_path / "k.duckdb")
    with Store(db, read_only=True) as store:
        rows = store.query("SELECT * FROM results_v WHERE device_kind = 'cuda'")
        mine = analyse(store)
    assert mine == {tuple(k[:6]): flags for k, flags in regress.detect_all(rows).items()}
    assert list(mine) == [site_store.STEP_SERIES]


def test_hostile_names_are_escaped(tmp_path):
    evil = '<script>alert("k")</script>'
    kernels = {evil: dict(bound="memory", modes=("fwd",), dtypes=("bfloat16",),
                          shapes=("8x8",), providers=("triton", "torch", '"><img src=x onerror=alert(1)>'))}
    db = site_store.build_store(tmp_path / "k.duckdb", kernels=kernels, commits=2, cpu=False, second_gpu=False)
    result = build_site(db, tmp_path / "site")
    pages = list(result.out.rglob("*.html"))
    # the kernel page stays inside kernels/ under a safe name
    kpages = list((result.out / "kernels").iterdir())
    assert len(kpages) == 1 and re.fullmatch(r"[a-z0-9_-]+\.html", kpages[0].name)
    for page in pages:
        html = page.read_text()
        assert "<script>alert" not in html and "<img src=x" not in html, page
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
    src = site_store.build_store(tmp_path / "src.duckdb", cpu=False, second_gpu=False)
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


def test_cell_aggregates_only_passing_rows():
    rows = [dict(kernel="k", mode="fwd", provider=p, shape=s, dtype="bfloat16", baseline="torch", bound="memory",
                 status=st, median_ms=ms, gbps=1.0 / ms, tflops=None, frac_of_peak=f, error=None)
            for p, s, st, ms, f in [("torch", "a", "ok", 4.0, 0.2), ("triton", "a", "ok", 1.0, 0.8),
                                    ("torch", "b", "ok", 9.0, 0.1), ("triton", "b", "ok", 1.0, 0.9),
                                    ("torch", "c", "ok", 5.0, 0.3), ("triton", "c", "failed", 0.001, None)]]
    site_data.annotate(rows)
    c = site_data.cell([r for r in rows if r["provider"] == "triton"])
    assert c["speedup"] == pytest.approx(6.0)  # sqrt(4 * 9): the failed shape is left out
    assert c["frac"] == pytest.approx(0.85) and c["ok"] == 2 and c["failed"] == 1
    assert rows[-1]["vs_base"] is None and rows[-1]["rate"] is None


def test_sparkline_keeps_noise_small_and_steps_visible():
    flat = [1.0, 1.01, 0.99, 1.0]
    ys = [int(p.split(",")[1]) for p in charts.sparkline(flat).split()]
    assert max(ys) - min(ys) <= 2  # 1% noise is a wiggle, not the full height
    step = [1.0] * 5 + [1.3] * 5
    ys = [int(p.split(",")[1]) for p in charts.sparkline(step).split()]
    assert ys[0] - ys[-1] >= 15


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
