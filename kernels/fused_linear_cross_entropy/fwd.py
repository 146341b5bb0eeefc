"""The chunked forward: per chunk of C tokens, logits_c = x_c @ W.T (cuBLAS) into one reused [C, V]
buffer; cross_entropy's kernel turns it, in place, into per-row losses and dlogits_c (already
divided by the number of non-ignored tokens of the whole batch); then dx_c = dlogits_c @ W and
dW += dlogits_c.T @ x_c (cuBLAS, accumulating into dW with beta = 1). Peak memory is dW + dx + one
chunk instead of several [T, V] tensors; the FLOPs are eager's (6 T H V), the logits traffic is one
chunk-sized write, read and write per chunk."""
from __future__ import annotations

import torch

from ..cross_entropy import cross_entropy_rows, finish_mean
from .config import FLCEConfig, pick


def fused_linear_cross_entropy_forward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                       ignore_index: int, label_smoothing: float, need_dx: bool,
                                       need_dw: bool, config: FLCEConfig | None = None):
    """(mean loss in x's dtype, dx or None, dW or None). config: an FLCEConfig to force (None:
    config.pick's)."""
    T, H = x.shape
    V = weight.shape[0]
    x, weight, target = x.contiguous(), weight.contiguous(), target.contiguous()
    C = (config or pick(T, V, x.dtype)).chunk
    if C < 1:
        raise ValueError(f"FLCEConfig.chunk must be at least 1: got {C}")
    has_grad = need_dx or need_dw
    buf = torch.empty((min(C, T), V), dtype=x.dtype, device=x.device)
    loss_rows = torch.empty(T, dtype=torch.float32, device=x.device)
    # The mean is over the whole batch's non-ignored tokens: counted once, on the device (no sync).
    n_valid = (target != ignore_index).sum() if has_grad else None
    dx = torch.empty_like(x) if need_dx else None
    dw = None
    for s in range(0, T, C):
        e = min(s + C, T)
        x_c, logits = x[s:e], buf[: e - s]
        torch.mm(x_c, weight.t(), out=logits)
        cross_entropy_rows(logits, target[s:e], loss_rows[s:e], logits if has_grad else None,
                           ignore_index, label_smoothing, n_valid=n_valid)
        if need_dx:
            torch.mm(logits, weight, out=dx[s:e])
        if need_dw:
            if dw is None:
                dw = torch.mm(logits.t(), x_c)  # the first chunk writes dW: no zero fill
            else:
                dw.addmm_(logits.t(), x_c)  # cuBLAS accumulates in fp32, rounds once per chunk
    return finish_mean(loss_rows, target, ignore_index, x.dtype), dx, dw
