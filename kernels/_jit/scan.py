"""What the scan ops' kernels share (rtu, selective_scan): the combine functions of first-order linear
recurrences for tl.associative_scan, fast fp32 maths in PTX, and a row of a register tile.

A first-order recurrence h_t = a_t * h_{t-1} + b_t composes as pairs: applying (a1, b1) then
(a2, b2) is (a2 * a1, a2 * b1 + b2). tl.associative_scan passes the earlier element first; with
reverse=True it scans from the end, the later element first, which is the adjoint recurrence
s_t = b_t + a_t * s_{t+1} with the same combine."""
from __future__ import annotations

import triton
import triton.language as tl

from .recurrent import sigmoid_f32


@triton.jit
def first_order(a1, b1, a2, b2):
    """Real gates."""
    return a2 * a1, a2 * b1 + b2


@triton.jit
def first_order_complex(ar1, ai1, br1, bi1, ar2, ai2, br2, bi2):
    """Complex gates and states, as (real, imaginary) pairs."""
    ar = ar2 * ar1 - ai2 * ai1
    ai = ar2 * ai1 + ai2 * ar1
    br = ar2 * br1 - ai2 * bi1 + br2
    bi = ar2 * bi1 + ai2 * br1 + bi2
    return ar, ai, br, bi


@triton.jit
def approx(x, OP: tl.constexpr):
    """OP.approx.ftz.f32 of fp32 x in PTX (OP: "ex2", "lg2", "rcp"): one MUFU instruction, where
    Triton's exp2, log2 and division fix up denormal inputs and outputs around it. GPU only."""
    return tl.inline_asm_elementwise(OP + ".approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def sigmoid(x, ASM: tl.constexpr, PRECISE: tl.constexpr = False):
    """1 / (1 + exp(-x)) in fp32. ASM (on the GPU): ex2 and rcp.approx.ftz, four instructions where
    tl.sigmoid takes about twelve (its exp and division fix up denormal inputs and huge divisors,
    which change nothing here: exp(-x) below 2^-126 leaves 1 + exp(-x) = 1, and a divisor past 2^126
    gives 0 either way); each rounding within two ulps. The interpreter cannot run PTX: launchers
    pass ASM for CUDA tensors only. PRECISE (fp32 tensors) overrides ASM: recurrent.py's
    sigmoid_f32, correctly rounded, for the GPU's two-ulp forms err by more than eager where a
    parameter's gradient sums steps that cancel."""
    if PRECISE:
        return sigmoid_f32(x, True)
    if ASM:
        return approx(1.0 + approx(x * -1.4426950408889634, "ex2"), "rcp")
    return tl.sigmoid(x)


def sum_dtype(dtype):
    """The torch dtype in which a kernel sums a parameter's gradient over batch and time: fp64 for
    fp32 inputs, whose users expect eager's error (an fp32 running sum of terms that cancel loses
    digits eager's pairwise sums keep; each product of two fp32 values is exact in fp64, so the sum
    is then good to the rounding of its terms), fp32 otherwise (the fp32 sum's error is far under
    one rounding of bf16 or fp16 data, and the fp64 units are slower)."""
    import torch

    return torch.float64 if dtype == torch.float32 else torch.float32


def accumulator(dtype):
    """sum_dtype as a Triton type (a kernel's ACC constexpr)."""
    import torch

    return tl.float64 if sum_dtype(dtype) == torch.float64 else tl.float32


@triton.jit
def sum_of_products(a, b, ACC: tl.constexpr, AXIS: tl.constexpr = 0):
    """The sum over AXIS of a * b, products and sum in ACC (accumulator)."""
    return tl.sum(a.to(ACC) * b.to(ACC), axis=AXIS)


@triton.jit
def row_of(x, rows, i):
    """Row i of a tile whose first axis is indexed by `rows` (a register tile has no dynamic
    indexing: a masked sum over that axis)."""
    return tl.sum(tl.where(rows == i, x, 0.0), axis=0)
