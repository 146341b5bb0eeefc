"""`kcollect run --profile DIR`: a cProfile of each measuring process, for finding where the wall
time goes when the breakdown of `runs.phases` is not enough (its "other" is what no phase claims)."""
from __future__ import annotations

import cProfile
import pstats
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


@contextmanager
def profiled(folder: str | None, stem: Callable[[], str]) -> Iterator[None]:
    """Profiles the block when `folder` is given, then writes FOLDER/STEM.prof (for pstats or
    snakeviz) and FOLDER/STEM.txt (the 80 functions with the most cumulative time); `stem` is read
    at the end (a run's id is known only once it has started)."""
    if not folder:
        yield
        return
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        name = stem()
        profile.dump_stats(out / f"{name}.prof")
        with open(out / f"{name}.txt", "w") as f:
            pstats.Stats(profile, stream=f).sort_stats("cumulative").print_stats(80)
