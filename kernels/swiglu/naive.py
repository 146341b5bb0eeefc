"""SwiGLU in plain maths: the float64 reference (the spec's gate and the tests use it)."""
from __future__ import annotations

import torch


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b = a * sigmoid(a) * b, written out."""
    return a / (1.0 + torch.exp(-a)) * b
