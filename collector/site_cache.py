"""What a rebuild of the site can reuse, kept in a cache folder (by default the user's kcollect
cache, `site/` in it): the regression analysis of each part of the history, and whether the run
folders changed since the last import.

The analysis is run per (GPU, kernel, mode, dtype), each part keyed by a digest of everything it
reads (its series' points and conditions, the commits they point into, the rows' latest commits)
and of the analysis code itself; a rebuild analyses only the parts whose history changed. The
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


def _part_digest(data: SiteData, key: tuple, providers: dict[str, dict[str, list]]) -> str:
    gkey, kernel, _, dtype = key
    g = data.group(gkey)
    series = sorted((p, s, v) for p, shapes in providers.items() for s, v in shapes.items())
    conds = sorted({c for *_, v in series for c in v[4]})
    top = max((i for *_, v in series for i in v[0]), default=-1)
    payload = [ENGINE, key, g.kind, series, [[c, sorted(data.conditions[c].items(), key=str)] for c in conds],
               [c["sha"] for c in g.commits[:top + 1]],
               [data.last_ci.get((gkey, kernel, s, dtype)) for s in sorted({s for _, s, _ in series})]]
    # pickle of plain lists in a sorted order: the same bytes for the same inputs, and fast
    return hashlib.sha256(pickle.dumps(payload, protocol=4)).hexdigest()


def analyse(data: SiteData, cache: Cache | None) -> site_flags.Analysis:
    """site_flags.analyse over the whole history, its parts taken from the cache where their inputs
    did not change. The parts are independent: each series (and each change of its conditions) is
    analysed on its own points only."""
    if cache is None:
        return site_flags.analyse(data)
    name = f"analysis-{ENGINE}.pickle"
    old = cache.read(name) or {}
    new, parts = {}, []
    for key, providers in data.exact_trends.items():
        digest = _part_digest(data, key, providers)
        part = old.get(digest)
        if part is None:
            part = site_flags.analyse(replace(data, exact_trends={key: providers}))
        new[digest] = part
        parts.append(part)
    if new.keys() != old.keys():
        cache.write(name, new)  # only the parts this history has: the file does not grow forever
    return merge(parts)


def merge(parts: list[site_flags.Analysis]) -> site_flags.Analysis:
    """One Analysis from those of disjoint parts of the history, as site_flags.analyse would give
    for the whole: a change of conditions at one commit counts the series of every part it touched."""
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
