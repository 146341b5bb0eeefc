"""Fused linear + cross-entropy in plain maths: the float64 reference (the spec's gate and the tests
use it): the logits x @ W.T whole, then cross_entropy's reference."""
from __future__ import annotations

import torch

from ..cross_entropy import IGNORE_INDEX
from ..cross_entropy.naive import reference as cross_entropy_reference


def reference(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
              label_smoothing: float = 0.0) -> torch.Tensor:
    return cross_entropy_reference(x @ weight.T, target, ignore_index, label_smoothing)
