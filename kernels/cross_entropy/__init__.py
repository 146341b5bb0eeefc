"""Cross-entropy: mean over the non-ignored rows of -log softmax(logits)[target], with optional
label smoothing, for language-model heads (logits [tokens, vocab], vocab 32k to 256k).

The gradient is computed in the forward, in the same pass over the logits (see rows.py): backward
only multiplies it by the upstream scalar. Hence no "bwd" mode: backward does no work of its own
(nothing at all when the upstream gradient is 1, one in-place scaling pass otherwise); timing it
alone would compare our multiply with torch's complete softmax backward. "fwd+bwd" is the honest
comparison of a training step, and "fwd" (under no_grad) the inference/evaluation one.

`cross_entropy(...)` is differentiable; `cross_entropy_forward` and `cross_entropy_rows` are the raw
launches, with `config=None` (config.pick's choice) or a RowsConfig / SplitConfig to force."""
from __future__ import annotations

import torch

from .config import RowsConfig, SplitConfig, pick
from .fwd import cross_entropy_forward, cross_entropy_rows
from .rows import finish_mean, scale_

__all__ = ["IGNORE_INDEX", "CrossEntropyFunction", "RowsConfig", "SplitConfig", "cross_entropy",
           "cross_entropy_forward", "cross_entropy_rows", "finish_mean", "pick", "scale_"]

IGNORE_INDEX = -100  # PyTorch's default, and what HF trainers put on padding/prompt tokens


def _check(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> None:
    if logits.dim() != 2 or target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(f"logits must be [N, V] and target [N]: got {tuple(logits.shape)} and {tuple(target.shape)}")
    if target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"target must be int64 or int32, got {target.dtype}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, label_smoothing, need_grad, config=None):
        loss, dlogits = cross_entropy_forward(logits, target, ignore_index, label_smoothing, need_grad, config)
        ctx.dlogits = dlogits
        return loss

    @staticmethod
    def backward(ctx, dloss):
        dlogits = ctx.dlogits
        if dlogits is None:
            raise RuntimeError("cross_entropy: the gradient was computed in the forward and already "
                               "consumed; a second backward through the same graph is not supported")
        ctx.dlogits = None  # scaled in place: a second backward would scale it twice
        return scale_(dlogits, dloss.reshape(())), None, None, None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """F.cross_entropy(logits, target, ignore_index=..., label_smoothing=...) with mean reduction."""
    _check(logits, target, label_smoothing)
    # Decided here, not inside forward (where grad mode is off): under no_grad, no gradient is
    # computed even if the logits require one.
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    return CrossEntropyFunction.apply(logits, target, ignore_index, float(label_smoothing), need_grad)
