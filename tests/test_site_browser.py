"""The built site in a real browser, scripted as a visitor: headless Chromium (the Debian package)
driven by Playwright for Python loads every page from file://, with no console errors, every chart
drawn, every internal link resolving, filters that change what is shown and live in the URL, every
table sortable and downloadable as CSV, no page wider than a phone's screen, and no serious
accessibility violation (axe-core, vendored from its npm package under tests/vendor/).

One browser and one tab for the module; the test store's site and the committed history's site are
built once. Needs `pip install playwright` and `apt-get install chromium` (Playwright's own browser
download is not used); without them the module is skipped with that reason."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from filelock import FileLock

import site_store
from kcollect.site import build_site

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed "
                                                             "(pip install playwright)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
EVIL = '<script>alert("k")</script>'
HOSTILE = {EVIL: dict(bound="memory", modes=("fwd",), dtypes=("bfloat16",), shapes=("M=8,N=8", "<b>9x9</b>"),
                      providers=("triton", "torch", '"><img src=x onerror=alert(1)>'))}
H100 = "nvidia-h100-80gb-hbm3"
DESKTOP, PHONE = {"width": 1440, "height": 900}, {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    # built once for the session: pytest-xdist's workers share the folder above their own, and
    # the first to take the lock builds while the others wait (the pages are only read)
    base = tmp_path_factory.getbasetemp()
    tmp = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "browser-sites"
    with FileLock(f"{tmp}.lock"):
        if not (tmp / "built").exists():
            tmp.mkdir(exist_ok=True)
            build_site(site_store.build_store(tmp / "k.duckdb"), tmp / "site")
            build_site(site_store.build_store(tmp / "h.duckdb", kernels=HOSTILE, commits=8, cpu=False,
                                              second_gpu=False, lab=False), tmp / "hostile")
            build_site(site_store.history_store(tmp / "history.duckdb"), tmp / "history")
            (tmp / "built").touch()
    return {"main": tmp / "site", "hostile": tmp / "hostile", "history": tmp / "history"}


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Page:
    """A tab that records console errors, page errors, failed loads and dialogs."""

    def __init__(self, browser, viewport=DESKTOP):
        self.page = browser.new_page(viewport=viewport, accept_downloads=True)
        self.problems: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"failed load: {r.url}"))
        self.page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"), d.dismiss()))

    def open(self, path: Path, hash_: str = "") -> "Page":
        self.page.goto(path.as_uri() + hash_)
        self.page.wait_for_load_state("load")
        if path.name == "compare.html":
            self.page.wait_for_selector("#kc-compare-detail table")
        return self

    def draw_all_charts(self, limit: int | None = None) -> int:
        """Scrolls every visible chart into view (they are drawn lazily) and waits for its SVG (for
        up to a minute: on a machine shared by several test runs, parsing plotly.js alone can take
        seconds)."""
        charts = self.page.locator(".chart:visible")
        n = charts.count() if limit is None else min(limit, charts.count())
        for i in range(n):
            chart = charts.nth(i)
            chart.scroll_into_view_if_needed()
            chart.locator("svg.main-svg").first.wait_for(state="attached", timeout=60000)
        return n

    def hash(self) -> str:
        return unquote(urlparse(self.page.url).fragment)

    def axe(self) -> list[str]:
        """The serious and critical accessibility violations axe-core finds on the page as shown."""
        self.page.add_script_tag(path=str(AXE))
        # preload off: axe would fetch the stylesheets, which file:// forbids (a console error)
        found = self.page.evaluate("axe.run(document, {resultTypes: ['violations'], preload: false}).then(r => r.violations"
                                   ".filter(v => v.impact === 'serious' || v.impact === 'critical')"
                                   ".map(v => v.id + ': ' + v.nodes.slice(0, 3).map(n => n.html.slice(0, 120)).join(' | ')))")
        return found


@pytest.fixture(scope="module")
def desktop(browser):
    t = Page(browser)
    yield t
    t.page.close()


def _blank(t: Page, viewport: dict) -> Page:
    # one tab for the module, each test from a blank page: a fresh tab parses plotly.js again (2 s
    # a kernel page), the tab that has loaded it once does not
    t.page.goto("about:blank")
    t.page.set_viewport_size(viewport)
    t.problems.clear()
    return t


@pytest.fixture
def tab(desktop):
    return _blank(desktop, DESKTOP)


@pytest.fixture
def phone(desktop):
    return _blank(desktop, PHONE)


def pages_of(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def some_pages(site: Path) -> list[Path]:
    """The history's pages a visitor meets first, and its largest kernel page."""
    kernels = sorted((site / "kernels").iterdir(), key=lambda p: p.stat().st_size)
    return [site / "index.html", site / "regressions.html", site / "environments.html", kernels[-1]]


