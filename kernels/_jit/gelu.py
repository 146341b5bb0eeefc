"""GELU maths on fp32 registers, shared by gelu's and geglu's kernels: the one place it lives.

Every helper takes PRECISE (a constexpr: the tensors are fp32). Off (bf16, fp16), the forms below
are written for speed: on H200 a bf16 forward at 90% of copy bandwidth leaves ~30 instructions per
element, and they stay well under it (SASS for sm_90 counted offline, per element: tanh fwd 13,
bwd 20; erf fwd 20, bwd 24; with libdevice erff and IEEE-checked divides the erf forward was 37,
compute-bound at bf16). Their error is far below one bf16/fp16 rounding of the output. On
(fp32, whose output keeps 24 bits and whose bytes leave twice the instructions per element), they
are written for accuracy: H100, fp32, relative error against float64 over eager's, worst of three
shapes: tanh bwd 4.2x -> 0.6x, GEGLU da 4.1x -> 0.6x, tanh fwd 1.7x -> 1.3x, erf fwd and bwd
1.9x -> 1.0x; at 8192x16384 the fp32 kernels ran as fast as before (within 1.5%, at copy speed).

tanh form: 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3). Since 0.5 (1 + tanh(z)) =
sigmoid(2 z) = s, this is x s = x / (1 + e), e = exp(-2 z): one exp2 (MUFU.EX2, with log2(e)
folded into the constants: -2 z log2(e) = x (-2.3022... - 0.10294... x^2)) and one reciprocal; no
libdevice tanh, which the CPU interpreter cannot run and which costs more. Saturates cleanly:
e -> inf gives x * 0 = -0 and e -> 0 gives x, never NaN. The gradient needs 1 - s: as 1.0 - s
it cancels where s is near 1 (x > 0), which cost most of fp32's accuracy; e s is the same value
without the cancellation (the precise forms clamp exp2's argument so that e s is never inf * 0).

exact form: x Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)). Fast: erf by Abramowitz & Stegun
7.1.26, |error| <= 1.5e-7 (erfc(a) = t (a1 + a2 t + ... + a5 t^4) exp(-a^2), t = 1 / (1 + p a),
a >= 0), and Phi(x < 0) = 0.5 erfc(|x|) is computed without the cancellation of 1 + erf(x), so the
negative tail keeps its relative accuracy. exp(-x^2 / 2) is the Gaussian the backward needs, so
the gradient costs two more operations. Constants below: p / sqrt 2 and the a_i halved. Precise:
libdevice's erff (which the interpreter runs as math.erf), as eager computes it.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _recip_ge1(d):
    """1 / d for d >= 1 as rsqrt(d^2): rsqrt.approx.ftz is one MUFU.RSQ (relative error 2^-22.9),
    where `1.0 / d` (div.full.f32) expands to ~9 SASS instructions of range checks meant for
    denominators near 0 or 2^126. d^2 = inf (d > 2^64, only when exp2 overflows) gives 0, the
    right limit."""
    return tl.math.rsqrt(d * d)


@triton.jit
def _tanh_form_precise(x, x2):
    """(e, s) of the tanh form for PRECISE: e = exp(-2 z), s = 1 / (1 + e) correctly rounded;
    exp2's argument clamped at 126 so that e s stays finite (1 + e rounds to e there: e s = 1)."""
    e = tl.exp2(tl.minimum(x * (-2.302208198144325 - 0.1029432395800235 * x2), 126.0))
    return e, tl.div_rn(1.0, 1.0 + e)


@triton.jit
def gelu_tanh_f32(x, PRECISE: tl.constexpr):
    if PRECISE:
        _, s = _tanh_form_precise(x, x * x)
    else:
        e = tl.exp2(x * (-2.302208198144325 - 0.1029432395800235 * x * x))  # exp(-2 z)
        s = _recip_ge1(1.0 + e)
    return x * s


@triton.jit
def gelu_tanh_and_grad_f32(x, PRECISE: tl.constexpr):
    """(gelu(x), d gelu / dx) for the tanh form: with s = sigmoid(2 z) = 1 / (1 + exp(-2 z)),
    d/dx [x s] = s + x s (1 - s) d(2 z)/dx and d(2 z)/dx = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)."""
    x2 = x * x
    if PRECISE:
        e, s = _tanh_form_precise(x, x2)
        g = x * s
        dg = s + g * (e * s) * (1.5957691216057308 + 0.21406444881780073 * x2)  # e s = 1 - s
    else:
        e = tl.exp2(x * (-2.302208198144325 - 0.1029432395800235 * x2))
        s = _recip_ge1(1.0 + e)
        g = x * s
        dg = s + g * (1.0 - s) * (1.5957691216057308 + 0.21406444881780073 * x2)
    return g, dg


@triton.jit
def _normal_cdf_f32(x, PRECISE: tl.constexpr):
    """(Phi(x), exp(-x^2 / 2)) (see the module docstring)."""
    if PRECISE:
        cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
        gauss = tl.exp2(-0.7213475204444817 * x * x)
    else:
        t = _recip_ge1(1.0 + 0.2316418882663604 * tl.abs(x))
        half_erfc = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135
                                                                                    + t * 0.5307027145))))
        gauss = tl.exp2(-0.7213475204444817 * x * x)  # exp(-x^2 / 2)
        half_erfc = half_erfc * gauss  # Phi(-|x|)
        cdf = tl.where(x >= 0.0, 1.0 - half_erfc, half_erfc)
    return cdf, gauss


@triton.jit
def gelu_erf_f32(x, PRECISE: tl.constexpr):
    cdf, _ = _normal_cdf_f32(x, PRECISE)
    return x * cdf


@triton.jit
def gelu_erf_grad_f32(x, PRECISE: tl.constexpr):
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)."""
    cdf, gauss = _normal_cdf_f32(x, PRECISE)
    return cdf + x * (0.3989422804014327 * gauss)
