"""Whether this checkout's regression analysis is exactly that of another commit: the check for a
change meant to make the analysis faster and nothing else.

Both analyse the same store (the committed history data/runs, or `--copies N` times it as
benchmarks/site_history8.py makes it) with the code of their own checkout: every series' result
(points, noise at each point, each judged line with its verdict, z and p, flags, slides) and the
site's view of them (site_flags.analyse: the flags, noise and changes the pages show), written as
repr() so that any float differing in its last bit differs (the site's lists compared as sets: their
order follows the order DuckDB returns the rows in, which no query fixes, and so does an event's
before_ci, left out). Prints what differs.

    python benchmarks/same_analysis.py --against main              # the committed history, with git
    python benchmarks/same_analysis.py --against main --copies 8 --no-git
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in the checkout whose code is measured (its collector/ imported as kcollect): one digest per
# series, then one of the site's view, as 'name digest' lines.
DIGESTS = """
import hashlib, sys
from pathlib import Path
from kcollect import codechange, regress, site_data, site_flags
from kcollect.store import Store
db, git = sys.argv[1], sys.argv[2] or None
with Store(Path(db), read_only=True) as store:
    store.con.execute("SET enable_progress_bar = false")  # drawn on stdout where a query runs long
    data = site_data.load(store)
code = codechange.Repo(git) if git else None
# the engine's series as the site reads them (SiteData.series; checkouts before it: its rows)
results = (regress.walk(data.series, data.ours, None, code) if hasattr(data, "series")
           else regress.analyse(data.history, None, code))
for key in sorted(results, key=repr):
    print(repr(tuple(key)), hashlib.sha256(repr(results[key]).encode()).hexdigest())
view = site_flags.analyse(data, git_root=git)
# an event's before_ci was the point before the change of the first series that met it, in the
# order DuckDB returns the trends (no query fixes it), in checkouts before site_flags took the
# latest of them: left out, so that such a checkout can be compared
view.events = [{k: v for k, v in e.items() if k != "before_ci"} for e in view.events]
for name, value in vars(view).items():  # as sets: their order follows the store's, which no query fixes
    items = value.items() if isinstance(value, dict) else value
    print(f"site_flags.{name}", hashlib.sha256(repr(sorted(map(repr, items))).encode()).hexdigest())
"""


def digests(checkout: Path, db: Path, git: Path | None, work: Path) -> dict[str, str]:
    """{series (or 'site_flags.<field>'): digest} as the code of `checkout` computes them."""
    pkg = work / f"pkg-{hashlib.sha256(str(checkout).encode()).hexdigest()[:8]}"
    pkg.mkdir(exist_ok=True)
    if not (pkg / "kcollect").exists():
        (pkg / "kcollect").symlink_to(checkout / "collector", target_is_directory=True)
    out = subprocess.run([sys.executable, "-c", DIGESTS, str(db), str(git or "")], check=True, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(pkg))).stdout
    return dict(line.rsplit(" ", 1) for line in out.splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, metavar="REF", help="the commit whose analysis this one must equal")
    ap.add_argument("--copies", type=int, default=1, help="the committed history this many times over")
    ap.add_argument("--no-git", action="store_true", help="git not asked whose code changed (as site_history8.py)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from site_history8 import history

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        other = work / "other"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(other), args.against], check=True,
                       capture_output=True)
        try:
            db = work / "history.duckdb"
            history(db, args.copies)
            git = None if args.no_git else ROOT
            ours, theirs = digests(ROOT, db, git, work), digests(other, db, git, work)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], check=True)
    differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    for k in differ[:20]:
        print(f"differs: {k}")
    print(f"{sum(not k.startswith('site_flags.') for k in ours)} series, {args.copies}x the committed history: "
          + (f"{len(differ)} differ from {args.against}" if differ else f"the same analysis as {args.against}"))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
