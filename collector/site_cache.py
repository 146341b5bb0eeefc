"""What a rebuild of the site can reuse, kept in a cache folder (by default the user's kcollect
cache, `site/` in it): the regression analysis of each part of the history, and whether the run
folders changed since the last import.

The analysis is run series by series, each keyed by a digest of everything it reads (its points
and their conditions, the commits they point into, the commit of its case's latest run) and of the
analysis code itself; a rebuild analyses only the series whose history changed. The
import of data/runs is skipped when neither the run folders (names, sizes, times) nor the store
file changed since the import that last wrote it.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import noise, regress, site_flags
from .site_data import SiteData

# The code whose answers are cached: a change to any of it invalidates every part.
ENGINE = hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in (site_flags, regress, noise))
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


# -- the analysis, part by part ---------------------------------------------------------------


def _series_digest(data: SiteData, key: tuple, provider: str, shape: str, points: list) -> str:
    gkey, kernel, _, dtype = key
    g = data.group(gkey)
    conds = sorted(set(points[4]))
    payload = [ENGINE, key, provider, shape, g.kind, points,
               [[c, sorted(data.conditions[c].items(), key=str)] for c in conds],
               [g.commits[i]["sha"] for i in sorted(set(points[0]))], data.last_ci.get((gkey, kernel, shape, dtype))]
    return hashlib.sha256(pickle.dumps(payload, protocol=4)).hexdigest()


def analyse(data: SiteData, cache: Cache | None) -> site_flags.Analysis:
    """site_flags.analyse over the whole history, series by series, each taken from the cache where
    its inputs did not change: its points and their conditions, the commits they point into (their
    hashes, so that a commit inserted before them counts), the commit of its case's latest run. The
    series are independent: each one (and each change of its conditions) is analysed on its own
    points only, which test_site checks against the analysis of the whole."""
    if cache is None:
        return site_flags.analyse(data)
    name = f"analysis-{ENGINE}.pickle"
    old = cache.read(name) or {}
    new, parts = {}, []
    for key, providers in data.exact_trends.items():
        for provider, shapes in providers.items():
            for shape, points in shapes.items():
                digest = _series_digest(data, key, provider, shape, points)
                part = old.get(digest)
                if part is None:
                    part = site_flags.analyse(replace(data, exact_trends={key: {provider: {shape: points}}}))
                new[digest] = part
                parts.append(part)
    if new.keys() != old.keys():
        cache.write(name, new)  # only the series this history has: the file does not grow forever
    return merge(parts)


def merge(parts: list[site_flags.Analysis]) -> site_flags.Analysis:
    """One Analysis from those of disjoint parts of the history (series), as site_flags.analyse would
    give for the whole: a change of conditions at one commit counts the series of every part it
    touched."""
    out = site_flags.Analysis([], {}, [], [])
    events: dict[tuple, dict[str, Any]] = {}
    for p in parts:
        out.flags += p.flags
        out.noise.update(p.noise)
        out.changes += p.changes
        for e in p.events:
            k = (e["gkey"], e["ci"], e["kind"], e["what"])
            if k not in events:
                events[k] = dict(e, kernels=set(e["kernels"]))
            else:
                events[k]["series"] += e["series"]
                events[k]["moved"] += e["moved"]
                events[k]["kernels"].update(e["kernels"])
    for e in events.values():
        e["kernels"] = sorted(e["kernels"])
    out.events = sorted(events.values(), key=lambda e: (e["gkey"], -e["ci"], e["kind"]))
    return out


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
