"""The step size of Mamba's selective scan, dt = softplus(delta), and the decay exp(dt A), as every
kernel of the op computes them."""
from __future__ import annotations

import triton
import triton.language as tl

from .._jit.recurrent import div_f32, exp_f32
from .._jit.scan import approx


@triton.jit
def softplus(v, FAST: tl.constexpr = False, PRECISE: tl.constexpr = False):
    """log(1 + e^v), accurate for small results too: log1p(u) as log(w) * u / (w - 1), w = 1 + u,
    where w - 1 is exact (the identity holds to an ulp where log1p itself is not available).
    FAST (GPU, bf16 delta only): u by ex2.approx, log1p(u) by its series below u = 1/64 (error
    under u^3/4 < 1e-6 relative) and by lg2.approx(1 + u) above (absolute error 2^-22 on a log2
    of at least 0.022: 1.5e-5 relative at worst), no division: about 12 instructions where the
    exact ones take about 22; far under bf16's rounding (4e-3), near fp32's tolerance.
    PRECISE (fp32): u by Cephes' exp and the division rounded to nearest (_jit/recurrent.py): on
    the GPU tl.exp is ex2.approx of v log2(e), whose rounding grows with |v| (a step of 1e-6, v =
    -14: 1e-6 relative, which dA, the product of two steps, doubled: 46x eager's error)."""
    if FAST:
        u = approx(tl.abs(v) * -1.4426950408889634, "ex2")
        series = u * (1.0 - u * (0.5 - u * 0.3333333333333333))
        log1p = tl.where(u < 0.015625, series, approx(1.0 + u, "lg2") * 0.6931471805599453)
        return tl.maximum(v, 0.0) + log1p
    u = exp_f32(-tl.abs(v), PRECISE)
    w = 1.0 + u
    log1p = tl.where(w == 1.0, u, div_f32(tl.log(w) * u, w - 1.0, PRECISE))
    return tl.maximum(v, 0.0) + log1p


@triton.jit
def decay(dt, a, a2, PRECISE: tl.constexpr = False, POLY: tl.constexpr = 0):
    """exp(dt A) of broadcastable dt and A (a2 = A log2(e), rounded once). PRECISE (fp32): Cephes'
    exp of dt A, whose range reduction is exact: exp2(dt a2) carries a2's rounding, the same at
    every step, into every decay, and a state or an adjoint that multiplies tens of decays
    multiplies that error as often (dA, dB and ddelta 2-3x eager's error at T 257); on the GPU
    exp2 is also ex2.approx (2 ulp). POLY (not PRECISE): 1/POLY of the states' decays by
    exp2_poly on the FMA pipe (exp2_mixed; the last axis the states)."""
    if PRECISE:
        return exp_f32(dt * a, True)
    else:
        return exp2_mixed(dt * a2, POLY)


# 2^f on [-1/2, 1/2]: the degree-5 polynomial with p(0) = 1 of least relative error (Lawson-weighted
# least squares over 4000 Chebyshev nodes; float64 9.1e-8, Horner in fp32 1.9e-7, as ex2.approx's
# 2 ulp). p(0) = 1 exactly: decays near 1 (long memories) get no bias that tens of steps would add up
_P0, _P1, _P2 = tl.constexpr(1.0), tl.constexpr(0.693146977598857), tl.constexpr(0.24022242085173212)
_P3, _P4 = tl.constexpr(0.05550733743691397), tl.constexpr(0.009671512648909895)
_P5 = tl.constexpr(0.0013264727065173745)
_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2^23: v + this, in fp32, rounds v to an integer kept in the low mantissa bits


@triton.jit
def exp2_poly(v):
    """2^v on the FMA and integer pipes, not the SFU (FlashAttention-4's softmax trick): v clamped
    to [-125, 125], split as j + f (j = round(v) by the 1.5 * 2^23 addition, no conversion
    instruction; |f| <= 1/2), 2^f by the polynomial above, 2^j added to its exponent bits. Below
    2^-125 it gives 2^-125 where ex2.approx.ftz gives 0 (a decay that small leaves nothing of a
    state either way)."""
    v = tl.minimum(tl.maximum(v, -125.0), 125.0)
    r = v + _ROUND
    f = v - (r - _ROUND)
    p = _P5
    p = p * f + _P4
    p = p * f + _P3
    p = p * f + _P2
    p = p * f + _P1
    p = p * f + _P0
    # r's bits are 1.5 * 2^23's plus j, whose low 9 bits are zero: shifted by 23, j << 23 alone
    return (p.to(tl.int32, bitcast=True) + (r.to(tl.int32, bitcast=True) << 23)).to(tl.float32, bitcast=True)


@triton.jit
def _halves(v):
    """3-d v [S, L, K] as its even and odd entries of the last axis (K even; where K is in each
    thread's registers, as the lanes tiles' states are, no data moves)."""
    return tl.split(tl.reshape(v, [v.shape[0], v.shape[1], v.shape[2] // 2, 2]))


@triton.jit
def _joined(even, odd):
    return tl.reshape(tl.join(even, odd), [even.shape[0], even.shape[1], even.shape[2] * 2])


@triton.jit
def exp2_mixed(v, POLY: tl.constexpr):
    """2^v of 3-d v with 1/POLY of the last axis's entries by exp2_poly and the rest by the SFU's exp2
    (POLY 0: none; 2, 4 or 8, the last axis a multiple of POLY): the two pipes share the work."""
    if POLY == 0:
        return tl.exp2(v)
    elif POLY == 2:
        a, b = _halves(v)
        return _joined(tl.exp2(a), exp2_poly(b))
    elif POLY == 4:
        a, b = _halves(v)
        b0, b1 = _halves(b)
        return _joined(tl.exp2(a), _joined(tl.exp2(b0), exp2_poly(b1)))
    else:
        tl.static_assert(POLY == 8, "POLY: 0, 2, 4 or 8")
        a, b = _halves(v)
        b0, b1 = _halves(b)
        c0, c1 = _halves(b1)
        return _joined(tl.exp2(a), _joined(tl.exp2(b0), _joined(tl.exp2(c0), exp2_poly(c1))))
