"""The forward (which computes the gradient too: cross_entropy has no backward kernel of its own),
launched on the config's path (config=None: pick's): cross_entropy_rows / cross_entropy_forward. The
paths are rows.py and split.py."""
from __future__ import annotations

import torch

from .config import RowsConfig, SplitConfig, pick
from .rows import finish_mean, rows_launch
from .split import split_launch


def _check_config(config) -> None:
    if not isinstance(config, (RowsConfig, SplitConfig)):
        raise ValueError(f"not a cross_entropy config: {type(config).__name__} (valid: RowsConfig, SplitConfig)")


def cross_entropy_rows(logits: torch.Tensor, target: torch.Tensor, loss_rows: torch.Tensor,
                       dlogits: torch.Tensor | None, ignore_index: int, label_smoothing: float,
                       n_valid: torch.Tensor | None = None, config=None) -> None:
    """Per-row losses into loss_rows (fp32 [N]) and, when dlogits is given (it may be logits itself:
    in place), the gradient of the mean loss. n_valid (a device scalar) is counted in the kernel
    when not given; fused_linear_cross_entropy passes it because it calls this on chunks of rows.
    config: a RowsConfig or SplitConfig to force (None: pick's)."""
    n_rows, V = logits.shape
    config = config or pick(n_rows, V, logits.dtype, logits.device, dlogits is not None, n_valid is not None)
    _check_config(config)
    launch = split_launch if isinstance(config, SplitConfig) else rows_launch
    launch(logits, target, loss_rows, dlogits, ignore_index, label_smoothing, n_valid, config)


def cross_entropy_forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int,
                          label_smoothing: float, need_grad: bool,
                          config=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mean loss in the logits' dtype, gradient of it or None). Never copies the logits (unless
    their last dimension is strided); the gradient is a new tensor, the logits are left intact."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    target = target.contiguous()
    n_rows, V = logits.shape
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    dlogits = torch.empty_like(logits, memory_format=torch.contiguous_format) if need_grad else None
    config = config or pick(n_rows, V, logits.dtype, logits.device, need_grad)
    _check_config(config)
    if isinstance(config, SplitConfig):
        # the split path's last launch writes the mean too: no finish_mean launch
        out = torch.empty((), dtype=logits.dtype, device=logits.device)
        split_launch(logits, target, loss_rows, dlogits, ignore_index, label_smoothing, None, config, out)
        return out, dlogits
    rows_launch(logits, target, loss_rows, dlogits, ignore_index, label_smoothing, None, config)
    return finish_mean(loss_rows, target, ignore_index, logits.dtype), dlogits
