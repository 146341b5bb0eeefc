"""Causal conv1d with resets in plain PyTorch: the float64 reference (episodes as segment indices)
and the `eager` provider (windows masked tap by tap, the matmuls in cuBLAS)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _tap(xk, weight, k):
    """The contribution of x shifted by k steps (xk) through tap K-1-k of the weight."""
    w = weight[..., weight.shape[-1] - 1 - k]
    return xk * w[:, 0] if weight.shape[1] == 1 else xk @ w.transpose(0, 1)


def reference(x, weight, bias=None, resets=None):
    """y_t = bias + sum_k W_{K-1-k} x_{t-k} over the taps whose step t-k >= 0 lies in t's episode
    (episode = number of resets up to and including the step)."""
    B, T, _ = x.shape
    seg = torch.zeros(B, T, dtype=torch.long, device=x.device) if resets is None else resets.long().cumsum(1)
    y = torch.zeros(B, T, weight.shape[0], dtype=x.dtype, device=x.device)
    if bias is not None:
        y = y + bias
    for k in range(min(weight.shape[-1], T)):
        same = (seg[:, k:] == seg[:, : T - k]).to(x.dtype)[..., None]
        y = y + F.pad(_tap(x[:, : T - k] * same, weight, k), (0, 0, k, 0))
    return y


def eager(x, weight, bias=None, resets=None):
    """The same sum, each tap's window cut by the running product of 'no reset' flags."""
    T = x.shape[1]
    y = bias.expand(*x.shape[:2], -1) if bias is not None else 0
    keep = None if resets is None else (~resets).to(x.dtype)[..., None]
    alive = None
    for k in range(min(weight.shape[-1], T)):
        if keep is not None and k > 0:
            step = F.pad(keep[:, : T - k + 1], (0, 0, k - 1, 0), value=1.0)  # keep[t-k+1]
            alive = step if alive is None else alive * step
        xk = F.pad(x[:, : T - k], (0, 0, k, 0))
        y = y + _tap(xk if alive is None else xk * alive, weight, k)
    return y
