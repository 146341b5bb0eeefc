"""The built site in a real browser: headless Chromium (the Debian package) driven by Playwright for
Python loads every page from file://, with no console errors, every chart drawn, every internal link
resolving, and filters that change what is shown and live in the URL.

Needs `pip install playwright` and `apt-get install chromium` (Playwright's own browser download is
not used); without them the module is skipped with that reason."""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

import site_store
from kcollect.site import build_site

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed "
                                                             "(pip install playwright)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
EVIL = '<script>alert("k")</script>'
HOSTILE = {EVIL: dict(bound="memory", modes=("fwd",), dtypes=("bfloat16",), shapes=("8x8", "<b>9x9</b>"),
                      providers=("triton", "torch", '"><img src=x onerror=alert(1)>'))}
H100 = "nvidia-h100-80gb-hbm3"


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("browser")
    main = build_site(site_store.build_store(tmp / "k.duckdb"), tmp / "site").out
    hostile = build_site(site_store.build_store(tmp / "h.duckdb", kernels=HOSTILE, commits=8, cpu=False,
                                                second_gpu=False), tmp / "hostile").out
    return {"main": main, "hostile": hostile}


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Page:
    """A tab that records console errors, page errors, failed loads and dialogs."""

    def __init__(self, browser):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.problems: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"failed load: {r.url}"))
        self.page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"), d.dismiss()))

    def open(self, path: Path, hash_: str = "") -> "Page":
        self.page.goto(path.as_uri() + hash_)
        self.page.wait_for_load_state("load")
        return self

    def draw_all_charts(self) -> int:
        """Scrolls every visible chart into view (they are drawn lazily) and waits for its SVG."""
        charts = self.page.locator(".chart:visible")
        n = charts.count()
        for i in range(n):
            chart = charts.nth(i)
            chart.scroll_into_view_if_needed()
            chart.locator("svg.main-svg").first.wait_for(state="attached", timeout=15000)
        return n

    def hash(self) -> str:
        return unquote(urlparse(self.page.url).fragment)


@pytest.fixture
def tab(browser):
    t = Page(browser)
    yield t
    t.page.close()


def pages_of(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def test_every_page_loads_clean_and_draws_every_chart(sites, tab):
    for name, site in sites.items():
        for page in pages_of(site):
            tab.open(page)
            n = tab.draw_all_charts()
            if page.parent.name == "kernels":
                assert n >= 3, f"{page}: only {n} charts"
                assert tab.page.locator(".chart:visible svg.main-svg").count() >= n
            assert not tab.problems, f"{name} {page.name}: {tab.problems}"


def test_every_internal_link_resolves(sites, tab):
    for page in pages_of(sites["main"]):
        tab.open(page)
        tab.draw_all_charts()  # also loads the trend data files the page asks for
        if page.name == "compare.html":
            tab.page.wait_for_selector("#kc-compare-detail table")
        urls = tab.page.eval_on_selector_all("a[href], script[src], link[href]",
                                             "els => els.map(e => e.href || e.src)")
        assert urls
        for url in urls:
            parsed = urlparse(url)
            assert parsed.scheme == "file", f"{page.name} links outside the site: {url}"
            assert Path(unquote(parsed.path)).is_file(), f"{page.name}: {url} does not exist"


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


def _traces(page, selector: str) -> int:
    return page.eval_on_selector(selector, "d => d.data.filter(t => t.visible !== false).length")


def test_kernel_page_filters_redraw_the_charts(sites, tab):
    t = tab.open(sites["main"] / "kernels" / "alpha.html", f"#gpu={H100}&mode=fwd")
    p = t.page
    assert p.locator("section.part:visible").count() == 1  # H100 fwd only
    assert not p.locator("section#g-cpu-interpreter").is_visible()
    t.draw_all_charts()
    trend = "section.part:visible .trend[data-shape='64x1024']"
    shape = "section.part:visible .shape-chart"
    before_trend, before_shape = _traces(p, trend), _traces(p, shape)
    assert before_trend == 4 * 3  # median line and two band edges per provider
    p.uncheck("input[name=provider][value=liger]")
    p.wait_for_function(f"d => d.data.length === {before_trend - 3}", arg=p.locator(trend).element_handle())
    assert _traces(p, shape) == before_shape - 1
    assert not p.locator("section.part:visible tr[data-provider=liger]").first.is_visible()
    p.select_option("select[name=mode]", "bwd")
    assert "mode=bwd" in t.hash()
    assert p.locator("section.part:visible h3").inner_text().startswith("bwd")
    t.draw_all_charts()
    assert not t.problems, t.problems


def test_regression_link_opens_the_step(sites, tab):
    t = tab.open(sites["main"] / "regressions.html")
    p = t.page
    p.click("table.flags-table tbody tr >> a")
    p.wait_for_selector(".trend.focus svg.main-svg")
    assert p.locator(".trend.focus").get_attribute("data-shape") == "4096x14336"
    names = p.eval_on_selector(".trend.focus", "d => d.data.map(t => t.name)")
    assert "regression" in names
    assert not t.problems, t.problems


def test_compare_two_commits_then_two_gpus(sites, tab):
    a, b = site_store.sha(site_store.STEP_AT - 1)[:8], site_store.sha(site_store.STEP_AT)[:8]
    t = tab.open(sites["main"] / "compare.html", f"#cmp=commits&g={H100}&a={a}&b={b}")  # a linked view
    p = t.page
    p.wait_for_selector("#kc-compare-detail table")
    assert p.input_value("select[name=a]") == a and p.input_value("select[name=b]") == b
    top = p.locator("#kc-compare-detail tbody tr").first.inner_text()
    assert "4096x14336" in top and re.search(r"\+2[45]\.\d%", top), top  # the planted 25% step leads
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
    assert not t.problems, t.problems


def test_hostile_names_stay_text(sites, tab):
    kernel_page = next((sites["hostile"] / "kernels").iterdir())
    t = tab.open(kernel_page)
    t.draw_all_charts()
    assert t.page.inner_text("h1") == EVIL
    assert t.page.locator("img[src=x]").count() == 0
    assert not t.problems, t.problems
