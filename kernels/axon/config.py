"""The Axon layer's launch config: its recurrence is one complex-diagonal scan per (row, channel),
so a program runs `bh` channels of one batch row through the whole sequence (one warp for 32), and
the grid is channels x rows; on a GPU the time loop is software-pipelined over `stages` steps of
input (the scan itself is a chain of dependent multiply-adds)."""
from __future__ import annotations

from dataclasses import dataclass

import triton

from .._host.config import arch, tunable


@dataclass(frozen=True)
class AxonConfig:
    bh: int = 32  # channels a program
    warps: int = 1
    stages: int = 3


@tunable
def pick(B: int, H: int, device) -> AxonConfig:
    """16 channels a program (one warp): rows x channel blocks then cover the SMs at every shape of the
    grid but the single-row ones, and one binary serves them all."""
    if arch(device) == "cpu":
        return AxonConfig(bh=min(32, triton.next_power_of_2(H)), warps=1, stages=1)
    return AxonConfig(bh=16, warps=1, stages=3)
