"""The step size of Mamba's selective scan, dt = softplus(delta), as every kernel of the op computes it."""
from __future__ import annotations

import triton
import triton.language as tl

from .._jit.scan import approx


@triton.jit
def softplus(v, FAST: tl.constexpr = False):
    """log(1 + e^v), accurate for small results too: log1p(u) as log(w) * u / (w - 1), w = 1 + u,
    where w - 1 is exact (the identity holds to an ulp where log1p itself is not available).
    FAST (GPU, bf16 delta only): u by ex2.approx, log1p(u) by its series below u = 1/64 (error
    under u^3/4 < 1e-6 relative) and by lg2.approx(1 + u) above (absolute error 2^-22 on a log2
    of at least 0.022: 1.5e-5 relative at worst), no division: about 12 instructions where the
    exact ones take about 22; far under bf16's rounding (4e-3), near fp32's tolerance."""
    if FAST:
        u = approx(tl.abs(v) * -1.4426950408889634, "ex2")
        series = u * (1.0 - u * (0.5 - u * 0.3333333333333333))
        log1p = tl.where(u < 0.015625, series, approx(1.0 + u, "lg2") * 0.6931471805599453)
        return tl.maximum(v, 0.0) + log1p
    u = tl.exp(-tl.abs(v))
    w = 1.0 + u
    log1p = tl.where(w == 1.0, u, tl.log(w) * u / (w - 1.0))
    return tl.maximum(v, 0.0) + log1p
