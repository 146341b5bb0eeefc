"""Offline sm_90 compile of rms_norm's / add_rms_norm's default launches and the A/B variants of
benchmarks/rms_norm_ab.py at its shapes: registers, spills and SASS load/store widths, no GPU.

Each case calls the real rms_norm_forward / rms_norm_backward on 'meta' tensors with the Triton
launches recorded instead of run (ab_tools.recorded), with the H200's register caps
(_FWD_MAXNREG, which the launcher applies on sm_90 only), so that what is compiled is what the
launcher would launch on the H200: kernel, constexprs, num_warps, maxnreg. Arguments are
specialised as the JIT does (16-byte-aligned pointers, ints divisible by 16, ints equal to 1).

    python benchmarks/rms_norm_compile.py > docs/evidence/rms_norm_compile.txt
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import compile_report as cr  # noqa: E402  (first: compiles for the GPU, not the interpreter)

import torch  # noqa: E402

from benchmarks.ab_tools import recorded  # noqa: E402
from benchmarks.rms_norm_ab import BWD_VARIANTS, CASES, EPS, FWD_VARIANTS  # noqa: E402
from kcollect.kernels import rms_norm as K  # noqa: E402

_SHOWN = ("BLOCK_N", "BLOCK_B", "ROWS", "PREFETCH", "STORE_RSTD", "BLOCK_R", "BLOCK_C", "CHUNK", "X_POLICY", "POLICY")


def _sm90_cap(device, has_res, elem, block_n, block_b):
    return K._FWD_MAXNREG[(has_res, elem)].get((block_n, block_b))  # _fwd_maxnreg on an H200


def main():
    print(__doc__.splitlines()[0])
    print("bf16; regs = registers per thread (cap = maxnreg, - none); stack = spill bytes per thread "
          "(cuobjdump reports spills under STACK, LOCAL stays 0; LDL/STL = spill loads/stores); LDG.E.128 = 16-byte global loads, LDG.E.64/LDG.E/LDG.E.U16 "
          "narrower; per SM = programs resident per SM by registers and threads.\n")
    K._fwd_maxnreg = _sm90_cap
    done = set()
    for kernel, mode, m, n in CASES:
        if (kernel, mode, n) in done:  # M changes the grid only, not the binary
            continue
        done.add((kernel, mode, n))
        x = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
        w = torch.empty(n, dtype=torch.bfloat16, device="meta")
        r = torch.empty_like(x) if kernel == "add_rms_norm" else None
        if mode == "fwd":
            variants = [(label, lambda kw=kw(n, r is not None): K.rms_norm_forward(
                x, w, EPS, residual=r, **{"need_rstd": False, **kw})) for label, kw in FWD_VARIANTS]
        else:
            rstd = torch.empty(m, dtype=torch.float32, device="meta")
            variants = [(label, lambda kw=kw(n): K.rms_norm_backward(x, x, w, rstd, dh=x, **kw))
                        for label, kw in BWD_VARIANTS]
        seen = {}
        for label, call in variants:
            calls = []
            with recorded(calls):
                call()
            for fn, _, args, kwargs in calls:
                if fn.fn.__name__ == "_sum_partials":  # the backward's small dw epilogue: same in all
                    continue
                name = f"{kernel} {mode} {n:5d} {label:22s}"
                key = (fn.fn.__name__, tuple(sorted(kwargs.items())))
                if key in seen:
                    print(f"{name} {fn.fn.__name__}: same as {seen[key]}", flush=True)
                    continue
                seen[key] = label
                try:
                    rep, const, _ = cr.compile_launch(fn, args, kwargs)
                    shown = {k: v for k, v in const.items() if k in _SHOWN}
                    cap = kwargs.get("maxnreg")
                    print(f"{name} {fn.fn.__name__}{shown} cap {cap or '-'}, {cr.per_sm(rep['registers'], rep['num_warps'])}"
                          f" per SM, stack {rep['stack']} B | " + cr.format_report("", rep)[2:], flush=True)
                except Exception as e:  # a variant that fails to compile is itself evidence
                    print(f"{name} {fn.fn.__name__}: COMPILE FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
