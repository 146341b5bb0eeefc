"""What the recurrent cells' kernels share (lstm, slstm, mlstm, axon): activations, fp32 maths as
accurate as PyTorch's, the reset factor of a row, tl.dot with fp32 operands, and the four-gate split
of a fused gate tile. The grid-wide step barrier is kernels/_jit/barrier.py; the host's side of these
choices (PRECISE, DOT_F32) is kernels/_host/cells.py."""
from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs


# The GPU's tanh.approx.f32 is PTX, which the CPU interpreter cannot run (TRITON_INTERPRET, read as
# kernels are defined, is Triton's own switch too): there the series form of `tanh`.
_PTX = tl.constexpr(not knobs.runtime.interpret)


@triton.jit
def tanh(x):
    """tanh in fp32 for the bf16/fp16 kernels, accurate relative to itself everywhere. On the GPU the
    tanh.approx.f32 instruction (one MUFU op; relative error about 2^-11 over its whole range, small
    values included, beside bf16's 2^-9 and fp16's 2^-11 roundings of the data): on one H200 it took
    the sLSTM forward 8-9% under the series form below and its backward 2-3.5% (lab/tanh_ab.py,
    lab/results/tanh_ab_h200.txt). 2 sigmoid(2x) - 1 alone has an absolute error of an fp32 rounding
    (~1e-7), all of a small tanh's digits (a bf16 LSTM's cell state of 1e-8 right after a reset gave
    h = 0), so the interpreter's form takes its Taylor series below |x| = 0.1, whose first term left
    out (17 x^7 / 315) is under 6e-8 of tanh there."""
    if _PTX:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return tanh_series(x)


@triton.jit
def _tanh_taylor(x):
    """tanh's Taylor series to x^5, in x's type: no cancellation near 0."""
    x2 = x * x
    return x + x * x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0))


@triton.jit
def tanh_series(x):
    """The interpreter's tanh (see tanh): its Taylor series to x^5 below |x| = 0.1, else
    2 sigmoid(2x) - 1."""
    return tl.where(tl.abs(x) < 0.1, _tanh_taylor(x), 2.0 * tl.sigmoid(2.0 * x) - 1.0)


@triton.jit
def logsigmoid(x):
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


