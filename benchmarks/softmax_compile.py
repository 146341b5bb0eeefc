"""Offline sm_90 compile of softmax's default and A/B variants (VARIANTS of benchmarks/softmax_ab.py)
at the A/B shapes: registers, spills and SASS load/store widths per kernel, no GPU needed.

Each case calls the real softmax_forward / softmax_backward on 'meta' tensors with JITFunction
launches intercepted, so what is compiled is exactly what the launchers would launch (kernel,
constexprs, num_warps); ints are marked divisible by 16 where the JIT would mark them.

    python benchmarks/softmax_compile.py > docs/evidence/softmax_compile.txt
"""
from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.compile_report import format_report, report  # noqa: E402  (before triton: no interpreter)

import torch  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from benchmarks.softmax_ab import SHAPES, VARIANTS  # noqa: E402
from kcollect.kernels import softmax  # noqa: E402

softmax.sm_count = lambda device: 132  # the H200's SMs: persistent grids and LAG as launched there


@contextlib.contextmanager
def intercepted(calls: list):
    """JITFunction launches record (fn, args, kwargs) instead of running."""
    saved = JITFunction.__getitem__
    JITFunction.__getitem__ = lambda self, grid: lambda *a, **k: calls.append((self, a, k))
    try:
        yield
    finally:
        JITFunction.__getitem__ = saved


_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64"}


def compile_args(fn, args, kwargs):
    """signature, constexprs, num_warps and divisible-by-16 names, as the JIT would specialise."""
    sig, const, aligned = {}, {}, []
    for p, a in zip(fn.params, args):
        if torch.is_tensor(a):
            sig[p.name] = _TYPES[a.dtype]
            aligned.append(p.name)  # fresh allocations are 16-byte aligned
        elif a == 1:
            sig[p.name], const[p.name] = "constexpr", 1  # the JIT specialises ints equal to 1
        else:
            sig[p.name] = "i32"
            if a % 16 == 0:
                aligned.append(p.name)
    for p in fn.params[len(args):]:
        sig[p.name] = "constexpr"
        const[p.name] = kwargs.get(p.name, p._param.default)
    return sig, const, kwargs.get("num_warps", 4), aligned


def main():
    print(__doc__.splitlines()[0])
    print("bf16, 132 SMs; regs = registers per thread; spills show as LDL/STL (spill loads/stores) and "
          "stack bytes per thread; LDG.E.*.128 = 16-byte global loads, LDG.E.64/LDG.E/LDG.E.U16 "
          "narrower (EF/EL = evict_first/evict_last).\n")
    for m, n in SHAPES:
        x = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
        for mode in ("fwd", "bwd"):
            seen = {}  # variants that differ only in grid size compile to the same kernel: once
            for label, kw, applies, modes in VARIANTS:
                if not applies(n) or mode not in modes:
                    continue
                calls = []
                with intercepted(calls):
                    if mode == "fwd":
                        softmax.softmax_forward(x, **kw)
                    else:
                        softmax.softmax_backward(x, x, **kw)
                (fn, args, kwargs), = calls
                sig, const, warps, aligned = compile_args(fn, args, kwargs)
                key = (fn.__name__, tuple(sorted(const.items())), tuple(aligned), warps)
                if key in seen:
                    print(f"{m}x{n} {mode} {label:30s} = {seen[key]} (same kernel, other grid)")
                    continue
                seen[key] = label
                shown = {k: v for k, v in const.items() if k != "N_ALIGN"}
                name = f"{m}x{n} {mode} {label:30s} {fn.__name__}{shown}"
                try:
                    r = report(fn, sig, const, num_warps=warps, aligned=aligned)
                    # spills land in STACK (LOCAL stays 0 with this ptxas): print both
                    print(f"{format_report(name, r)} | stack {r['stack']} B", flush=True)
                except Exception as e:  # a variant that fails to compile is itself evidence
                    print(f"{name}: COMPILE FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)

if __name__ == "__main__":
    main()
