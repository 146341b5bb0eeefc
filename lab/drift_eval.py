"""The machine drift's time per call (verdicts.Drift), judged on the committed history: the series
whose code never changes (every provider that is not ours) walked as the gate and the history walk
them, once with the drift fitted as the engine fits it and once with its level alone (the median
change, as before the time per call), on each GPU. A 'moved' verdict or a flag on such a series is
the machine's, not code's: what a line of ours would have been called had it stood there. Nothing
here was tuned on the H100's runs: they are the held-out half.

    PYTHONPATH=. python -m lab.drift_eval [--db data/kbench.duckdb]
"""
from __future__ import annotations

import argparse
from collections import Counter
from unittest import mock

from kcollect import regress, verdicts
from kcollect.noise import DURATION_CLASSES, duration_class
from kcollect.series import QUERY
from kcollect.store import Store


def tally(rows: list[dict]) -> dict[str, Counter]:
    """Per GPU: lines judged, 'moved' verdicts and flags of the series not ours, by duration class."""
    out: dict[str, Counter] = {}
    for key, r in regress.analyse(rows).items():
        if r.ours or key.gpu == "cpu":
            continue
        c = out.setdefault(key.gpu, Counter())
        for line in r.lines[1:]:
            if line is not None and line.verdict not in ("unstable", "timing changed", "other machine"):
                klass = duration_class(line.a.point.median_ms) if line.a.point else "-"
                c["lines", klass] += 1
                c["moved", klass] += line.verdict == "moved"
        for f in r.flags:
            if f.cause is None:
                c["flags", duration_class(r.points[f.index - 1].median_ms)] += 1
        c["series"] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="data/kbench.duckdb")
    args = ap.parse_args()
    with Store(args.db, read_only=True) as store:
        rows = store.query(QUERY)
    fitted = tally(rows)
    with mock.patch.object(verdicts, "MIN_SHORT", 10 ** 9):  # never enough short lines: the level alone
        level = tally(rows)
    classes = [name for _, name in DURATION_CLASSES]
    print("series not ours: 'moved' verdicts of the gate (per line) and flags (per series), "
          "the drift's level alone -> level and time per call")
    for gpu in sorted(fitted):
        a, b = level[gpu], fitted[gpu]
        print(f"\n{gpu}: {b['series']} series")
        for klass in classes:
            n = b["lines", klass]
            if n:
                print(f"  {klass:<12} {n:6d} lines: moved {a['moved', klass]:4d} ({a['moved', klass] / n:.2%}) -> "
                      f"{b['moved', klass]:4d} ({b['moved', klass] / n:.2%});  flags {a['flags', klass]:4d} -> "
                      f"{b['flags', klass]:4d}")
        lines = sum(b["lines", k] for k in classes)
        print(f"  {'all':<12} {lines:6d} lines: moved {sum(a['moved', k] for k in classes):4d} -> "
              f"{sum(b['moved', k] for k in classes):4d};  flags {sum(a['flags', k] for k in classes):4d} -> "
              f"{sum(b['flags', k] for k in classes):4d}")


if __name__ == "__main__":
    main()
