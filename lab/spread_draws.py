"""One error is one draw: the fp32 worst cases of an awkward sweep's results file, run again on
inputs each moved by one fp32 rounding (lab.awkward.common.rounded; draw 0: the case as drawn),
printing for each part, draw by draw, ours' and eager's errors against the float64 answer of those
inputs and the part's spread there (common.draw_errors), with each row's median (what
common._rounded_medians judges a part over its gate by), and a summary: how often
ours' error is over eager's.

    PYTHONPATH=. python -m lab.spread_draws FILE [--draws 8] [--device cpu]
"""
from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.spread_draws", description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from lab.awkward import common, sweep

    over = total = 0
    for case in sweep.worst_cases(Path(args.file)):
        family = next(f for f in sweep.FAMILIES if case["op"] in sweep.ops_of(f))
        s = sweep.family_module(family).subject(case, args.device)
        if s.dtype in common.LOW_PRECISION:
            continue
        rows = [common.draw_errors(s, k) for k in range(args.draws)]
        print(f"{case['op']} {case['dtype']} {case['dims']} {case['options']} seed {case['seed']}")
        if any(r is None for r in rows):
            print("  a call failed on some rounding: no draws to show")
            continue
        names = common.part_names(s, len(rows[0][0]) - len(s.grad_inputs))
        for i, name in enumerate(names):
            for label, j in (("ours", 0), ("eager", 1), ("spread", 2)):
                xs = [r[j][i] for r in rows]
                lo = min((x for x in xs if x > 0), default=0.0)
                apart = f"{max(xs) / lo:6.1f}x" if lo else "     -"
                print(f"  {name if j == 0 else '':12s} {label:6s} {' '.join(f'{x:.1e}' for x in xs)}  max/min {apart}"
                      f"  median {statistics.median(xs):.1e}")
            pairs = [(r[0][i], r[1][i]) for r in rows if r[1][i] > 0]
            over += sum(a > b for a, b in pairs)
            total += len(pairs)
    print(f"\nours' error over eager's in {over} of {total} (case, part, draw) triples")


if __name__ == "__main__":
    main()
