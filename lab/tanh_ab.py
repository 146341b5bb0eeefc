"""A/B of the recurrent kernels' fast (bf16/fp16) tanh on a GPU: each variant replaces
kernels/_jit/recurrent.py's `tanh` before any kernel compiles, in its own process (Triton keys its
caches by the source of what a kernel calls, so each variant compiles its own), and times our
kernels at a few shapes through lab.cells_tune (the collector's gate against float64, then its
CUDA-graph timing). Rounds of every variant in turn, so that a drift moves them alike.

    python -m lab.tanh_ab --rounds 2 --ops slstm,lstm     # on a GPU machine
    python -m lab.tanh_ab --ops slstm --modes bwd --variants main,series,sigmoid \
        --shape B=32,NH=4,T=60,DH=64,resets=0.1 --shape B=64,NH=16,T=256,DH=64,resets=0.1

Variants: `main` (recurrent.tanh as it is: on the GPU since 9333553 its tanh.approx.f32, one MUFU
instruction, relative error about 2^-11; `approx` in lab/results/tanh_ab_h200.txt), `series`
(recurrent.tanh_series, the interpreter's form: main on the GPU from e10d61d to 9333553) and
`sigmoid` (2 sigmoid(2x) - 1 everywhere: before e10d61d, whose absolute error wiped out small tanh
values)."""
from __future__ import annotations

import argparse
import subprocess
import sys

import triton
import triton.language as tl

from kcollect.kernels._jit import recurrent

SHAPES = {"slstm": ("B=2,NH=4,T=256,DH=64,resets=0", "B=8,NH=8,T=1024,DH=64,resets=0"),
          "lstm": ("B=64,T=256,H=512,resets=0.1",)}


@triton.jit
def _sigmoid_form(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


VARIANTS = {"main": None, "series": recurrent.tanh_series, "sigmoid": _sigmoid_form}


def child(variant: str, ops: list[str], modes: str, shapes: list[str]) -> int:
    if VARIANTS[variant] is not None:
        recurrent.tanh = VARIANTS[variant]
    from lab import cells_tune

    for op in ops:
        argv = ["--ops", op, "--modes", modes, "--only", "default", "--peers", ""]
        for shape in shapes or SHAPES[op]:
            argv += ["--shape", shape]
        print(f"## variant {variant}", flush=True)
        cells_tune.main(argv)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.tanh_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ops", default="slstm,lstm")
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--variants", default="series,sigmoid,main")
    ap.add_argument("--shape", action="append", default=[], help="a shape label instead of the op's shapes "
                                                                     "above (repeatable; with one op)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    if args.child:
        return child(args.child, ops, args.modes, args.shape)
    for r in range(args.rounds):
        for variant in args.variants.split(","):
            print(f"# round {r + 1}, variant {variant}", flush=True)
            shapes = [a for shape in args.shape for a in ("--shape", shape)]
            subprocess.run([sys.executable, "-m", "lab.tanh_ab", "--child", variant, "--ops", args.ops,
                            "--modes", args.modes, *shapes], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
