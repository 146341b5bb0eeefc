"""GELU in plain maths: the float64 reference (the spec's gate and the tests use it)."""
from __future__ import annotations

import math

import torch


def reference(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """x * Phi(x) with erf, or its tanh approximation (approximate="tanh", as F.gelu's)."""
    if approximate == "tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
