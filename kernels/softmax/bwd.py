"""softmax_backward: the config's path launched (config=None: pick_backward's); the paths as the
forward's (fwd.py), with stream (wide.py) for rows too wide for registers."""
from __future__ import annotations

import torch

from .config import CoopConfig, RowsConfig, SplitConfig, StreamConfig, pick_backward
from .fwd import launcher_of
from .rows import rows_backward
from .split import split_backward
from .wide import coop_backward, stream_backward

_BACKWARD = {RowsConfig: rows_backward, SplitConfig: split_backward, StreamConfig: stream_backward}


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, config=None) -> torch.Tensor:
    """dx = y * (dy - sum(dy * y)); y, dy [M, N] contiguous. config: a RowsConfig, SplitConfig,
    CoopConfig or StreamConfig to force (None: pick_backward's); coop falls back as in the forward."""
    M, N = y.shape
    dx = torch.empty_like(y)
    config = config or pick_backward(M, N, y.dtype, y.device)
    if isinstance(config, CoopConfig):
        if coop_backward(y, dy, dx, config):
            return dx
        config = pick_backward(M, N, y.dtype, y.device, coop=False)
    launcher_of(_BACKWARD, config)(y, dy, dx, config)
    return dx
