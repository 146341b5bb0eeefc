"""One step of the selective scan from a carried state, for inference one frame at a time (what
mamba_ssm calls selective_state_update). Per row b, channel d and state n:

    dt = softplus(delta[b, d])
    h'[b, d, n] = exp(dt A[d, n]) h[b, d, n] + dt B[b, n] x[b, d]
    y[b, d] = (sum_n C[b, n] h'[b, d, n] + D[d] x[b, d]) * silu(z[b, d])

One launch, fp32 state and maths. Forward only: a streamed frame is inference."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .softplus import softplus


@triton.jit
def _state_update(X, DL, A, Bm, Cm, Dk, Z, H, Y, HN, Dn, N, sx, sdl, sb, sc, sz, sy,
                  BD: tl.constexpr, BN: tl.constexpr, A_LOG: tl.constexpr):
    b = tl.program_id(0)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    n = tl.arange(0, BN)
    md, mn = d < Dn, n < N
    m2 = md[:, None] & mn[None, :]
    x = tl.load(X + b * sx + d, mask=md, other=0.0).to(tl.float32)
    dt = softplus(tl.load(DL + b * sdl + d, mask=md, other=0.0).to(tl.float32))
    z = tl.load(Z + b * sz + d, mask=md, other=0.0).to(tl.float32)
    skip = tl.load(Dk + d, mask=md, other=0.0).to(tl.float32)
    bn = tl.load(Bm + b * sb + n, mask=mn, other=0.0).to(tl.float32)
    cn = tl.load(Cm + b * sc + n, mask=mn, other=0.0).to(tl.float32)
    a = tl.load(A + d[:, None] * N + n[None, :], mask=m2, other=0.0).to(tl.float32)
    if A_LOG:
        a = -tl.exp(a)
    state = (b * Dn + d[:, None]) * N + n[None, :]
    h = tl.load(H + state, mask=m2, other=0.0)
    h = tl.exp(dt[:, None] * a) * h + (dt * x)[:, None] * bn[None, :]
    tl.store(HN + state, h, mask=m2)
    y = tl.sum(h * cn[None, :], axis=1) + skip * x
    y = y * z * tl.sigmoid(z)
    tl.store(Y + b * sy + d, y.to(Y.dtype.element_ty), mask=md)


def _rows(t: torch.Tensor, name: str, width: int, batch: int) -> torch.Tensor:
    """A [batch, width] operand whose last dim is contiguous (views into wider rows are fine)."""
    if t.shape != (batch, width):
        raise ValueError(f"{name} must be [{batch}, {width}], got {list(t.shape)}")
    return t if t.stride(-1) == 1 else t.contiguous()


def selective_state_update(h, x, delta, A, B, C, D, z, A_log: bool = False):
    """(y [Bt, Dn] like x, the new state [Bt, Dn, N] fp32). h [Bt, Dn, N] (the state, any float
    dtype: it is read as fp32 and left unchanged); x, delta (before softplus), z [Bt, Dn]; A [Dn, N];
    B, C [Bt, N]; D [Dn]. A_log: A holds Mamba's A_log parameter (A = -exp(A_log)), which spares a
    model the launches that would compute A on every frame."""
    Bt, Dn, N = h.shape
    x, delta, z = (_rows(t, name, Dn, Bt) for t, name in ((x, "x"), (delta, "delta"), (z, "z")))
    B, C = _rows(B, "B", N, Bt), _rows(C, "C", N, Bt)
    if A.shape != (Dn, N) or D.shape != (Dn,):
        raise ValueError(f"A must be [{Dn}, {N}] and D [{Dn}], got {list(A.shape)} and {list(D.shape)}")
    h = h.to(torch.float32).contiguous()
    A, D = A.contiguous(), D.contiguous()
    y = torch.empty((Bt, Dn), dtype=x.dtype, device=x.device)
    hn = torch.empty_like(h)
    BN = triton.next_power_of_2(N)
    BD = max(16, min(triton.next_power_of_2(Dn), 2048 // BN))
    _state_update[(Bt, triton.cdiv(Dn, BD))](
        x, delta, A, B, C, D, z, h, y, hn, Dn, N, x.stride(0), delta.stride(0), B.stride(0), C.stride(0),
        z.stride(0), y.stride(0), BD=BD, BN=BN, A_LOG=A_log)
    return y, hn