# ---------------------------------------------------------------------------------------------
# fp32 maths as accurate as PyTorch's. On a GPU, tl.exp is ex2.approx of x * log2(e) (the rounding
# of that product grows with |x|: 8 ulp at x = -10), tl.sigmoid and `/` divide with div.full (2 ulp),
# and tanh above is tanh.approx (on the interpreter, a few of those roundings of 2 sigmoid(2x) - 1
# above |x| = 0.1 and its series below); PyTorch's fp32 kernels use expf, tanhf and IEEE division
# (1-2 ulp), and a recurrence carries every step's error into the next. So the kernels take PRECISE
# (a constexpr: the tensors are fp32) and use the forms below then: Cephes' expf (a range reduction
# by ln 2 in two exact parts and a degree-7 polynomial), division rounded to nearest, log1p by
# Goldberg's correction, and the gates' sigmoid and tanh in float64, rounded once. Off (bf16, fp16),
# the fast forms: their error relative to the value (not only in absolute terms: see tanh) is far
# below one rounding of the data.
# Only tl ops (but the GPU's fast tanh above), so the CPU interpreter runs the same code.


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
def _exp64(x):
    """exp of float64 x clamped to +-110 (what a gate of fp32 inputs needs): k = round(x / ln 2),
    r = x - k ln 2 in two parts (|r| <= 0.35), a degree-10 Taylor polynomial (relative error below
    1e-12, far past fp32's rounding) and 2^k from the exponent bits. NaN stays NaN."""
    xc = tl.minimum(tl.maximum(x, -110.0), 110.0)
    k = tl.floor(xc * 1.4426950408889634 + 0.5)
    r = (xc - k * 0.6931471803691238) - k * 1.9082149292705877e-10  # ln 2 = hi (exact k * hi) + lo
    p = 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    e = p * ((k.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)
    return tl.where(x == x, e, x)  # NaN stays NaN


# The gates' activations, PRECISE: in float64 and rounded once to fp32, so correctly rounded but for
# rare ties (an fp32 expf, a sum and a division leave up to 2 ulp; PyTorch's ~1). Saturated LSTM
# gates are where it shows: the gradient through s' = s (1 - s) keeps only what the rounding of s
# left, and a recurrence of a hundred steps compounds it (issue 40: with the fp32 forms the
# gradients of a saturated 8-unit LSTM over 17 steps were 4x eager's error, from the forward's
# activations alone; the backward's arithmetic on them was within 2e-7 of float64's).


@triton.jit
def sigmoid_f32(x, PRECISE: tl.constexpr):
    if PRECISE:
        return (1.0 / (1.0 + _exp64(-x.to(tl.float64)))).to(tl.float32)
    else:
        return tl.sigmoid(x)


@triton.jit
def sigmoid_grad_f32(x):
    """(sigmoid(x), sigmoid'(x)) for fp32 x: e = exp(-|x|) and r = 1 / (1 + e) in float64, rounded once
    (one exp and one division, as sigmoid_f32 alone). s (1 - s) of an s rounded to fp32 keeps of
    1 - s only what that rounding left: 4 ulp at s = 0.8, none of it at saturation."""
    x64 = x.to(tl.float64)
    e = _exp64(-tl.abs(x64))
    r = 1.0 / (1.0 + e)
    return tl.where(x64 >= 0.0, r, e * r).to(tl.float32), (e * r * r).to(tl.float32)


@triton.jit
def tanh_grad_f32(x):
    """(tanh(x), tanh'(x)) for fp32 x: e = exp(-2|x|), |tanh| = (1 - e) / (1 + e) (tanh_f32's series below
    |x| = 0.01) and 1 - tanh^2 = 4 e / (1 + e)^2, in float64, rounded once (1 - t^2 of a t rounded near
    +-1 keeps only what its rounding left)."""
    x64 = x.to(tl.float64)
    z = tl.abs(x64)
    e = _exp64(-2.0 * z)
    r = 1.0 / (1.0 + e)
    big = (1.0 - e) * r
    t = tl.where(z < 0.01, _tanh_taylor(x64), tl.where(x64 < 0.0, -big, big))
    return t.to(tl.float32), (4.0 * e * r * r).to(tl.float32)


# Gates and their derivatives from the pre-activation z, not from the rounded activation: s (1 - s)
# of an s stored in bf16 (8 bits) or even fp32 keeps of 1 - s only what the rounding left, nothing
# at saturation. With e = exp(-|z|) and r = 1 / (1 + e): sigmoid' = e r^2 and, with e = exp(-2|z|),
# tanh' = 4 e r^2, both without cancellation. PRECISE (fp32 tensors): in float64, rounded once.
@triton.jit
def sigmoid_and_grad(z, PRECISE: tl.constexpr):
    if PRECISE:
        return sigmoid_grad_f32(z)
    else:
        e = tl.exp(-tl.abs(z))
        r = 1.0 / (1.0 + e)
        return tl.where(z >= 0.0, r, e * r), e * r * r


@triton.jit
def tanh_and_grad(z, PRECISE: tl.constexpr):
    if PRECISE:
        return tanh_grad_f32(z)
    else:
        e = tl.exp(-2.0 * tl.abs(z))
        r = 1.0 / (1.0 + e)
        return tanh(z), 4.0 * e * r * r


@triton.jit
def tanh_f32(x, PRECISE: tl.constexpr):
    """tanh; PRECISE: in float64, its Taylor series below |x| = 0.01 (no cancellation near 0)."""
    if PRECISE:
        x64 = x.to(tl.float64)
        z = tl.abs(x64)
        big = 1.0 - 2.0 / (_exp64(2.0 * z) + 1.0)
        return tl.where(z < 0.01, _tanh_taylor(x64), tl.where(x64 < 0.0, -big, big)).to(tl.float32)
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
    """acc + a @ b on tensor cores in the operands' type (DOT_F32 0), or with fp32 operands (the
    modes of kernels/_host/dot.py): IEEE ("ieee", fp32 products on the CUDA cores) or TF32X3
    (Triton's "tf32x3": about 2^-21 a product, 8x fp32's; it leaves out the remainders' product and
    truncates the remainders to TF32). In issue 40's H200 sweep (seed 2) an LSTM of 512 units was 8x
    eager's error at small inputs under tf32x3 (well conditioned: its sums of 512 products the only
    roundings beyond eager's): the LSTM takes IEEE, whose stack compiled for sm_90 is no larger.
    "ieee" costs the sLSTM and mLSTM kernels a stack 3-8x TF32x3's (the mLSTM's backward chunk
    kernel 21 KB a thread at DH 64, which the GPU reserves for every resident thread): they keep
    TF32X3. Six exact TF32 products (each operand split in three TF32 parts) were tried for the
    sLSTM and erred more on the H200 than tf32x3 (seed 3: 86 of 245 fp32 cases over 2x eager,
    against 2 of 508 at seed 2 with tf32x3; not isolated, the tensor cores' fp32 accumulation,
    which does not round to nearest, the likely cause), and for the mLSTM needed 192-336 KB of
    shared memory. FP64 (2): the operands widened to float64 and summed into a float64 `acc` (sm_90's
    DMMA: products exact, a sum of thousands good to far below one fp32 rounding), which the
    caller rounds once; the LSTM's (see kernels/lstm/sequence.py: _rec)."""
    if DOT_F32 == 1:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif DOT_F32 == 2:
        return tl.dot(a.to(tl.float64), b.to(tl.float64), acc, out_dtype=tl.float64)
    elif DOT_F32 == 3:
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
