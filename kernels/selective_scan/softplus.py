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
def decay(dt, a, a2, PRECISE: tl.constexpr = False):
    """exp(dt A) of broadcastable dt and A (a2 = A log2(e), rounded once). PRECISE (fp32): Cephes'
    exp of dt A, whose range reduction is exact: exp2(dt a2) carries a2's rounding, the same at
    every step, into every decay, and a state or an adjoint that multiplies tens of decays
    multiplies that error as often (dA, dB and ddelta 2-3x eager's error at T 257); on the GPU
    exp2 is also ex2.approx (2 ulp)."""
    if PRECISE:
        return exp_f32(dt * a, True)
    else:
        return tl.exp2(dt * a2)
