"""bf16 values widened to fp32 at each use, not once (see the comment below); kernels/_host/device.py:
widen_asm says where the PTX form may run."""
from __future__ import annotations

import triton
import triton.language as tl

# ---------------------------------------------------------------------------------------------
# bf16 widened late. A kernel that holds a row of bf16 values across a reduction and uses them
# again after it (softmax's backward: dot = sum(y * dy), then y * (dy - dot)) keeps, as compiled,
# fp32 copies of them alive across the reduction: twice the registers of the packed bf16 loaded.
# At 32 elements per thread of two tensors (a 32768-wide row, 32 warps, where the hardware caps a
# thread at 64 registers) that spilled (sm_90 compile: 8 spill stores and loads a thread). An
# opaque, impure widening (a shift and a mask of the packed pair) cannot be hoisted or merged, so
# each use widens again from the packed bf16 (one integer op per element) and nothing spills.
# The interpreter cannot run PTX: the launchers pass ASM only for bf16 tensors on the GPU.


@triton.jit
def widen(v, ASM: tl.constexpr):
    """v as float32; ASM: v is bf16 on the GPU, widened by an opaque bit shift (see above)."""
    if ASM:
        return tl.inline_asm_elementwise("shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000;", "=r,=r,r", [v],
                                         dtype=tl.float32, is_pure=False, pack=2)
    else:
        return v.to(tl.float32)
