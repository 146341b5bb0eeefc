"""The pieces of the Mamba mixer that the eager modules and the kcollect path share: the causal
depthwise conv with its carried window, and the selective scan as a sequential loop (mamba_ssm's
selective_scan_ref, with an initial state and the last state returned for streaming)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def work_dtype(t: torch.Tensor) -> torch.dtype:
    """The scan's state and maths: fp32, or float64 for the reference."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def causal_conv(x: torch.Tensor, state: torch.Tensor | None, w: torch.Tensor, b: torch.Tensor):
    """silu(depthwise causal conv) of x [B, T, Di] with w [Di, K], b [Di], continuing from `state`
    [B, Di, K - 1] (the K - 1 inputs before x; zeros when None). Returns (out [B, T, Di], the new
    state: the last K - 1 inputs)."""
    k = w.shape[-1]
    xt = x.transpose(1, 2)
    full = F.pad(xt, (k - 1, 0)) if state is None else torch.cat([state.to(xt.dtype), xt], dim=-1)
    out = F.conv1d(full, w.unsqueeze(1), b, groups=w.shape[0])
    return F.silu(out).transpose(1, 2), full[..., full.shape[-1] - (k - 1):]


def scan(x, dt, A, Bm, Cm, D, h0=None):
    """h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t, y_t = C_t . h_t + D x_t, step by step.
    x, dt [B, T, Di] (dt after softplus); A [Di, N]; Bm, Cm [B, T, N]; D [Di]; h0 [B, Di, N] or None
    (zeros). Returns (y [B, T, Di], h_T) in the work dtype (fp32, float64 for float64 inputs)."""
    work = work_dtype(x)
    x, dt, A, Bm, Cm, D = (v.to(work) for v in (x, dt, A, Bm, Cm, D))
    decay = torch.exp(dt.unsqueeze(-1) * A)  # [B, T, Di, N]
    drive = (dt * x).unsqueeze(-1) * Bm.unsqueeze(2)
    h = x.new_zeros(x.shape[0], x.shape[2], A.shape[1]) if h0 is None else h0.to(work)
    ys = []
    for t in range(x.shape[1]):
        h = decay[:, t] * h + drive[:, t]
        ys.append(torch.bmm(h, Cm[:, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(ys, dim=1) + x * D, h


def mamba_split(dbc: torch.Tensor, rank: int, n: int):
    """x_proj's output -> (dt input [.., R], B [.., N], C [.., N])."""
    return dbc.split([rank, n, n], dim=-1)


def heads(qkv: torch.Tensor, n_heads: int):
    """[B, T, 3H] -> q, k, v [B, T, heads, head dim] (views, FlashAttention's layout)."""
    b, t, three_h = qkv.shape
    return qkv.view(b, t, 3, n_heads, three_h // (3 * n_heads)).unbind(2)
