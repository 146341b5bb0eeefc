"""What the recurrent cells' kernels share (lstm, slstm, mlstm, axon): activations, fp32 maths as
accurate as PyTorch's, the reset factor of a row, tl.dot with fp32 operands, and the four-gate split
of a fused gate tile. The grid-wide step barrier is kernels/_jit/barrier.py; the host's side of these
choices (PRECISE, DOT_F32) is kernels/_host/cells.py."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def logsigmoid(x):
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


# ---------------------------------------------------------------------------------------------
# fp32 maths as accurate as PyTorch's. On a GPU, tl.exp is ex2.approx of x * log2(e) (the rounding
# of that product grows with |x|: 8 ulp at x = -10), tl.sigmoid and `/` divide with div.full (2 ulp),
# and tanh above is 2 sigmoid(2x) - 1, whose absolute error of ~2e-7 is all of a small tanh's
# digits; PyTorch's fp32 kernels use expf, tanhf and IEEE division (1-2 ulp), and a recurrence
# carries every step's error into the next. So the kernels take PRECISE (a constexpr: the tensors
# are fp32) and use the forms below then: Cephes' expf (a range reduction by ln 2 in two exact
# parts and a degree-7 polynomial) and tanhf, division rounded to nearest, log1p by Goldberg's
# correction. Off (bf16, fp16), the fast forms: their error is far below one rounding of the data.
# Only tl ops, so the CPU interpreter runs the same code.


@triton.jit
def _exp_precise(x):
    xc = tl.minimum(tl.maximum(x, -87.3), 88.72)
    k = tl.floor(xc * 1.4426950408889634 + 0.5)
    r = xc - k * 0.693359375  # ln 2 = 0.693359375 - 2.12194440e-4: k * 0.693359375 is exact
    r = r + k * 2.12194440e-4
    p = 1.9875691500e-4
    p = p * r + 1.3981999507e-3
    p = p * r + 8.3334519073e-3
    p = p * r + 4.1665795894e-2
    p = p * r + 1.6666665459e-1
    p = p * r + 5.0000001201e-1
    e = p * r * r + r + 1.0
    half_scale = ((k.to(tl.int32) + 126) << 23).to(tl.float32, bitcast=True)  # 2^(k-1): k = 128 fits
    e = e * half_scale * 2.0
    e = tl.where(x > 88.72, float("inf"), tl.where(x < -87.3, 0.0, e))  # below: subnormal, flushed
    return tl.where(x == x, e, x)  # NaN stays NaN


@triton.jit
def exp_f32(x, PRECISE: tl.constexpr):
    if PRECISE:
        return _exp_precise(x)
    else:
        return tl.exp(x)


@triton.jit
def div_f32(a, b, PRECISE: tl.constexpr):
    if PRECISE:
        return tl.div_rn(a, b)
    else:
        return a / b


@triton.jit
def sigmoid_f32(x, PRECISE: tl.constexpr):
    if PRECISE:
        return tl.div_rn(1.0, 1.0 + _exp_precise(-x))
    else:
        return tl.sigmoid(x)


@triton.jit
def tanh_f32(x, PRECISE: tl.constexpr):
    """tanh; PRECISE: Cephes' tanhf, a polynomial below |x| = 0.625 (no cancellation near 0)."""
    if PRECISE:
        z = tl.abs(x)
        big = 1.0 - tl.div_rn(2.0, _exp_precise(2.0 * z) + 1.0)
        z2 = x * x
        p = -5.70498872745e-3
        p = p * z2 + 2.06390887954e-2
        p = p * z2 - 5.37397155531e-2
        p = p * z2 + 1.33314422036e-1
        p = p * z2 - 3.33332819422e-1
        return tl.where(z > 0.625, tl.where(x < 0.0, -big, big), p * z2 * x + x)
    else:
        return tanh(x)


@triton.jit
def logsigmoid_f32(x, PRECISE: tl.constexpr):
    """min(x, 0) - log1p(exp(-|x|)); PRECISE: log1p(e) = log(u) e / (u - 1), u = 1 + e (Goldberg),
    which keeps the digits of a small e that log(1 + e) rounds away (a forget gate near 1)."""
    if PRECISE:
        e = _exp_precise(-tl.abs(x))
        u = 1.0 + e
        log1p = tl.where(u == 1.0, e, tl.div_rn(tl.log(u) * e, u - 1.0))
        return tl.minimum(x, 0.0) - log1p
    else:
        return logsigmoid(x)


@triton.jit
def keep_rows(rs_ptr, rows, mask, t, T, has_resets):
    """fp32 per row: 0 for the rows whose state is zeroed before step t (resets [B, T] as uint8 at
    rs_ptr), 1 for the others and everywhere when has_resets is 0."""
    r = tl.load(rs_ptr + rows.to(tl.int64) * T + t, mask=mask & (has_resets != 0), other=0)
    return 1.0 - r.to(tl.float32)


@triton.jit
def dot(a, b, acc, DOT_F32: tl.constexpr):
    """acc + a @ b on tensor cores, with fp32 operands where dot_f32 says so: as three TF32 products
    (each operand a TF32 part and the TF32 remainder; the remainders' product is left out, about
    2^-22 of the terms), where "ieee" ran on the CUDA cores: compiled for sm_90 the mLSTM's fp32
    backward chunk kernel then kept a 44 KB stack a thread (7 KB with TF32x3), which the GPU
    reserves for every thread it holds."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="tf32x3")
    else:
        return tl.dot(a, b, acc)


# ---------------------------------------------------------------------------------------------
# Gate tiles. A [BB, 4*HB] tile whose columns are unit-major (column u*4 + g holds gate g of unit
# u) splits into the four [BB, HB] gates with two halvings of the trailing dimension.


@triton.jit
def split4(acc, BB: tl.constexpr, HB: tl.constexpr):
    """(gate 0, gate 1, gate 2, gate 3) of a unit-major [BB, 4*HB] tile."""
    even, odd = tl.split(tl.reshape(acc, (BB, HB, 2, 2)))  # gates (0, 2) and (1, 3)
    g0, g2 = tl.split(even)
    g1, g3 = tl.split(odd)
    return g0, g1, g2, g3


@triton.jit
def join4(g0, g1, g2, g3, BB: tl.constexpr, HB: tl.constexpr):
    """The unit-major [BB, 4*HB] tile of four [BB, HB] gates (split4's inverse)."""
    return tl.reshape(tl.join(tl.join(g0, g2), tl.join(g1, g3)), (BB, 4 * HB))
