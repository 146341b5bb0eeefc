"""The selective scan's tuned config: a program owns `block_d` channels (all N states of each) of
one sequence and walks time in chunks of `chunk` steps, each chunk one tl.associative_scan over a
[chunk, block_d, N] tile. The forward keeps the state at every chunk's end for the backward,
which recomputes each chunk from it: the backward's chunk is the forward's (fp32 states: at
chunk 16 and N 16, four bytes a step and channel, as much as two bf16 activations).

The sm90 values are lab/scans_tune.py's on the H100 at one training shape (see pick); not tuned on
the H200. The CPU ones are small so that the interpreter's tests cross several chunks and channel
blocks."""
from __future__ import annotations

from dataclasses import dataclass

import triton

from .._lib import sm_count
from .._lib.config import arch, tunable


@dataclass(frozen=True)
class SelectiveScanConfig:
    chunk: int = 16
    block_d: int = 16
    warps: int = 4
    bwd_block_d: int = 16
    bwd_warps: int = 4
    path: str = "tiles"  # the forward's kernel: "tiles" (kernels.py) or "lanes" (lanes.py; block_d = 32 * warps * vec)
    steps: int = 8  # time steps a lanes tile (chunk must be a multiple: the states kept for the backward)
    segments: int = 1  # time splits of the lanes forward (1: one program walks the whole sequence)


@tunable
def pick(batch: int, steps: int, channels: int, states: int, device) -> SelectiveScanConfig:
    """The config for B sequences of T steps, D channels of N states, on `device`'s architecture."""
    if arch(device) == "cpu":
        return SelectiveScanConfig(chunk=8, block_d=8, warps=1, bwd_block_d=8, bwd_warps=1)
    # lab/scans_tune.py on the H100 at B8 T2048 D2048 N16 (lab/results/scans_tune_h100.txt): the
    # forward's first guess was within 2% of the best candidate (1.496 against 1.473 ms); the
    # backward at 16 channels a program, 4 warps, 10.43 ms against 13.72 at 8, though ptxas reports
    # 255 registers a thread there and spills (8 channels: 215, none). Where 16-channel programs
    # would not fill the GPU twice over, 8: the real-time B1 D512 backward took 0.102 ms with 32
    # programs of 16 against 0.064 with 64 of 8 (full-grid runs a7847f59 and 7952664d)
    if batch * triton.cdiv(channels, 16) < 2 * sm_count(device):
        return SelectiveScanConfig(bwd_block_d=8)
    return SelectiveScanConfig()