def widest_kernel_pages(site: Path) -> list[Path]:
    """The kernel pages whose data is most likely to widen them: the two largest, and the two with
    the longest name, the longest shape label and the most providers."""
    kernels = sorted((site / "kernels").iterdir())
    texts = {p: p.read_text() for p in kernels}

    def most(key) -> list[Path]:
        return sorted(kernels, key=key)[-2:]

    return sorted({*most(lambda p: p.stat().st_size), *most(lambda p: len(p.stem)),
                   *most(lambda p: max(map(len, re.findall(r'data-shape="([^"]*)"', texts[p])), default=0)),
                   *most(lambda p: len(set(re.findall(r'data-provider="([^"]*)"', texts[p]))))})


# -- loading, links, filters -------------------------------------------------------------------


def _links_resolve(t: Page, page: Path) -> None:
    urls = t.page.eval_on_selector_all("a[href]:not(.ext), script[src], link[href]", "els => els.map(e => e.href || e.src)")
    assert urls
    for url in urls:
        parsed = urlparse(url)
        assert parsed.scheme == "file", f"{page.name} links outside the site: {url}"
        assert Path(unquote(parsed.path)).is_file(), f"{page.name}: {url} does not exist"
    for url in t.page.eval_on_selector_all("a.ext", "els => els.map(e => e.href)"):
        assert url.startswith(site_store.URL.split("/commit/")[0]), url  # commit pages only


def test_every_page_loads_clean_draws_its_charts_and_links_resolve(sites, tab):
    """Each page once, as a visitor on a desktop: no console error, every chart drawn (which also
    loads the trend data files), every internal link to a file that exists, and on the test store's
    site (every template, every kind of row) no serious accessibility violation (axe-core) and every
    table sortable and downloadable as CSV (checked on the same visit: a page load costs seconds).
    The committed history's pages are checked for scale without axe, whose run over their tens of
    thousands of elements took longer than everything else here."""
    visits = [("main", p, None) for p in pages_of(sites["main"])]
    visits += [("hostile", p, None) for p in pages_of(sites["hostile"])]
    visits += [("history", p, 3) for p in some_pages(sites["history"])]
    for name, page, limit in visits:
        tab.open(page)
        if name == "main":  # as the page opens: the charts in view drawn, the rest waiting
            found = tab.axe()
            assert not found, f"{name} {page.name}: {found}"
        n = tab.draw_all_charts(limit)
        if page.parent.name == "kernels" and limit is None:
            assert n >= 3, f"{page}: only {n} charts"
            assert tab.page.locator(".chart:visible svg.main-svg").count() >= n
        _links_resolve(tab, page)
        if name == "main":
            _tables_sort_and_download(tab, page)
        assert not tab.problems, f"{name} {page.name}: {tab.problems}"


