"""A patch of Triton's CPU interpreter, applied when kcollect.kernels is imported: it makes the
interpreter round as the GPU does.

The interpreter (Triton 3.6-3.7) casts float32 to bfloat16 by dropping the low 16 bits (rounding
toward zero), where the GPU's cvt.rn.bf16.f32 rounds to nearest even: on the CPU every bf16 value
a kernel stores was up to a whole unit in the last place off, twice the error of the same kernel
on the GPU and of PyTorch's bf16 (an RMSNorm forward at 4x16: 0.0038 relative error against
float64 where one rounding gives 0.0013). A kernel checked on the CPU was then judged on the
interpreter's rounding, not its own: the quick grid's backbone row failed its bf16 gate now and
then. `round_to_nearest()` makes the interpreter's float32 -> bfloat16 casts (explicit `.to()` and
stores alike) round to nearest even; other casts are the interpreter's own."""
from __future__ import annotations

import os

import numpy as np


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values -> the uint16 bits of bfloat16, rounded to nearest, ties to even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if np.any(nan):
        rounded[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


def round_to_nearest() -> None:
    """Patch the interpreter's casts (once; only when TRITON_INTERPRET=1, before any kernel runs)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "kcollect_rounds_to_nearest", False):
        return
    cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(bf16_bits(src.data), dst_type.scalar)
        return cast(self, src, dst_type)

    builder.cast_impl = cast_impl
    builder.kcollect_rounds_to_nearest = True
