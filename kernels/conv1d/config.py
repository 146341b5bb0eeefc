"""conv1d's tuned configs: the depthwise kernels' tiles (time x channels), and the channel-mixing
kernels' matrix tiles (the forward and dx are matrix products over K taps x input channels,
dW one over batch x time per tap).

The sm90 depthwise values are pick_depthwise's, from A/Bs on the H200 (not tuned on the H100); the
mixing ones the usual Hopper bf16 matmul tiles, not measured winners yet; the CPU ones are
small so that the interpreter's tests cross several tiles."""
from __future__ import annotations

from dataclasses import dataclass

import triton

from .._host.config import arch, tunable


@dataclass(frozen=True)
class DepthwiseConfig:
    block_t: int = 32  # time steps a tile
    block_f: int = 128  # channels a tile
    warps: int = 4
    bwd_block_t: int = 16  # time steps a tile
    bwd_block_f: int = 128
    bwd_span: int = 512  # time steps a backward program walks (its dw, dbias sums added up after)
    bwd_warps: int = 4
    bwd_channels_first: bool = True  # programs numbered channel block first (neighbours read one row's channels)
    channels_first: bool = False  # the forward's programs so numbered


@dataclass(frozen=True)
class MixConfig:
    block_t: int = 128  # output rows (time steps) a program
    block_o: int = 128  # output channels a program
    block_i: int = 64  # input channels a step of the reduction
    warps: int = 8
    stages: int = 3
    dw_block_o: int = 128  # dW: output x input channels a program, time steps a reduction step
    dw_block_i: int = 128
    dw_block_t: int = 64
    dw_warps: int = 8
    dw_stages: int = 3


_CPU_DW = DepthwiseConfig(8, 16, 1, 8, 16, 16, 1)
_CPU_MIX = MixConfig(16, 16, 16, 1, 1, 16, 16, 16, 1, 1)


@tunable
def pick_depthwise(batch: int, steps: int, channels: int, width: int, device) -> DepthwiseConfig:
    if arch(device) == "cpu":
        return _CPU_DW
    # lab/results/conv1d_bwd_ab_h200.txt (lab.ab, H200, the grid's six depthwise shapes): 64 channels
    # and 2 warps a backward program took 0.93-1.00x the time of 128 and 4 at each (and were the
    # fastest of the [taps, steps, channels] kernel's tiles at widths 3 and 4); 8 steps a tile
    # 0.66-0.92x at width 4 but for B32 T60 (1.10x), 1.16-1.21x at widths 2 and 3. Wider (no grid
    # shape): that kernel's tiles hold next_pow2(K) shifted copies of its steps, 32 rows in all. The
    # forward's programs channel block first: 0.94-0.99x at three shapes. Since the taps' weights
    # are loaded before the time loop, width 3 in 16-step tiles holds 174 registers (sm_90, Triton
    # 3.6): 8 steps took 0.738x its time, 32 steps 0.803x; width 2 keeps 16 (8: 1.12x)
    # (lab/results/conv1d_k3_h200_87f8f94.txt)
    if width <= 4:
        bwd_t = 8 if width >= 3 else 16
    else:
        bwd_t = max(1, 32 // triton.next_power_of_2(width))
    return DepthwiseConfig(channels_first=True, bwd_block_t=bwd_t, bwd_block_f=64, bwd_warps=2)


@tunable
def pick_mix(batch: int, steps: int, channels: int, width: int, device) -> MixConfig:
    if arch(device) == "cpu":
        return _CPU_MIX
    if channels <= 256:  # Cortex's sizes: smaller tiles, more programs
        return MixConfig(block_t=64, block_o=64, block_i=64, warps=4, dw_block_o=64, dw_block_i=64, dw_warps=4)
    return MixConfig()