def test_overview_filters_change_the_view_and_live_in_the_url(sites, tab):
    t = tab.open(sites["main"] / "index.html")
    p = t.page
    h100 = p.locator(f"section#g-{H100}")
    all_modes = h100.locator('tr[data-mode="*"]')
    fwd = h100.locator('tr[data-mode="fwd"]')
    assert all_modes.first.is_visible() and not fwd.first.is_visible()
    p.select_option("select[name=mode]", "fwd")
    assert fwd.first.is_visible() and not all_modes.first.is_visible()
    assert not h100.locator('tr[data-mode="bwd"]').first.is_visible()
    assert "mode=fwd" in t.hash()
    p.uncheck("input[name=provider][value=compile]")
    assert not h100.locator('th[data-provider="compile"]').is_visible()
    assert h100.locator('th[data-provider="triton"]').is_visible()
    assert "compile" not in t.hash().split("provider=")[1] and "triton" in t.hash()
    p.select_option("select[name=gpu]", H100)
    assert h100.is_visible() and not p.locator("section#g-cpu-interpreter").is_visible()
    assert f"gpu={H100}" in t.hash()
    # navigation carries the view along
    assert "mode=fwd" in p.get_attribute("nav.main-nav a[href^='regressions.html']", "href")
    # the same URL opened afresh shows the same view
    url = p.url
    other = Page(p.context.browser)
    try:
        other.page.goto(url)
        q = other.page
        assert q.input_value("select[name=mode]") == "fwd" and q.input_value("select[name=gpu]") == H100
        assert not q.is_checked("input[name=provider][value=compile]")
        assert not q.locator(f"section#g-{H100} th[data-provider='compile']").is_visible()
        assert q.locator(f"section#g-{H100} tr[data-mode='fwd']").first.is_visible()
        assert not q.locator("section#g-cpu-interpreter").is_visible()
        assert not other.problems, other.problems
    finally:
        other.page.close()
    p.click("#kc-reset")
    assert all_modes.first.is_visible() and t.hash() == ""
    assert not t.problems, t.problems


def test_regressions_filter_by_kind_kernel_and_machine(sites, tab):
    t = tab.open(sites["main"] / "regressions.html")
    p = t.page
    rows = p.locator("table.flags-table tbody tr")
    total = rows.count()
    p.select_option("select[name=kind]", "open")
    assert p.locator("table.flags-table tbody tr:visible").count() == 1
    assert "kind=open" in t.hash()
    p.select_option("select[name=kind]", "method")
    visible = p.locator("table.flags-table tbody tr:visible")
    assert visible.count() == 1 and "not a kernel change" in visible.inner_text()
    p.select_option("select[name=kind]", "")
    p.select_option("select[name=kernel]", "beta")
    assert 0 < p.locator("table.flags-table tbody tr:visible").count() < total
    p.select_option("select[name=machine]", "(not recorded)")
    assert p.locator("table.flags-table tbody tr:visible").count() == 0  # every flag is on h100-a
    assert not t.problems, t.problems


# -- the visitor's questions -------------------------------------------------------------------


def test_newest_open_regression_is_one_click_from_the_overview(sites, tab):
    t = tab.open(sites["main"] / "index.html")
    p = t.page
    p.click(".open-list a.flag-link >> nth=0")
    p.wait_for_selector("table.flags-table tr.focus")
    row = p.locator("table.flags-table tr.focus")
    assert row.is_visible() and p.url.split("#")[0].endswith("regressions.html")
    text = row.inner_text()
    assert "open regression" in text and "Unroll alpha's inner loop twice" in text  # the commit's message
    assert re.search(r"\+25\.\d%", text) and re.search(r"\d+\.\d× \(±0\.\d+%\)", text)  # size against noise
    box = row.bounding_box()
    assert 0 <= box["y"] < DESKTOP["height"]  # scrolled to it
    assert not t.problems, t.problems


