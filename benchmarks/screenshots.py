"""Screenshots of the dashboard for the README: docs/overview.png, docs/kernel.png,
docs/regressions.png (desktop, 1400 px) and docs/phone.png (the overview at 390 px).

Builds the site from a store the way `kcollect build-site` does (the Parquet history in --data is
folded into --db first), into a temporary folder, opens it in headless Chromium (the Debian package,
driven by Playwright) and saves the pages, with every chart in view drawn. Run it on the real
history so that the README shows real numbers:

    python benchmarks/screenshots.py                       # data/kbench.duckdb + data/runs
    python benchmarks/screenshots.py --db /tmp/x.duckdb --data '' --kernel swiglu
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlencode

from kcollect import site_data, site_pages
from kcollect.site import build_site
from kcollect.store import Store

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def draw_charts(page) -> None:
    """Charts are drawn when scrolled near; visit each, then go back to the top."""
    charts = page.locator(".chart:visible")
    for i in range(charts.count()):
        chart = charts.nth(i)
        chart.scroll_into_view_if_needed()
        chart.locator("svg.main-svg").first.wait_for(state="attached", timeout=20000)
    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_timeout(300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="data/kbench.duckdb")
    ap.add_argument("--data", default="data/runs", help="Parquet history folded in first ('' to skip)")
    ap.add_argument("--kernel", default=None, help="kernel page to capture (default: swiglu, else the first)")
    ap.add_argument("--gpu", default=None, help="device group id shown on the kernel page (default: the first)")
    ap.add_argument("--out", type=Path, default=Path("docs"))
    ap.add_argument("--width", type=int, default=1400)
    args = ap.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("screenshots.py needs Playwright for Python: pip install playwright")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("screenshots.py needs Chromium on PATH: apt-get install chromium")

    with tempfile.TemporaryDirectory() as tmp:
        site = build_site(args.db, Path(tmp) / "site", args.data or None, git_root=Path.cwd()).out
        with Store(args.db, read_only=True) as store:
            data = site_data.load(store)
        slugs = site_pages.kernel_slugs(data.kernels)
        if not data.kernels:
            sys.exit(f"{args.db} holds no results to show")
        kernel = args.kernel or ("swiglu" if "swiglu" in slugs else data.kernels[0])
        if kernel not in slugs:
            sys.exit(f"no kernel {kernel!r} in the store; known: {', '.join(data.kernels)}")
        groups = [g for g in data.groups if kernel in g.kernels]  # GPUs first, the CPU interpreter last
        group = next((g for g in groups if g.id == args.gpu), groups[0])
        mode = next(r["mode"] for r in data.latest[(group.key, kernel)])
        view = "#" + urlencode({"gpu": group.id, "mode": mode})
        args.out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=ARGS)
            page = browser.new_page(viewport={"width": args.width, "height": 900})
            page.goto((site / "index.html").as_uri())
            page.wait_for_load_state("load")
            page.screenshot(path=str(args.out / "overview.png"), full_page=True)
            page.goto((site / "kernels" / f"{slugs[kernel]}.html").as_uri() + view)
            page.wait_for_load_state("load")
            draw_charts(page)
            page.screenshot(path=str(args.out / "kernel.png"), full_page=True)
            page.goto((site / "regressions.html").as_uri())
            page.wait_for_load_state("load")
            page.screenshot(path=str(args.out / "regressions.png"))
            phone = browser.new_page(viewport={"width": 390, "height": 844})
            phone.goto((site / "index.html").as_uri())
            phone.wait_for_load_state("load")
            phone.screenshot(path=str(args.out / "phone.png"))
            browser.close()
    print(f"wrote overview.png, kernel.png ({kernel}, {group.label}, {mode}), regressions.png and phone.png "
          f"in {args.out} from {args.db}")


if __name__ == "__main__":
    main()
