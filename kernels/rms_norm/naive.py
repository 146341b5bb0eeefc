"""RMSNorm in plain maths: the float64 reference (the spec's gate, add_rms_norm's reference and the
tests use it)."""
from __future__ import annotations

import torch


def reference(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * w over the last dimension."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w
