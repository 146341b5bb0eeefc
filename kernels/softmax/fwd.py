"""softmax_forward: the config's path launched (config=None: pick_forward's). The paths are rows.py
(rows in registers), split.py (a few wide rows over several programs) and wide.py (rows too wide for
registers: lines, coop)."""
from __future__ import annotations

import torch

from .config import CoopConfig, LinesConfig, RowsConfig, SplitConfig, pick_forward
from .rows import rows_forward
from .split import split_forward
from .wide import coop_forward, lines_forward

_FORWARD = {RowsConfig: rows_forward, SplitConfig: split_forward, LinesConfig: lines_forward}


def launcher_of(table: dict, config):
    """The launcher of `config`'s path in `table` (a pass's paths); ValueError naming the valid ones."""
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
    launcher_of(_FORWARD, config)(x, y, config)
    return y
