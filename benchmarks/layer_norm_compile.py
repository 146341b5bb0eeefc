"""Offline sm_90 compile of layer_norm's default launches and the A/B variants of
benchmarks/layer_norm_ab.py at its shapes: registers, spills and SASS load/store widths, no GPU.

Each case calls the real layer_norm_forward / layer_norm_backward on 'meta' tensors with the Triton
launches recorded instead of run (layer_norm_ab.recorded), so that what is compiled is what the
launcher would launch: kernel, constexprs, num_warps. Arguments are specialised as the JIT does
(16-byte-aligned pointers, ints divisible by 16, ints equal to 1).

    python benchmarks/layer_norm_compile.py > docs/evidence/layer_norm_compile.txt
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import compile_report as cr  # noqa: E402  (first: compiles for the GPU, not the interpreter)

import torch  # noqa: E402

from benchmarks.ab_tools import recorded  # noqa: E402
from benchmarks.layer_norm_ab import BWD_VARIANTS, CASES, EPS, FWD_VARIANTS  # noqa: E402
from kcollect.kernels import layer_norm as L  # noqa: E402

_SHOWN = ("ROWS", "BLOCK_N", "BLOCK_C", "CHUNK", "PREFETCH", "POLICY", "W_RELOAD")


def main():
    print(__doc__.splitlines()[0])
    print("bf16; regs = registers per thread; stack = spill bytes per thread (cuobjdump reports spills "
          "under STACK; LDL/STL = spill loads/stores); LDG.E.128 = 16-byte global loads; per SM = programs "
          "resident per SM by registers, threads and shared memory.\n")
    done = set()
    for mode, m, n in CASES:
        if (mode, n) in done:  # M changes the grid only, not the binary
            continue
        done.add((mode, n))
        x = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
        w = torch.empty(n, dtype=torch.bfloat16, device="meta")
        if mode == "fwd":
            variants = [(label, lambda kw=kw(n): L.layer_norm_forward(x, w, w, EPS, **kw)) for label, kw in FWD_VARIANTS]
        else:
            st = torch.empty(m, dtype=torch.float32, device="meta")
            variants = [(label, lambda kw=kw(n): L.layer_norm_backward(x, x, w, st, st, **kw))
                        for label, kw in BWD_VARIANTS]
        seen = {}
        for label, call in variants:
            calls = []
            with recorded(calls):
                call()
            for fn, _, args, kwargs in calls:
                if fn.fn.__name__ == "_ln_sum_partials":  # the backward's small dw/db epilogue: same in all
                    continue
                name = f"{mode} {n:5d} {label:34s}"
                key = (fn.fn.__name__, tuple(sorted(kwargs.items())))
                if key in seen:
                    print(f"{name} {fn.fn.__name__}: same as {seen[key]}", flush=True)
                    continue
                seen[key] = label
                try:
                    rep, const, _ = cr.compile_launch(fn, args, kwargs)
                    shown = {k: v for k, v in const.items() if k in _SHOWN}
                    print(f"{name} {fn.fn.__name__}{shown} {rep['num_warps']}w, "
                          f"{cr.per_sm(rep['registers'], rep['num_warps'], rep['shared'])} per SM, stack {rep['stack']} B | "
                          + cr.format_report("", rep)[2:], flush=True)
                except Exception as e:  # a variant that fails to compile is itself evidence
                    print(f"{name} {fn.fn.__name__}: COMPILE FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
