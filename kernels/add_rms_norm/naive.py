"""add_rms_norm in plain maths: the float64 reference (the spec's gate and the tests use it)."""
from __future__ import annotations

import torch

from ..rms_norm.naive import reference as rms_norm_reference


def reference(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6):
    """(h, y): h = x + residual, y = rms_norm(h) * w."""
    h = x + residual
    return h, rms_norm_reference(h, w, eps)
