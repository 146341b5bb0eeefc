"""RoPE in plain maths: the float64 reference (the spec's gate and the tests use it)."""
from __future__ import annotations

import torch


def reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """(rotated q, rotated k): each half of head_dim rotated by the other, cos and sin as given."""
    c = cos if cos.dim() == 3 else cos[None]
    s = sin if sin.dim() == 3 else sin[None]
    c, s = c[:, None], s[:, None]  # [B or 1, 1, T, D]: the same rotation for every head
    half = q.shape[-1] // 2

    def rotate(x):
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * c[..., :half] - x2 * s[..., :half], x2 * c[..., half:] + x1 * s[..., half:]), dim=-1)

    return rotate(q), rotate(k)
