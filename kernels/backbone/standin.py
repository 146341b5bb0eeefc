"""PyTorch stand-ins for the two ops the kcollect backbone takes from their own folders once they
exist: Mamba's selective scan (kernels/selective_scan) and the LSTM (kernels/lstm). Each has that
op's signature, so switching is one import in ours.py:

    from .standin import lstm, selective_scan
    ->  from ..lstm import lstm
        from ..selective_scan import selective_scan

The rows of the kcollect provider record which of the two ran (ours.config_of)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .blocks import scan, work_dtype

KIND = "pytorch stand-in"


def selective_scan(x, delta, A, B, C, D, z):
    """y [B, T, D] = (C_t . h_t + D x_t) * silu(z_t), h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t,
    dt = softplus(delta), h_0 = 0: kernels/selective_scan's semantics, output in x's dtype."""
    work = work_dtype(x)
    y, _ = scan(x, F.softplus(delta.to(work)), A, B, C, D)
    return (y * F.silu(z.to(work))).to(x.dtype)


def lstm(x, h0, c0, w_ih, w_hh, b):
    """(y [B, T, H], h_n, c_n) of one LSTM layer (gate order i, f, g, o; b the two biases summed),
    kernels/lstm's signature without resets: the input projection of all steps as one GEMM, then
    the recurrence step by step, the cell in fp32."""
    work = work_dtype(x)
    gx = F.linear(x, w_ih, b)
    h, c = h0, c0.to(work)
    ys = []
    for t in range(x.shape[1]):
        i, f, g, o = (gx[:, t] + F.linear(h, w_hh)).to(work).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = (torch.sigmoid(o) * torch.tanh(c)).to(x.dtype)
        ys.append(h)
    return torch.stack(ys, dim=1), h, c.to(x.dtype)
