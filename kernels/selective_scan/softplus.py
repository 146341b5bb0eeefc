"""The step size of Mamba's selective scan, dt = softplus(delta), as every kernel of the op computes it."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softplus(v):
    """log(1 + e^v), accurate for small results too: log1p(u) as log(w) * u / (w - 1), w = 1 + u,
    where w - 1 is exact (the identity holds to an ulp where log1p itself is not available)."""
    u = tl.exp(-tl.abs(v))
    w = 1.0 + u
    log1p = tl.where(w == 1.0, u, tl.log(w) * u / (w - 1.0))
    return tl.maximum(v, 0.0) + log1p
