"""Offline sm_90 compile of softmax's default launches and the A/B variants of benchmarks/softmax_ab.py
at its shapes: registers, spills and SASS load/store widths per kernel, no GPU needed.

Each case calls the real softmax_forward / softmax_backward on 'meta' tensors with the Triton
launches recorded instead of run (ab_tools.recorded), so that what is compiled is exactly what the
launchers would launch (kernel, constexprs, num_warps; both launches of the split path), with
arguments specialised as the JIT does (16-byte-aligned pointers, ints divisible by 16 or equal to 1).

    python benchmarks/softmax_compile.py > docs/evidence/softmax_compile.txt
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import compile_report as cr  # noqa: E402  (first: compiles for the GPU, not the interpreter)

import torch  # noqa: E402

from benchmarks.ab_tools import recorded  # noqa: E402
from benchmarks.softmax_ab import SHAPES, VARIANTS  # noqa: E402
from kcollect.kernels import softmax  # noqa: E402

softmax.sm_count = lambda device: 132  # the H200's SMs: persistent grids as launched there

_HIDDEN = ("N_ALIGN",)  # 16 at every A/B width


def _launches(m, n, mode, kw):
    x = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
    calls = []
    with recorded(calls):
        if mode == "fwd":
            softmax.softmax_forward(x, **kw)
        else:
            softmax.softmax_backward(x, x, **kw)
    return calls


def main():
    print(__doc__.splitlines()[0])
    print("bf16, 132 SMs; regs = registers per thread; per SM = programs resident per SM by registers, "
          "threads and shared memory; spills show as LDL/STL (spill loads/stores) and stack bytes per "
          "thread (LOCAL stays 0 with this ptxas); LDG.E.*.128 = 16-byte global loads, LDG.E.64/LDG.E/"
          "LDG.E.U16 narrower (EF/EL = evict_first/evict_last). grid = the launch's grid.\n")
    seen = {}  # a binary already reported (another shape or variant, other grid): named, not recompiled
    for m, n in SHAPES:
        for mode in ("fwd", "bwd"):
            for label, kw, applies, modes in VARIANTS:
                if not applies(m, n) or mode not in modes:
                    continue
                for fn, grid, args, kwargs in _launches(m, n, mode, kw):
                    name = f"{m}x{n} {mode} {label:22s} {fn.fn.__name__} grid {grid}"
                    key = cr.binary_key(fn, args, kwargs)
                    if key in seen:
                        print(f"{name}: same binary as {seen[key]}", flush=True)
                        continue
                    seen[key] = f"{m}x{n} {label}"
                    try:
                        rep, const, _ = cr.compile_launch(fn, args, kwargs)
                        shown = {k: v for k, v in const.items() if k not in _HIDDEN}
                        fits = cr.per_sm(rep["registers"], rep["num_warps"], rep["shared"])
                        print(f"{name} {shown}: {rep['registers']} regs, {rep['num_warps']} warps, {fits} per SM, "
                              f"stack {rep['stack']} B, shared {rep['shared']} B | "
                              + " ".join(f"{k}:{v}" for k, v in rep["sass_ops"].items()), flush=True)
                    except Exception as e:  # a variant that fails to compile is itself evidence
                        print(f"{name}: COMPILE FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
