"""One error is one draw: the worst cases of an awkward sweep's results file, run again on inputs
each moved by one fp32 rounding (a few of their elements a step up or down, seeded), printing for
each part the errors of ours and eager's against the float64 answer of those inputs, draw by draw;
then the part's spread (lab.awkward.common._spread) under as many of its own draws of the
rounding, on the case as drawn; and a summary: how often ours' error is over eager's, and how far
apart each one's draws are.

    PYTHONPATH=. python -m lab.spread_draws FILE [--draws 8] [--device cpu]
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def _moved(base: dict, draw: int):
    """make_inputs for draw `draw`: the case's inputs, each floating element moved one fp32 step up
    or down with probability 2/5 each (draw 0: as drawn)."""
    import torch

    def make():
        g = torch.Generator().manual_seed(1000 + draw)
        out = {}
        for n, v in base.items():
            if torch.is_tensor(v) and v.is_floating_point() and draw:
                u = torch.randint(-2, 3, v.shape, generator=g).to(v.device)
                up = torch.nextafter(v, torch.full_like(v, math.inf))
                down = torch.nextafter(v, torch.full_like(v, -math.inf))
                out[n] = torch.where(u > 0, up, torch.where(u < 0, down, v)).detach().clone()
            else:
                out[n] = v.clone() if torch.is_tensor(v) else v
        return out

    return make


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.spread_draws", description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from dataclasses import replace

    from lab.awkward import common, sweep

    over = total = 0
    for case in sweep.worst_cases(Path(args.file)):
        family = next(f for f in sweep.FAMILIES if case["op"] in sweep.ops_of(f))
        s = sweep.family_module(family).subject(case, args.device)
        if s.dtype in common.LOW_PRECISION:
            continue
        base = s.make_inputs()
        rows = []
        for k in range(args.draws):
            sub = replace(s, make_inputs=_moved(base, k))
            want_outs, want_grads, dys = common._reference(sub)
            want = (*want_outs, *want_grads)
            rows.append((common._errors(common._run(sub.ours, sub, dys), want, sub.log_scale),
                         common._errors(common._run(sub.eager, sub, dys), want, sub.log_scale)))
        want_outs, want_grads, dys = common._reference(s)
        spreads = [common._spread(s, dys, (*want_outs, *want_grads), (), k) for k in range(args.draws)]
        rows = [(*r, sp) for r, sp in zip(rows, spreads)]
        print(f"{case['op']} {case['dtype']} {case['dims']} {case['options']} seed {case['seed']}")
        names = [f"output {i}" for i in range(len(rows[0][0]) - len(s.grad_inputs))] + [f"d{n}" for n in s.grad_inputs]
        for i, name in enumerate(names):
            for label, j in (("ours", 0), ("eager", 1), ("spread", 2)):
                xs = [r[j][i] for r in rows]
                lo = min((x for x in xs if x > 0), default=0.0)
                apart = f"{max(xs) / lo:7.1f}x" if lo else "      -"
                print(f"  {name if j == 0 else '':12s} {label:6s} {' '.join(f'{x:.1e}' for x in xs)}  max/min {apart}")
            pairs = [(r[0][i], r[1][i]) for r in rows if r[1][i] > 0]
            over += sum(a > b for a, b in pairs)
            total += len(pairs)
    print(f"\nours' error over eager's in {over} of {total} (case, part, draw) triples")


if __name__ == "__main__":
    main()
