"""GEGLU in plain maths: the float64 reference (the spec's gate and the tests use it)."""
from __future__ import annotations

import torch


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(a) * b, written out."""
    gelu = 0.5 * a * (1.0 + torch.tanh(0.7978845608028654 * (a + 0.044715 * a**3)))  # sqrt(2/pi)
    return gelu * b
