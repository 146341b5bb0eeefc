"""RMSNorm: y = x * rsqrt(mean(x^2, -1) + eps) * w, the normalisation of LLaMA-style models.

`rms_norm(x, w, eps)` is differentiable (gradients for x and w). `rms_norm_forward` /
`rms_norm_backward` are the raw launches, each with `config=None` (config.pick_forward's /
pick_backward's choice) or a config to force. Rows up to 16384 elements are held in registers
(RowsConfig, BwdRowsConfig); wider rows, in the forward, in two passes of chunks (LinesConfig), in
one program's registers (PackedConfig) or in segments over several programs (SplitConfig); in the
backward, on the GPU, in segments over programs that wait for each other's partial sums
(CoopConfig), elsewhere in two passes (ColsConfig). add_rms_norm runs the same kernels.
"""
from __future__ import annotations

import torch

from .._host.rows import LinesConfig
from .bwd import rms_norm_backward
from .config import (BwdRowsConfig, ColsConfig, CoopConfig, PackedConfig, RowsConfig, SplitConfig, pick_backward,
                     pick_forward)
from .fwd import rms_norm_forward

__all__ = ["BwdRowsConfig", "ColsConfig", "CoopConfig", "LinesConfig", "PackedConfig", "RMSNormFunction",
           "RowsConfig", "SplitConfig", "pick_backward", "pick_forward", "rms_norm", "rms_norm_backward",
           "rms_norm_forward"]


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        y, _, rstd = rms_norm_forward(x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, x, w, rstd)
        return dx, dw, None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return RMSNormFunction.apply(x, w, eps)
    return rms_norm_forward(x, w, eps, need_rstd=False)[0]  # inference: no rstd to keep