def test_regression_link_opens_the_step(sites, tab):
    t = tab.open(sites["main"] / "regressions.html")
    p = t.page
    p.click("table.flags-table tbody tr >> nth=0 >> a >> nth=0")
    p.wait_for_selector(".trend-box.focus svg.main-svg")
    assert p.locator(".trend-box.focus .trend").get_attribute("data-shape") == "M=4096,N=14336"
    names = p.eval_on_selector(".trend-box.focus .trend", "d => d.data.map(t => t.name)")
    assert "regression" in names
    assert not t.problems, t.problems


def _traces(page, selector: str, group: str | None = None) -> int:
    return page.eval_on_selector(selector, "(d, g) => d.data.filter(t => t.visible !== false && "
                                           "(g === null || t.legendgroup === g)).length", group)


def test_kernel_page_filters_redraw_the_charts(sites, tab):
    t = tab.open(sites["main"] / "kernels" / "alpha.html", f"#gpu={H100}&mode=fwd")
    p = t.page
    assert p.locator("section.part:visible").count() == 1  # H100 fwd only
    assert not p.locator("section#g-cpu-interpreter").is_visible()
    t.draw_all_charts()
    trend = "section.part:visible .trend[data-shape='M=64,N=1024']"
    shape = "section.part:visible .shape-chart >> nth=0"
    before_trend, liger = _traces(p, trend), _traces(p, trend, "liger")
    before_shape = p.locator(shape).evaluate("d => d.data.filter(t => t.visible !== false).length")
    assert liger >= 3  # median line and two band edges per condition of the series
    p.uncheck("input[name=provider][value=liger]")
    p.wait_for_function(f"d => d.data.length === {before_trend - liger}", arg=p.locator(trend).element_handle())
    assert p.locator(shape).evaluate("d => d.data.filter(t => t.visible !== false).length") == before_shape - 1
    assert not p.locator("section.part:visible tr[data-provider=liger]").first.is_visible()
    p.select_option("select[name=mode]", "bwd")
    assert "mode=bwd" in t.hash()
    assert p.locator("section.part:visible h3").inner_text().startswith("bwd")
    t.draw_all_charts()
    assert not t.problems, t.problems


def test_trend_axis_log_linear_and_relative(sites, tab):
    t = tab.open(sites["main"] / "kernels" / "beta.html", f"#gpu={H100}&mode=fwd&dtype=float16")
    p = t.page
    t.draw_all_charts()
    chart = "section.part:visible .trend[data-shape='M=1024,N=1024,K=1024']"
    layout = p.eval_on_selector(chart, "d => [d.layout.yaxis.type, d.layout.yaxis.title.text, d.layout.xaxis.title.text]")
    assert layout == ["log", "median time (ms)", "commit (oldest → newest)"]
    hover = p.eval_on_selector(chart, "d => d.data.filter(t => t.text && t.name === 'triton')[0].text[0]")
    assert "p20–p80" in hover and "series noise ±" in hover and "Commit number 0" in hover
    # the change of timing method and the torch upgrade are drawn as such
    names = p.eval_on_selector(chart, "d => d.data.map(t => t.name)")
    assert "change of conditions" in names and "regression" not in names
    p.select_option("select[name=y]", "linear")
    p.wait_for_function("d => d.layout.yaxis.type === 'linear'", arg=p.locator(chart).element_handle())
    assert "y=linear" in t.hash()
    p.select_option("select[name=y]", "vs:torch")
    p.wait_for_function("d => d.layout.yaxis.title.text.includes('torch')", arg=p.locator(chart).element_handle())
    torch_y = p.eval_on_selector(chart, "d => d.data.filter(t => t.name === 'torch').flatMap(t => t.y)")
    assert torch_y and all(abs(v - 1) < 1e-9 for v in torch_y)
    triton_y = p.eval_on_selector(chart, "d => d.data.filter(t => t.name === 'triton').flatMap(t => t.y)")
    assert all(0.4 < v < 0.51 for v in triton_y)  # twice as fast: half the time, the torch upgrade aside
    assert not t.problems, t.problems


