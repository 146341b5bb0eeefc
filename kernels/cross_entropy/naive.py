"""Cross-entropy in plain maths: the float64 reference (the spec's gate, fused_linear_cross_entropy's
reference and the tests use it)."""
from __future__ import annotations

import torch

from . import IGNORE_INDEX


def reference(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
              label_smoothing: float = 0.0) -> torch.Tensor:
    # loss_i = (1 - eps) * (lse_i - x_i[y_i]) + eps * mean_j (lse_i - x_ij), mean over valid rows.
    # logsumexp rather than log_softmax: no [N, V] float64 output to keep (memory at 8192 x 128k).
    valid = target != ignore_index
    lse = torch.logsumexp(logits, dim=-1)
    x_y = logits.gather(1, torch.where(valid, target, 0).unsqueeze(1)).squeeze(1)
    per_row = lse - (1.0 - label_smoothing) * x_y
    if label_smoothing:
        per_row = per_row - label_smoothing * logits.mean(dim=-1)
    return torch.where(valid, per_row, 0.0).sum() / valid.sum()
