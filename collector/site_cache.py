"""What a rebuild of the site can reuse, kept in a cache folder (by default the user's kcollect
cache, `site/` in it): the regression analysis of the history, and whether the run folders changed
since the last import.

The analysis is cached whole, keyed by a digest of everything it reads: the engine's rows (a digest
the store computes, site_data.HISTORY_DIGEST), the site's trend points (site_data.POINTS_DIGEST), conditions and commits, what
git knows of the history's commits, and the analysis code itself. Not series by series: the verdict
engine judges the series of one commit together (machine drift, false-discovery rate) and shrinks
each series' noise towards its siblings', so one new run can change any series' verdicts. The
import of data/runs is skipped when neither the run folders (names, sizes, times) nor the store
file changed since the import that last wrote it.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

from . import codechange, noise, regress, series, site_data, site_flags, stability, verdicts
from .site_data import SiteData

# The code whose answers are cached: a change to any of it invalidates the cache.
ENGINE = hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in (site_flags, regress, noise, verdicts, series,
                                                                        stability, codechange, site_data))
                        + Path(__file__).read_bytes()).hexdigest()[:16]


class Cache:
    """A folder of cached results; None-safe helpers keep the callers free of `if cache`."""

    def __init__(self, root: Path):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def read(self, name: str) -> Any:
        try:
            with open(self.root / name, "rb") as f:
                return pickle.load(f)
        except (OSError, pickle.PickleError, EOFError, AttributeError, ImportError, ValueError):
            return None  # no cache yet, or one from another kcollect: rebuilt

    def write(self, name: str, value: Any) -> None:
        tmp = self.root / f".{name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(self.root / name)

    @staticmethod
    def key(path: Path) -> str:
        return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]


# -- the analysis -------------------------------------------------------------------------------


def git_known(git_root: str | Path | None, commits) -> str | None:
    """What git at git_root says of each commit (its full name, or missing), in one `git cat-file
    --batch-check`: all the engine's code changes depend on. None without git."""
    if git_root is None:
        return None
    names = sorted({c for c in commits if c})
    return codechange.git(git_root, "cat-file", "--batch-check", stdin="".join(c + "\n" for c in names)) or "no git"


def _items(d: dict) -> list:
    """A dict's items at every depth, sorted by key: equal dicts give one text, whatever order the
    store returned their rows in."""
    return sorted((k, _items(v) if isinstance(v, dict) else v) for k, v in d.items())


def digest(data: SiteData, git_root: str | Path | None) -> str:
    """The key of one analysis: everything site_flags.analyse reads (see the module docstring)."""
    groups = [(g.key, g.kind, [c["sha"] for c in g.commits]) for g in data.groups]
    payload = [ENGINE, data.history_digest, data.trends_digest, _items(data.conditions), _items(data.last_ci),
               groups, git_known(git_root, data.history_commits)]
    return hashlib.sha256(repr(payload).encode()).hexdigest()


def analyse(data: SiteData, cache: Cache | None, git_root: str | Path | None = None) -> site_flags.Analysis:
    """site_flags.analyse of the whole history, from the cache where nothing it reads changed.
    `git_root`: the checkout that says whose code changed (None: git is not asked)."""
    if cache is None:
        return site_flags.analyse(data, git_root=git_root)
    name = "analysis.pickle"
    key = digest(data, git_root)
    old = cache.read(name)
    if old is not None and old[0] == key:
        return old[1]
    analysis = site_flags.analyse(data, git_root=git_root)
    cache.write(name, (key, analysis))  # one analysis kept: the file does not grow
    return analysis


# -- the import of data/runs ------------------------------------------------------------------


def folders_stamp(data_dir: Path) -> list:
    """What an import of data_dir depends on: every file under it, with its size and time."""
    out = []
    for root, dirs, files in os.walk(data_dir):
        dirs.sort()
        for f in sorted(files):
            st = os.stat(os.path.join(root, f))
            out.append([os.path.relpath(os.path.join(root, f), data_dir), st.st_size, st.st_mtime_ns])
    return out


def _db_stamp(db: Path) -> list | None:
    try:
        st = db.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def import_unchanged(cache: Cache | None, db: Path, data_dir: Path) -> tuple[list, list | None]:
    """(the folders' stamp now, the problems the last import met) where neither the folders nor the
    store changed since that import; (the stamp, None) where an import is due."""
    stamp = folders_stamp(data_dir)
    if cache is None:
        return stamp, None
    last = cache.read(f"import-{Cache.key(db)}.pickle")
    if last and last["folders"] == stamp and last["db"] == _db_stamp(db):
        return stamp, last["problems"]
    return stamp, None


def imported(cache: Cache | None, db: Path, stamp: list, problems: list) -> None:
    if cache is not None:
        cache.write(f"import-{Cache.key(db)}.pickle", {"folders": stamp, "db": _db_stamp(db), "problems": problems})
