"""Screenshots of the dashboard for the README: the overview and one kernel page, each at 1280 px
(docs/overview.png, docs/kernel.png) and at 390 px, a phone (docs/overview-phone.png,
docs/kernel-phone.png), as a visitor first sees them (the top of the page, charts in view drawn).

Builds the site from a store the way `kcollect build-site` does (the Parquet history in --data is
folded into --db first, data/site.toml read), into a temporary folder, opens it in headless
Chromium (the Debian package, driven by Playwright) and saves the pages. Run it on the real history
so that the README shows real numbers:

    python benchmarks/screenshots.py                       # data/kbench.duckdb + data/runs
    python benchmarks/screenshots.py --db /tmp/x.duckdb --data '' --kernel swiglu
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from kcollect import site_pages
from kcollect.common import DEFAULT_DB
from kcollect.site import build_site

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
# (name, viewport width, height shown): the top of each page, as far as its first answers go
SHOTS = (("overview", "index.html", 1280, 1000), ("overview-phone", "index.html", 390, 1500),
         ("kernel", "KERNEL", 1280, 1100), ("kernel-phone", "KERNEL", 390, 1500))


def draw_charts(page, height: int) -> None:
    """Charts are drawn when they come near the view: those in the part shown, then back to the top."""
    charts = page.locator(".chart:visible")
    for i in range(charts.count()):
        chart = charts.nth(i)
        if chart.bounding_box()["y"] > height:
            break
        chart.scroll_into_view_if_needed()
        chart.locator("svg.main-svg").first.wait_for(state="attached", timeout=20000)
    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_timeout(500)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=DEFAULT_DB)
    ap.add_argument("--data", default="data/runs", help="Parquet history folded in first ('' to skip)")
    ap.add_argument("--config", default="data/site.toml", help="the site's config ('' for none)")
    ap.add_argument("--kernel", default="rms_norm", help="kernel page to capture (default: rms_norm, else the first)")
    ap.add_argument("--out", type=Path, default=Path("docs"))
    args = ap.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("screenshots.py needs Playwright for Python: pip install playwright")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("screenshots.py needs Chromium on PATH: apt-get install chromium")

    with tempfile.TemporaryDirectory() as tmp:
        site = build_site(args.db, Path(tmp) / "site", args.data or None, git_root=Path.cwd(),
                          config=args.config or None).out
        kernels = sorted(p.stem for p in (site / "kernels").glob("*.html"))
        if not kernels:
            sys.exit(f"{args.db} holds no results to show")
        kernel = site_pages.kernel_slugs([args.kernel])[args.kernel] if args.kernel in kernels else kernels[0]
        args.out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=ARGS)
            for name, rel, width, height in SHOTS:
                page = browser.new_page(viewport={"width": width, "height": 800 if width > 500 else 844})
                page.goto((site / (f"kernels/{kernel}.html" if rel == "KERNEL" else rel)).as_uri())
                page.wait_for_load_state("load")
                if rel == "KERNEL":
                    page.wait_for_selector("table.results")
                draw_charts(page, height)
                page.screenshot(path=str(args.out / f"{name}.png"), full_page=True,
                                clip={"x": 0, "y": 0, "width": width, "height": height})
                page.close()
            browser.close()
    print(f"wrote {', '.join(name + '.png' for name, *_ in SHOTS)} ({kernel}) in {args.out} from {args.db}")


if __name__ == "__main__":
    main()
