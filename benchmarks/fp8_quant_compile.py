"""Offline sm_90 compile of fp8_quant's default and A/B launches (benchmarks/fp8_quant_ab.py).

Registers, spills, SASS load/store widths and compile time at the A/B's shapes, no GPU.

Each case calls the real fp8_quant_forward on 'meta' tensors with the Triton launches recorded
instead of run (fp8_quant_ab.recorded), with the H200's 132 SMs for the persistent grids, so that
what is compiled is what the launcher would launch there (kernel, constexprs, num_warps). Arguments
are specialised as the JIT does (16-byte-aligned pointers, ints divisible by 16, ints equal to 1).

    python benchmarks/fp8_quant_compile.py > docs/evidence/fp8_quant_compile.txt
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import compile_report as cr  # noqa: E402  (first: compiles for the GPU, not the interpreter)

import torch  # noqa: E402
import triton  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from benchmarks.fp8_quant_ab import CASES, recorded  # noqa: E402
from kcollect.kernels import fp8_quant as K  # noqa: E402

_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float8_e4m3fn: "*fp8e4nv"}
H200_SMS = 132
SHOWN = ("BM", "G", "GW", "ROWS_PER_PROGRAM", "PAIRS", "CHUNK", "P1", "P2")


def compile_launch(fn, args, kwargs):
    """(report dict, constexprs shown, compile seconds) for one recorded launch, specialised as the JIT would."""
    sig, const, attrs = {}, {}, {}
    for i, (p, a) in enumerate(zip(fn.params, args)):
        if torch.is_tensor(a):
            sig[p.name], spec = _TYPES[a.dtype], "D"  # fresh allocations: 16-byte aligned
        else:
            sig[p.name], spec = native_specialize_impl(BaseBackend, a, False, not p.do_not_specialize,
                                                       not p.do_not_specialize_on_alignment)
            if sig[p.name] == "constexpr":
                const[p.name] = a
        if spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    for p in fn.params[len(args):]:
        sig[p.name] = "constexpr"
        const[p.name] = kwargs.get(p.name, p._param.default)
    options = {"num_warps": kwargs.get("num_warps", 4), "num_stages": 3}
    t0 = time.perf_counter()
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=cr._TARGET, options=options)
    secs = time.perf_counter() - t0
    usage, sass = cr._resource_usage(k.asm["cubin"])
    r = {"registers": usage.get("REG"), "local_bytes": usage.get("LOCAL", 0), "stack": usage.get("STACK", 0),
         "shared": k.metadata.shared, "num_warps": options["num_warps"], "sass_ops": cr._sass_counts(sass)}
    return r, {n: v for n, v in const.items() if n in SHOWN}, secs


def per_sm(regs: int, warps: int) -> int:
    """Programs per SM that registers and threads allow (H100/H200: 64K registers, 2048 threads)."""
    per_warp = triton.cdiv(regs * 32, 256) * 256
    return min(65536 // (per_warp * warps), 2048 // (32 * warps))


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
                    rep, shown, secs = compile_launch(fn, args, kwargs)
                    print(f"{name} {fn.fn.__name__}{shown} grid {grid}, {per_sm(rep['registers'], rep['num_warps'])}"
                          f" per SM, stack {rep['stack']} B, compile {secs:.1f} s | "
                          + cr.format_report("", rep)[2:], flush=True)
                except Exception as e:  # a variant that fails to compile is itself evidence
                    print(f"{name} {fn.fn.__name__}: COMPILE FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