def test_compare_two_commits_then_two_gpus(sites, tab):
    a, b = site_store.sha(site_store.STEP_AT - 1)[:8], site_store.sha(site_store.STEP_AT)[:8]
    t = tab.open(sites["main"] / "compare.html", f"#cmp=commits&g={H100}&a={a}&b={b}")  # a linked view
    p = t.page
    assert p.input_value("select[name=a]") == a and p.input_value("select[name=b]") == b
    top = p.locator("#kc-compare-detail tbody tr").all_inner_texts()[:2]  # the largest changes lead:
    assert any("fwd" in r and "M=4096,N=14336" in r and re.search(r"\+2[45]\.\d%", r) for r in top), top  # the step
    assert any("bwd" in r and re.search(r"-2[23]\.\d%", r) for r in top), top  # and the end of the plateau
    assert "cmp=commits" in t.hash()
    p.select_option("select[name=cmp]", "gpus")
    p.wait_for_function("document.querySelector('#kc-compare-status').textContent.includes('NVIDIA H200')")
    assert "cmp=gpus" in t.hash()
    labels = p.eval_on_selector_all("select[name=a] option", "os => os.map(o => o.textContent)")
    assert labels == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]  # never the CPU interpreter
    assert p.locator("#kc-compare-detail tbody tr").count() > 0
    p.select_option("select[name=mode]", "bwd")
    p.wait_for_function("[...document.querySelectorAll('#kc-compare-detail tbody tr')]"
                        ".every(r => r.cells[1].textContent === 'bwd')")
    # across the change of timing method, the series is marked and left out of the counts
    before, after = site_store.sha(site_store.METHOD_UNTIL - 1)[:8], site_store.sha(site_store.METHOD_UNTIL)[:8]
    t.open(sites["main"] / "compare.html", f"#cmp=commits&g={H100}&a={before}&b={after}")
    assert "changed timing method or environment" in p.inner_text("#kc-compare-status")
    assert "not a kernel change" in p.locator("#kc-compare-detail tbody tr").first.inner_text()
    assert not t.problems, t.problems


# -- tables ------------------------------------------------------------------------------------


LEADING_NUMBER = re.compile(r"^[+-]?\d[\d,]*(\.\d+)?(e[+-]?\d+)?(?![\d-])", re.I)


def _sort_keys(table, col: int) -> list:
    """The column's cells as site.js sorts them: data-v, else a leading number, else the text."""
    cells = table.evaluate("""(t, col) => [...t.tBodies[0].rows].map(r => {
        let c = 0; for (const cell of r.cells) { if (c === col) return [cell.dataset.v ?? null, cell.textContent.replace(/\\s+/g, ' ').trim()]; c += cell.colSpan; }
        return [null, '']; })""", col)
    keys = []
    for v, text in cells:
        raw = v if v is not None else text
        if raw in ("", "—"):
            keys.append(None)
        elif v is not None:
            try:
                keys.append(float(v))
            except ValueError:
                keys.append(v.lower())
        else:
            m = LEADING_NUMBER.match(raw)
            keys.append(float(m.group(0).replace(",", "")) if m else raw.lower())
    return keys


def _ascending(keys: list) -> bool:
    """Numbers in order, then strings in order, then blanks."""
    rank = [(0, k) if isinstance(k, float) else (1, k) if isinstance(k, str) else (2, "") for k in keys]
    return all(a <= b for a, b in zip(rank, rank[1:]))


