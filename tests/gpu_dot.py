"""The GPU's fp32 tl.dot on the CPU interpreter, for tests of accumulation order.

The interpreter multiplies tl.dot(a, b, acc) as one numpy matmul added to acc: a blocked BLAS sum,
whatever the kernel does. On a GPU an fp32 dot with input_precision="ieee" is a chain of fused
multiply-adds over K starting from acc (Triton's FMA lowering), so a kernel that hands one dot's
result to the next as its accumulator sums all of K in one fp32 chain. `fma_chain()` makes the
interpreter do that (each step's product exact and the sum rounded once to fp32, as an FMA), so
a kernel's rounding on the GPU shows on the CPU."""
from __future__ import annotations

import contextlib

import numpy as np


def chain_matmul(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """acc + a @ b as fp32 FMAs over K in order (float64 holds each fp32 product and sum exactly
    enough that rounding it to fp32 is an FMA's single rounding but for rare double roundings)."""
    out = acc.astype(np.float32).copy()
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for k in range(a.shape[-1]):
        out = (out.astype(np.float64) + a64[..., :, k, None] * b64[..., None, k, :]).astype(np.float32)
    return out


@contextlib.contextmanager
def fma_chain():
    """Within the block, the interpreter's fp32 dots are chain_matmul (other dtypes unchanged)."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if d.data.dtype != np.float32 or a.data.dtype != np.float32 or b.data.dtype != np.float32:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        return interpreter.TensorHandle(chain_matmul(a.data, b.data, d.data), tl.float32)

    builder.create_dot = create_dot
    try:
        yield
    finally:
        builder.create_dot = original
