"""Fused linear + cross-entropy: mean cross-entropy of x @ W.T (x [T, H], W [V, H]) without the
[T, V] logits ever existing at once: the LM head and its loss in one step, gradients for x and W
computed in the forward (Liger's design; backward only scales them by the upstream scalar). No
Triton kernels of its own: chunks of cuBLAS matmuls around cross_entropy's kernel (fwd.py).

No "fwd" or "bwd" mode: the op exists for training, and its backward does no work of its own (see
cross_entropy).

`fused_linear_cross_entropy(...)` is differentiable; `fused_linear_cross_entropy_forward` is the raw
launch, with `config=None` (config.pick's chunk) or an FLCEConfig to force."""
from __future__ import annotations

import torch

from ..cross_entropy import IGNORE_INDEX, scale_
from .fwd import fused_linear_cross_entropy_forward
from .config import FLCEConfig, pick

__all__ = ["FLCEConfig", "FusedLinearCrossEntropyFunction", "fused_linear_cross_entropy",
           "fused_linear_cross_entropy_forward", "pick"]


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target, ignore_index, label_smoothing, need_dx, need_dw, config):
        loss, dx, dw = fused_linear_cross_entropy_forward(x, weight, target, ignore_index, label_smoothing,
                                                         need_dx, need_dw, config)
        ctx.grads = (dx, dw)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        if ctx.grads is None:
            raise RuntimeError("fused_linear_cross_entropy: the gradients were computed in the forward "
                               "and already consumed; a second backward through the same graph is not supported")
        dx, dw = ctx.grads
        ctx.grads = None  # scaled in place: a second backward would scale them twice
        s = dloss.reshape(())
        if dx is not None:
            scale_(dx, s)
        if dw is not None:
            scale_(dw, s)
        return dx, dw, None, None, None, None, None, None


def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               ignore_index: int = IGNORE_INDEX, label_smoothing: float = 0.0,
                               config: FLCEConfig | None = None) -> torch.Tensor:
    """F.cross_entropy(x @ weight.T, target, ignore_index=..., label_smoothing=...), mean reduction.
    config: an FLCEConfig (tokens per chunk) to force (None: config.pick's)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x must be [T, H] and weight [V, H]: got {tuple(x.shape)} and {tuple(weight.shape)}")
    if target.shape != (x.shape[0],) or target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"target must be int64/int32 of shape [{x.shape[0]}]: got {tuple(target.shape)} {target.dtype}")
    if x.dtype != weight.dtype:
        raise ValueError(f"x and weight must share a dtype: {x.dtype} vs {weight.dtype}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    grad = torch.is_grad_enabled()  # decided here: forward runs with grad mode off
    return FusedLinearCrossEntropyFunction.apply(x, weight, target, ignore_index, float(label_smoothing),
                                                 grad and x.requires_grad, grad and weight.requires_grad, config)
