"""What both paths of the RTU's kernels compute alike: the recurrence's constants per channel, in
fp64, and the derivative of the SiLU."""
from __future__ import annotations

import triton
import triton.language as tl

from .._jit.scan import sigmoid


@triton.jit
def one_minus_exp(a):
    """1 - exp(-a) for a >= 0 (fp64), without cancellation where a is small: the series' first
    terms below 1e-4 (truncation ~a^4/24, under fp64's rounding there)."""
    series = a * (1.0 - a * (0.5 - a / 6.0))
    return tl.where(a < 1e-4, series, 1.0 - tl.exp(-a))


@triton.jit
def dynamics(NU, TH, W1, W2, h, mh, BLOCK_H: tl.constexpr, HAS_W: tl.constexpr):
    """g, p (lambda's real and imaginary parts), gamma, and the input weights w1, w2 (1 without).
    Computed in fp64 (once a program, not a step) and rounded once: in fp32, 1 - r^2 cancels for
    long memories (r = 0.999: 1e-4 relative error in gamma; r within 6e-8 of 1: gamma 0, the input
    lost) and exp(theta_log) rounds the angle itself (a phase error growing with t)."""
    nu = tl.load(NU + h, mask=mh, other=0.0).to(tl.float64)
    th = tl.load(TH + h, mask=mh, other=0.0).to(tl.float64)
    e = tl.exp(nu)
    r = tl.exp(-e)
    ang = tl.exp(th)
    g = (r * tl.cos(ang)).to(tl.float32)
    p = (r * tl.sin(ang)).to(tl.float32)
    gam = tl.sqrt(one_minus_exp(2.0 * e)).to(tl.float32)
    if HAS_W:
        w1 = tl.load(W1 + h, mask=mh, other=0.0).to(tl.float32)
        w2 = tl.load(W2 + h, mask=mh, other=0.0).to(tl.float32)
    else:
        w1 = tl.full([BLOCK_H], 1.0, tl.float32)
        w2 = w1
    return g, p, gam, w1, w2


@triton.jit
def power(NU, TH, h, mh, n, CONJ: tl.constexpr):
    """lambda^n (conj(lambda)^n with CONJ) from fp64: r^n e^{i n theta}, rounded once. n: a scalar,
    or a [rows, 1] tile (a power per row and channel h)."""
    e = tl.exp(tl.load(NU + h, mask=mh, other=0.0).to(tl.float64))
    ang = tl.exp(tl.load(TH + h, mask=mh, other=0.0).to(tl.float64)) * n
    rn = tl.exp(-e * n)
    im = rn * tl.sin(ang)
    return (rn * tl.cos(ang)).to(tl.float32), (-im if CONJ else im).to(tl.float32)


@triton.jit
def exact_transitions(pow_r, pow_i, keep, REVERSE: tl.constexpr):
    """The chunk's transitions (from the chunk's start to each row; REVERSE: from each row to the
    chunk's end) from the powers of lambda rounded once: lambda^k where no reset lies between, 0
    where one does (keep [chunk, 1]: 0 at a reset). From the first (REVERSE: last) reset's row, a
    reduction: Triton 3.6 fails to lower a cumsum over a [chunk, 1] tile (ScanOpToLLVM asserts)."""
    rows = tl.arange(0, keep.shape[0])[:, None]
    if REVERSE:
        fresh = rows > tl.max(tl.where(keep < 0.5, rows, -1), axis=0)[None, :]
    else:
        fresh = rows < tl.min(tl.where(keep < 0.5, rows, keep.shape[0]), axis=0)[None, :]
    return tl.where(fresh, pow_r, 0.0), tl.where(fresh, pow_i, 0.0)


@triton.jit
def silu_grad(c, ASM: tl.constexpr = False, PRECISE: tl.constexpr = False):
    s = sigmoid(c, ASM, PRECISE)
    return s * (1.0 + c * (1.0 - s))
