"""Offline sm_90 compile of rope's default launch and the A/B variants of benchmarks/rope_ab.py at
its shapes: registers, spills and SASS load/store widths per kernel, no GPU needed.

Each case calls the real rope_apply on 'meta' tensors laid out as rope.make_inputs lays them out
(HF's transposed q/k; cos/sin [B or 1, T, D]), with the Triton launch recorded instead of run
(ab_tools.recorded), so that what is compiled is exactly what the launcher would launch (kernel,
constexprs, num_warps), with arguments specialised as the JIT does (16-byte-aligned pointers, ints
divisible by 16 or equal to 1).

    python benchmarks/rope_compile.py > docs/evidence/rope_compile.txt
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import compile_report as cr  # noqa: E402  (first: compiles for the GPU, not the interpreter)

import torch  # noqa: E402

from benchmarks.ab_tools import recorded  # noqa: E402
from benchmarks.rope_ab import DTYPE, SHAPES, VARIANTS, label_of  # noqa: E402
from kcollect.kernels import rope  # noqa: E402


def _meta_inputs(dims):
    B, hq, hk, T, D = dims["B"], dims["Hq"], dims["Hk"], dims["T"], dims["D"]
    bc = B if dims["pos"] == "ids" else 1

    def empty(*shape):
        return torch.empty(shape, dtype=DTYPE, device="meta")

    return (empty(B, T, hq, D).transpose(1, 2), empty(B, T, hk, D).transpose(1, 2), empty(bc, T, D), empty(bc, T, D))


def _launches(dims, mode, kw):
    q, k, cos, sin = _meta_inputs(dims)
    if mode == "bwd":  # the collector's upstream gradients are contiguous [B, H, T, D]
        q, k = q.contiguous(), k.contiguous()
    calls = []
    with recorded(calls):
        rope.rope_apply(q, k, cos, sin, backward=(mode == "bwd"), **kw)
    return calls


def main():
    print(__doc__.splitlines()[0])
    print("bf16, shape = BxHqxHkxTxDxpos; regs = registers per thread; per SM = programs resident per SM by "
          "registers, threads and shared memory; spills show as LDL/STL (spill loads/stores) and stack bytes "
          "per thread; LDG.E.*.128 = 16-byte global loads, LDG.E.64/LDG.E/LDG.E.U16 narrower (EF/EL = "
          "evict_first/evict_last). ROWS x W = tile rows x lanes (W = HALF_P, or the chunk in the chunks "
          "layout, NC rows a token), HBQ/HBK = heads per thread. grid = the launch's grid.\n")
    seen = {}  # a binary already reported (another shape or variant): named, not recompiled
    for dims in SHAPES:
        for mode in ("fwd", "bwd"):
            for label, kw, applies, modes in VARIANTS:
                if not applies(dims) or mode not in modes:
                    continue
                for fn, grid, args, kwargs in _launches(dims, mode, kw):
                    name = f"{label_of(dims)} {mode} {label:30s} grid {grid[0]}"
                    key = cr.binary_key(fn, args, kwargs)
                    if key in seen:
                        print(f"{name}: same binary as {seen[key]}", flush=True)
                        continue
                    seen[key] = f"{label_of(dims)} {mode} {label}"
                    try:
                        rep, const, _ = cr.compile_launch(fn, args, kwargs)
                        shown = {k: v for k, v in const.items() if k not in ("BACKWARD",)}
                        fits = cr.per_sm(rep["registers"], rep["num_warps"], rep["shared"])
                        print(f"{name} {shown}: {rep['registers']} regs, {rep['num_warps']} warps, {fits} per SM, "
                              f"stack {rep['stack']} B, shared {rep['shared']} B | "
                              + " ".join(f"{k}:{v}" for k, v in rep["sass_ops"].items()), flush=True)
                    except Exception as e:  # a variant that fails to compile is itself evidence
                        print(f"{name}: COMPILE FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
