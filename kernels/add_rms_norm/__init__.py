"""Residual add fused with RMSNorm: h = x + residual, y = rms_norm(h) * w; returns (h, y).

The pre-norm decoder layer's `residual = hidden + residual; hidden = norm(residual)`: h is the new
residual stream, y the normalised input of the next sublayer. Fused, the forward reads x and the
residual once and writes h and y once (unfused: the add writes h, the norm reads it back); the
backward folds h's own gradient into the norm's and writes one gradient, shared by x and residual.

The kernels, launchers and configs are rms_norm's: its forward kernels take the residual under the
constexpr HAS_RES, its backward kernels add h's upstream gradient under HAS_DH (`config.py`).
"""
from __future__ import annotations

import torch

from ..rms_norm import rms_norm_backward, rms_norm_forward

__all__ = ["AddRMSNormFunction", "add_rms_norm"]


class AddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, w, eps):
        y, h, rstd = rms_norm_forward(x, w, eps, residual=residual)
        ctx.save_for_backward(h, w, rstd)
        ctx.set_materialize_grads(False)  # an unused output costs nothing in the backward
        return h, y

    @staticmethod
    def backward(ctx, dh, dy):
        h, w, rstd = ctx.saved_tensors
        if dy is None:  # only h was used: the norm contributes nothing
            g = dh if dh is not None else torch.zeros_like(h)
            return g, g, torch.zeros_like(w), None
        dx, dw = rms_norm_backward(dy, h, w, rstd, dh=dh)
        # d/dx and d/dresidual of h = x + residual are the same tensor: written once, returned twice
        return dx, dx, dw, None


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6):
    if torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or w.requires_grad):
        return AddRMSNormFunction.apply(x, residual, w, eps)
    y, h, _ = rms_norm_forward(x, w, eps, residual=residual, need_rstd=False)
    return h, y
