"""Offline sm_90 compile of fp8_quant's default and A/B launches (benchmarks/fp8_quant_ab.py).

Registers, spills, SASS load/store widths and compile time at the A/B's shapes, no GPU.

Each case calls the real fp8_quant_forward on 'meta' tensors with the Triton launches recorded
instead of run (ab_tools.recorded), with the H200's 132 SMs for the persistent grids, so that
what is compiled is what the launcher would launch there (kernel, constexprs, num_warps). Arguments
are specialised as the JIT does (16-byte-aligned pointers, ints divisible by 16, ints equal to 1).

    python benchmarks/fp8_quant_compile.py > docs/evidence/fp8_quant_compile.txt
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import compile_report as cr  # noqa: E402  (first: compiles for the GPU, not the interpreter)

import torch  # noqa: E402

from benchmarks.ab_tools import recorded  # noqa: E402
from benchmarks.fp8_quant_ab import CASES  # noqa: E402
from kcollect.kernels import fp8_quant as K  # noqa: E402

H200_SMS = 132
SHOWN = ("BM", "G", "GW", "ROWS_PER_PROGRAM", "PAIRS", "CHUNK", "P1", "P2", "POLICY")


def main():
    print(__doc__.splitlines()[0])
    print("bf16 in; regs = registers per thread; stack = spill bytes per thread (LDL/STL = spill "
          "loads/stores); LDG.E.128 = 16-byte global loads; per SM = programs resident per SM by "
          "registers and threads; compile = seconds for this offline compile (near 0: from Triton's cache; a first GPU launch pays "
          "about the uncached time).\n")
    K.sm_count = lambda device: H200_SMS  # the launcher's grid as on the H200
    for gran, m, n, variants in CASES:
        x = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
        seen = {}
        for label, kw in variants:
            calls = []
            with recorded(calls):
                K.fp8_quant_forward(x, gran, emulate=False, **kw)
            for fn, grid, args, kwargs in calls:
                name = f"{gran:7s} {m}x{n} {label:28s}"
                key = (fn.fn.__name__, tuple(a for a in args if not torch.is_tensor(a)), tuple(sorted(kwargs.items())))
                if key in seen:
                    print(f"{name} same as {seen[key]}", flush=True)
                    continue
                seen[key] = label
                try:
                    rep, const, secs = cr.compile_launch(fn, args, kwargs)
                    shown = {k: v for k, v in const.items() if k in SHOWN}
                    print(f"{name} {fn.fn.__name__}{shown} grid {grid}, {cr.per_sm(rep['registers'], rep['num_warps'])}"
                          f" per SM, stack {rep['stack']} B, compile {secs:.1f} s | "
                          + cr.format_report("", rep)[2:], flush=True)
                except Exception as e:  # a variant that fails to compile is itself evidence
                    print(f"{name} {fn.fn.__name__}: COMPILE FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
