"""RoPE: rotary position embedding of q and k in one launch, HF LLaMA layout (rotate_half).

    y = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1]   (halves of head_dim)

q [B, Hq, T, D] and k [B, Hk, T, D] may have different head counts (GQA/MQA). cos and sin are
[1, T, D] or [B, T, D] (or [T, D]), i.e. what HF's rotary-embedding module returns for explicit
position ids and what Liger's liger_rotary_pos_emb takes. Any layout with a contiguous head_dim
works (HF's attention views its [B, T, H, D] projections as [B, H, T, D] through a transpose).
Gradients flow to q and k; cos and sin are constants.

`rope(q, k, cos, sin)` is differentiable; `rope_apply` is the raw launch (backward=True: the
transpose, for gradients), with `config=None` (config.pick's choice) or a RoPEConfig to force.
"""
from __future__ import annotations

import torch

from .config import RoPEConfig, pick
from .fwd import rope_apply

__all__ = ["RoPEConfig", "RoPEFunction", "pick", "rope", "rope_apply"]


class RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, config):
        ctx.save_for_backward(cos, sin)
        ctx.hq, ctx.hk = q.shape[1], k.shape[1]
        ctx.config = config
        return rope_apply(q, k, cos, sin, config=config)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        # an output that took no part in the loss has no gradient: rotate zeros for it
        like = dq if dq is not None else dk
        B, T, D = like.shape[0], like.shape[2], like.shape[3]
        if dq is None:
            dq = like.new_zeros((B, ctx.hq, T, D))
        if dk is None:
            dk = like.new_zeros((B, ctx.hk, T, D))
        dq, dk = rope_apply(dq, dk, cos, sin, backward=True, config=ctx.config)
        return dq, dk, None, None, None


def _check(q, k, cos, sin) -> None:
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q and k must be [B, H, T, D], got {tuple(q.shape)} and {tuple(k.shape)}")
    B, _, T, D = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, T, D) or k.dtype != q.dtype:
        raise ValueError(f"q and k must share batch, sequence, head_dim and dtype: {tuple(q.shape)} {q.dtype} "
                         f"vs {tuple(k.shape)} {k.dtype}")
    if D % 2:
        raise ValueError(f"head_dim must be even for the half rotation, got {D}")
    ok = (cos.dim() == 2 and tuple(cos.shape) == (T, D)) or (
        cos.dim() == 3 and cos.shape[0] in (1, B) and tuple(cos.shape[1:]) == (T, D))
    if not ok or cos.shape != sin.shape:
        raise ValueError(f"cos and sin must be [T, D], [1, T, D] or [B, T, D] with T={T}, D={D}, "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         config: RoPEConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotated q, rotated k); `config` for the forward and the backward (None: config.pick's)."""
    _check(q, k, cos, sin)
    return RoPEFunction.apply(q, k, cos, sin, config)
