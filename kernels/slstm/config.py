"""The sLSTM's launch config and its heuristic.

Heads are independent (the recurrent weights are block-diagonal per head), so one program runs the
whole sequence of one head for `bb` batch rows, with no waiting on other programs. Its four
[DH, DH] recurrent blocks stay in registers across timesteps when they are small (`resident`),
otherwise they are re-read every step (from L1, where the 128 KB of a 128-wide head fit), all four
at once or, where the four do not fit the shared memory the products stage them in, one at a time
(`split`: fitted, in __init__.py, picks it)."""
from __future__ import annotations

from dataclasses import dataclass

import triton

from .._host.config import arch, tunable
from .._host.device import sm_count

RESIDENT_BYTES = 32 * 1024


@dataclass(frozen=True)
class SLSTMConfig:
    bb: int = 16  # batch rows a program (16 at least: the M side of tl.dot; rows past B masked)
    resident: bool = True  # the head's recurrent weights held in registers across timesteps
    warps: int = 4
    warps_bwd: int = 8  # the backward holds more per step: at 4 warps it spills (sm_90, 64-wide heads)
    split: bool = False  # re-read weights one gate's block at a time: a quarter of the shared memory
    prefetch: bool = True  # the forward loads step t+1's inputs before step t's products
    prefetch_bwd: bool = True  # the backward loads step t-1's saved inputs before step t's products


@tunable
def pick(B: int, NH: int, DH: int, device) -> SLSTMConfig:
    """The smallest batch tile that still leaves programs for every SM (more rows a program only
    when heads x 16-row tiles outnumber the SMs twice over); weights resident up to 32 KB; 8 warps;
    the next step's inputs loaded ahead where the weights are resident.

    Measured on an H200 (lab/results/slstm_fwd_prefetch_h200_42d12b4.txt, bf16): at 64-wide resident
    heads the forward's prefetch is 13-17% faster than without and 8 warps a further 1-16% faster
    than 4; at 128-wide re-read heads, whose registers are already spilling, prefetch is 0-1.5%
    slower in the forward and 8-11% slower in the backward."""
    dp = max(16, triton.next_power_of_2(DH))
    resident = 4 * dp * dp * 2 <= RESIDENT_BYTES
    if arch(device) == "cpu":
        return SLSTMConfig(bb=16, resident=resident, warps=4, warps_bwd=4)
    bb = 16
    while bb < 64 and NH * triton.cdiv(B, bb) > 2 * sm_count(device):
        bb *= 2
    return SLSTMConfig(bb=bb, resident=resident, warps=8, prefetch=resident, prefetch_bwd=resident)
