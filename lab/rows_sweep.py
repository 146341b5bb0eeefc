"""Held-out shapes for the memory-bound family: ours ("triton") against float64 on shapes the grids
and tests do not use, drawn at random from each op's quick-grid dims.

    PYTHONPATH=. python -m lab.rows_sweep --cases 400 --seed 77 [--ops rms_norm,softmax] [--device cpu]

Each case takes a quick-grid shape of a random op, replaces each size (an int above 1) with one of
SIZES (1, primes, powers of two and their neighbours, up to 8191), keeps the elements under
--max-elements (the CPU interpreter's time; up to 200 draws an op, for ops of many dims), and checks
one random mode and dtype the op claims with fresh inputs (collector's verify.check: the op's own
tolerance). A case over the tolerance is checked with eager on the same inputs, so that a failure of
the shape itself (eager over too) shows as such. Prints each failure and a count per op."""
from __future__ import annotations

import argparse
import importlib
import math
import os
import random
import sys
import time
from collections import Counter

OPS = ("add_rms_norm", "rms_norm", "layer_norm", "softmax", "cross_entropy", "gelu", "geglu", "swiglu",
       "fp8_quant", "fused_linear_cross_entropy", "rope")
SIZES = (1, 2, 3, 5, 7, 8, 16, 17, 31, 64, 100, 127, 128, 255, 257, 1000, 1024, 2049, 4099, 8191)


def elements(dims: dict) -> int:
    return math.prod(v for v in dims.values() if type(v) is int)


def draw(rng: random.Random, spec, max_elements: int) -> dict | None:
    """A shape of the op (None where the draw is too big or the op refuses it)."""
    template = rng.choice(list(spec.grids["quick"])).dims
    dims = {k: rng.choice(SIZES) if type(v) is int and v > 1 else v for k, v in template.items()}
    return dims if elements(dims) <= max_elements and spec.check_shape(dims) is None else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.rows_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated ops (default: the memory-bound family)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--max-elements", type=int, default=300_000)
    args = ap.parse_args(argv)
    ops = args.ops.split(",")
    if unknown := sorted(set(ops) - set(OPS)):
        ap.error(f"unknown ops {unknown}; valid: {', '.join(OPS)}")
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    import torch

    from kcollect import verify

    specs = {op: importlib.import_module(f"kcollect.kernels.{op}.spec").SPEC for op in ops}
    rng, tried, bad, t0 = random.Random(args.seed), Counter(), Counter(), time.time()
    while sum(tried.values()) < args.cases:
        op = rng.choice(ops)
        spec = specs[op]
        dims = next(filter(None, (draw(rng, spec, args.max_elements) for _ in range(200))), None)  # ops of many dims
        dtype, mode = rng.choice(spec.dtypes), rng.choice(spec.modes)
        if dims is None or (dtype == torch.bfloat16 and elements(dims) < 256):
            continue  # bf16 under 256 elements: too few for a relative error (tests/opcheck.py)
        tried[op] += 1
        seed = rng.randrange(2**31)
        try:
            r = verify.check(spec, "triton", dims, dtype, mode, seed=seed, device=args.device)
            if r.error <= r.tolerance:
                continue
            e = verify.check(spec, "torch", dims, dtype, mode, seed=seed, device=args.device)
            why = f"error {r.error:.3g} > {r.tolerance:.3g} (eager {e.error:.3g})"
        except Exception as ex:  # a crash is a finding, not the sweep's end
            why = f"{type(ex).__name__}: {str(ex)[:200]}"
        bad[op] += 1
        print(f"FAIL {op} {mode} {str(dtype)[6:]} {dims} seed {seed}: {why}", flush=True)
    print(f"{sum(tried.values())} cases, {sum(bad.values())} failed, {time.time() - t0:.0f} s; per op (failed/cases): "
          + ", ".join(f"{op} {bad[op]}/{tried[op]}" for op in sorted(tried)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
