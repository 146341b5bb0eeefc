"""One step of a depthwise causal conv1d from a carried window, for inference one frame at a time
(what causal_conv1d calls causal_conv1d_update):

    out[b, d] = act(sum_{k < K-1} w[d, k] state[b, d, k] + w[d, K-1] x[b, d] + bias[d])
    state'[b, d] = (state[b, d, 1:], x[b, d])

with act SiLU (Mamba's) or none. One launch, fp32 maths. Forward only."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_step(X, S, W, Bias, Y, SN, Dn, KS, sx, sy, BD: tl.constexpr, BK: tl.constexpr, SILU: tl.constexpr):
    b = tl.program_id(0)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    k = tl.arange(0, BK)
    md = d < Dn
    mk = md[:, None] & (k[None, :] < KS)
    x = tl.load(X + b * sx + d, mask=md, other=0.0).to(tl.float32)
    window = (b * Dn + d[:, None]) * KS + k[None, :]
    s = tl.load(S + window, mask=mk, other=0.0).to(tl.float32)
    w = tl.load(W + d[:, None] * (KS + 1) + k[None, :], mask=mk, other=0.0).to(tl.float32)
    w_now = tl.load(W + d * (KS + 1) + KS, mask=md, other=0.0).to(tl.float32)
    out = tl.sum(w * s, axis=1) + w_now * x + tl.load(Bias + d, mask=md, other=0.0).to(tl.float32)
    if SILU:
        out = out * tl.sigmoid(out)
    tl.store(Y + b * sy + d, out.to(Y.dtype.element_ty), mask=md)
    # the window moves by one: slot k takes slot k + 1, the last slot takes x
    nxt = tl.load(S + window + 1, mask=mk & (k[None, :] < KS - 1), other=0.0)
    nxt = tl.where(k[None, :] == KS - 1, x[:, None].to(nxt.dtype), nxt)
    tl.store(SN + window, nxt.to(SN.dtype.element_ty), mask=mk)


def causal_conv_step(state, x, weight, bias, silu: bool = True):
    """(out [Bt, Dn] like x, the new window [Bt, Dn, K-1] like state). state [Bt, Dn, K-1] (the
    K-1 inputs before x, oldest first; left unchanged); x [Bt, Dn] (its last dim contiguous);
    weight [Dn, K] (weight[:, K-1] multiplies x); bias [Dn]."""
    Bt, Dn, KS = state.shape
    if x.shape != (Bt, Dn) or weight.shape != (Dn, KS + 1) or bias.shape != (Dn,):
        raise ValueError(f"x must be [{Bt}, {Dn}], weight [{Dn}, {KS + 1}] and bias [{Dn}]; got "
                         f"{list(x.shape)}, {list(weight.shape)} and {list(bias.shape)}")
    if KS < 1:
        raise ValueError("a window of width K >= 2 (state [Bt, Dn, K-1] with K-1 >= 1)")
    x = x if x.stride(-1) == 1 else x.contiguous()
    state, weight, bias = state.contiguous(), weight.contiguous(), bias.contiguous()
    y = torch.empty((Bt, Dn), dtype=x.dtype, device=x.device)
    sn = torch.empty_like(state)
    BK = triton.next_power_of_2(KS)
    BD = max(16, min(triton.next_power_of_2(Dn), 1024 // BK))
    _conv_step[(Bt, triton.cdiv(Dn, BD))](x, state, weight, bias, y, sn, Dn, KS, x.stride(0), y.stride(0),
                                          BD=BD, BK=BK, SILU=silu)
    return y, sn
