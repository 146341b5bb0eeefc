"""How often the cells sweep's fp32 bar fails a valid fp32 computation: eager itself, its sums over
hidden units in another order (a random permutation of the units, as lab.awkward.cells._rejudge
makes them), judged by the sweep's rules against eager in its own order (common.gate: 2x eager's
error, 2x the part's spread under one rounding of the inputs) and then against K other
permutations (the rejudge: 2x the largest of their errors). No kernel of ours is in it: the rate
it reports is the bar's false alarms, by K, for choosing REORDERINGS on data our kernels did not
make.

    python -m lab.rejudge_calibration --ops lstm --gates saturated --cases 40 --seed 1

Cases are the GPU sweep's own draws (its shapes, reset masks, scales and layouts), fp32 only, run
on the CPU in float64 and fp32."""
from __future__ import annotations

import argparse
import math
import random
import sys

import torch

from .awkward import cells, common

KS = (0, 4, 8, 16)  # reorderings the bar may run: 0 is the bar without the rejudge


def _errors_under(subject, dys, want, permuted, n, axis_size, seed):
    """Errors (part by part) of eager under n random unit permutations."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = torch.randperm(axis_size, generator=g)
        out.append(common._errors(common._run(permuted(subject.eager, p), subject, dys), want, subject.log_scale))
    return out


def judge(case: dict) -> dict | None:
    """{k: whether a valid order of eager fails the bar with k reorderings}, and the worst ratio of
    its error to the bar without the rejudge; None where eager has no answer."""
    subject = cells.subject(case, "cpu")
    want_outs, want_grads, dys = common._reference(subject)
    want = (*want_outs, *want_grads)
    eager = common._errors(common._run(subject.eager, subject, dys), want, subject.log_scale)
    spread = common._spread(subject, dys, want)
    axis, permuted = cells._PERMUTED[case["op"]]
    runs = _errors_under(subject, dys, want, permuted, 1 + max(KS), case["dims"][axis], case["seed"] + 5)
    if eager is None or any(r is None for r in runs):
        return None
    valid, others = runs[0], runs[1:]
    bars = [common.gate(torch.float32, subject.tolerance, e, s) for e, s in zip(eager, spread)]
    fails = {}
    for k in KS:
        fails[k] = any(not err <= max(bar, common.FP32_FACTOR * max(
            (o[part] for o in others[:k] if math.isfinite(o[part])), default=0.0))  # as the rejudge: finite only
            for part, (err, bar) in enumerate(zip(valid, bars)))
    return {"fails": fails, "worst": max(err / bar for err, bar in zip(valid, bars))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="lstm", help="comma-separated, of lstm, slstm, mlstm")
    parser.add_argument("--gates", default="", help="keep only cases of this gate mode (e.g. saturated)")
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    ops = set(args.ops.split(","))
    if not ops <= set(cells._PERMUTED):
        parser.error(f"--ops: {', '.join(sorted(ops - set(cells._PERMUTED)))} not one of {', '.join(cells._PERMUTED)}")
    rng = random.Random(args.seed)
    judged, tries = [], 0
    while len(judged) < args.cases and tries < 1000 * args.cases:
        tries += 1
        case = cells.draw(rng, "cuda")
        if case["op"] not in ops or case["dtype"] != "float32" or case["refusal"] or (
                args.gates and case["options"]["gates"] != args.gates):
            continue
        verdict = judge(case)
        if verdict is None:
            continue
        judged.append(verdict)
        print(f"{len(judged):4d} {case['op']} {case['dims']} {case['options']['gates']} worst {verdict['worst']:.2f}x "
              f"of the bar; fails with k reorderings: {[k for k, f in verdict['fails'].items() if f]}", flush=True)
    n = len(judged)
    print(f"\n{n} fp32 cases ({args.ops}{', gates ' + args.gates if args.gates else ''}, seed {args.seed}): "
          "a valid order of eager failing the sweep's bar")
    for k in KS:
        bad = sum(v["fails"][k] for v in judged)
        print(f"  {k:2d} reorderings: {bad} of {n} ({100 * bad / max(n, 1):.1f}%)")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
