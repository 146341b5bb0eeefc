"""softmax_forward / softmax_backward: the config's path launched (config=None: the heuristic's)."""
from __future__ import annotations

import torch

from .config import CoopConfig, LinesConfig, RowsConfig, SplitConfig, StreamConfig, pick_backward, pick_forward
from .rows import rows_backward, rows_forward
from .split import split_backward, split_forward
from .wide import coop_backward, coop_forward, lines_forward, stream_backward

_FORWARD = {RowsConfig: rows_forward, SplitConfig: split_forward, LinesConfig: lines_forward}
_BACKWARD = {RowsConfig: rows_backward, SplitConfig: split_backward, StreamConfig: stream_backward}


def _path(table: dict, config):
    if type(config) not in table:
        names = ", ".join(sorted(t.__name__ for t in (*table, CoopConfig)))
        raise ValueError(f"not a config of this direction: {type(config).__name__} (valid: {names})")
    return table[type(config)]


def softmax_forward(x: torch.Tensor, config=None) -> torch.Tensor:
    """y = softmax(x) over the rows of x [M, N] (contiguous). config: a RowsConfig, SplitConfig,
    CoopConfig or LinesConfig to force (None: pick_forward's). A coop config where not even one
    group of a row's programs fits on the GPU falls back to pick_forward's other choice."""
    M, N = x.shape
    y = torch.empty_like(x)
    config = config or pick_forward(M, N, x.dtype, x.device)
    if isinstance(config, CoopConfig):
        if coop_forward(x, y, config):
            return y
        config = pick_forward(M, N, x.dtype, x.device, coop=False)
    _path(_FORWARD, config)(x, y, config)
    return y


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
    _path(_BACKWARD, config)(y, dy, dx, config)
    return dx