def _tables_sort_and_download(tab: Page, page: Path) -> None:
    """Every table of the page as shown: a caption, column headers, sorting by its last column of
    numbers both ways, and a CSV download of the rows shown."""
    p = tab.page
    p.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    tables = p.locator("table")
    assert tables.count() == p.locator("table.data").count()  # every table is enhanced
    for i in range(tables.count()):
        table = tables.nth(i)
        if not table.is_visible():
            continue
        where = f"{page.name} table {i}"
        assert table.locator("caption").count() == 1, where
        assert table.locator("thead th:not([scope=col])").count() == 0, where
        # sort by the last column holding numbers: ascending, with blanks last
        nums = table.evaluate("""t => [...t.tHead.rows[0].cells].map((th, i) => th.classList.contains('num'))""")
        col = max((j for j, is_num in enumerate(nums) if is_num), default=0)
        table.locator("thead th").nth(col).locator("button.sort").click()
        assert table.locator("thead th").nth(col).get_attribute("aria-sort") == "ascending", where
        assert _ascending(_sort_keys(table, col)), (where, _sort_keys(table, col))
        table.locator("thead th").nth(col).locator("button.sort").click()
        assert table.locator("thead th").nth(col).get_attribute("aria-sort") == "descending", where
        with p.expect_download() as info:
            table.locator("caption button.csv").click()
        download = info.value
        assert download.suggested_filename.endswith(".csv"), where
        lines = Path(download.path()).read_text().splitlines()
        shown = table.locator("tbody tr:visible").count()
        assert len(lines) == shown + 1, (where, len(lines), shown)
        header = table.locator("thead th:visible").all_inner_texts()
        assert lines[0].split(",")[0] == header[0].replace("↕", "").replace("↑", "").replace("↓", "").strip(), where


# -- phones and accessibility ------------------------------------------------------------------


def _overlap(a: dict, b: dict) -> bool:
    return not (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"] or
                a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])


def test_phone_width_no_page_wider_than_the_screen(sites, phone):
    """At 390 px: no page wider than the screen (the committed history's pages too, for real data
    has widened a page before: each page kind, and the kernel pages most at risk), a header under a
    quarter of it, legends beside the plot area and never over the lines, and no serious
    accessibility violation (on the test store's site, as above)."""
    history = sites["history"]
    visits = [("main", p) for p in pages_of(sites["main"])]
    visits += [("history", p) for p in pages_of(history) if p.parent == history]
    visits += [("history", p) for p in widest_kernel_pages(history)]
    for name, page in visits:
        phone.open(page)
        p = phone.page
        if name == "main":
            found = phone.axe()
            assert not found, f"{name} {page.name} at 390 px: {found}"
        width = p.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"{name} {page.name} is {width} px wide"
        header = p.locator("header.top").bounding_box()
        assert header["height"] < PHONE["height"] / 4, f"{page.name}: header {header['height']} px"
        if page.parent.name == "kernels" and (name == "main" or page in some_pages(history)):
            for chart in (".shape-chart:visible >> nth=0", ".trend:visible >> nth=0"):
                el = p.locator(chart)
                el.scroll_into_view_if_needed()
                el.locator("svg.main-svg").first.wait_for(state="attached", timeout=60000)
                legend = el.locator("g.legend").bounding_box()
                plot = el.locator("rect.nsewdrag").first.bounding_box()
                assert not _overlap(legend, plot), f"{page.name} {chart}: the legend covers the lines"
            assert p.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], page.name
    assert not phone.problems, phone.problems


def test_skip_link_comes_first_and_moves_the_focus(sites, tab):
    tab.open(sites["main"] / "regressions.html", "#kind=open")
    tab.page.keyboard.press("Tab")
    assert tab.page.evaluate("document.activeElement.textContent") == "Skip to content"
    tab.page.keyboard.press("Enter")
    assert tab.page.evaluate("document.activeElement.id") == "main"
    assert tab.hash() == "kind=open"  # the view in the URL survives
    assert not tab.problems, tab.problems


def test_hostile_names_stay_text(sites, tab):
    kernel_page = next((sites["hostile"] / "kernels").iterdir())
    t = tab.open(kernel_page)
    t.draw_all_charts()
    assert t.page.inner_text("h1") == EVIL
    assert t.page.locator("img[src=x]").count() == 0
    assert not t.problems, t.problems
