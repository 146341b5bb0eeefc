"""The selective scan's tuned config: a program owns `block_d` channels (all N states of each) of
one sequence and walks time in chunks of `chunk` steps, each chunk one tl.associative_scan over a
[chunk, block_d, N] tile. The forward keeps the state at every chunk's end for the backward,
which recomputes each chunk from it: the backward's chunk is the forward's (fp32 states: at
chunk 16 and N 16, four bytes a step and channel, as much as two bf16 activations).

The sm90 values are lab/scans_tune.py's on the H100 at one training shape (see pick); not tuned on
the H200. The CPU ones are small so that the interpreter's tests cross several chunks and channel
blocks.

The lanes forward (lanes.py, path "lanes") keeps time and states in each thread's registers;
`lanes` is its config, which `pick` returns from LANES_FROM steps x channels (B * T * D) on. lab/
scans_ab.py on an H200 (lab/results/scans_ab_h200.txt): faster than the tiles pick at every shape
measured, B1 T60 D512 (30720) the smallest, 0.59x to 0.18x its time (B8 T2048 D2048 N16: 1.519 ->
0.266 ms with the config below). The picked backward is the tiles path's either way (it reads the states
the lanes forward keeps every `chunk` steps). The lanes forward's split, share and poly (lanes.py)
are at 1, off and 0 in `lanes` until lab/ss_variants.py's GPU numbers say otherwise. The lanes
backward (bwd_lanes.py, bwd_path "lanes") is not picked: lab/ss_bwd.py times it against the tiles
backward on the GPU first."""
from __future__ import annotations

from dataclasses import dataclass, replace

import triton

from .._host.device import sm_count
from .._host.config import arch, tunable


@dataclass(frozen=True)
class SelectiveScanConfig:
    chunk: int = 16
    block_d: int = 16
    warps: int = 4
    bwd_block_d: int = 16
    bwd_warps: int = 4
    # the forward's kernel: "tiles" (scan.py) or "lanes" (lanes.py; block_d * split = 32 * warps * vec)
    path: str = "tiles"
    steps: int = 8  # time steps a lanes tile (chunk must be a multiple: the states kept for the backward)
    segments: int = 1  # time splits of the lanes forward (1: one program walks the whole sequence)
    split: int = 1  # lanes a channel's states are spread over in the lanes forward (1, 2, 4, 8)
    poly: int = 0  # the lanes forward (bf16/fp16) takes 1/poly of its decays by a polynomial (0: none; 2, 4, 8)
    share: bool = False  # split > 1: softplus(delta) once a channel and step, handed to its lanes
    # the backward's kernel: "tiles" (scan.py: bwd_block_d channels a program) or "lanes" (bwd_lanes.py:
    # bwd_block_d = 32 * bwd_warps * vec channels, bwd_steps a tile, a divisor of chunk; time in bwd_segments)
    bwd_path: str = "tiles"
    bwd_steps: int = 4
    bwd_segments: int = 1
    bwd_scatter: bool = True  # lanes backward: dB, dC summed over a warp by a reduce-scatter (bwd_lanes._warp_sums)


# B * T * D from which pick returns the lanes forward (None: never)
LANES_FROM: int | None = 30720
# Lanes programs are one warp of 32 channels. A grid of _LANES_FULL warps an SM or more walks time
# whole (a segment more costs one more read of x and delta, and their exponentials: on the H200 one
# segment against the 2-3 that 8 warps an SM asked for, 0.266 against 0.363 ms at B8 T2048 D2048,
# 0.449 against 0.648 at B8 T2048 D4096, 0.015 against 0.021 at B32 T60 D512); a smaller one is cut
# into segments until it holds _LANES_WARPS_PER_SM (B3 T1000 D1000: 11 segments, 0.049 ms, against
# 0.070 with 5)
_LANES_FULL = 2
_LANES_WARPS_PER_SM = 8


@tunable
def pick(batch: int, steps: int, channels: int, states: int, device) -> SelectiveScanConfig:
    """The config for B sequences of T steps, D channels of N states, on `device`'s architecture."""
    if LANES_FROM is not None and batch * steps * channels >= LANES_FROM:
        return lanes(batch, steps, channels, device)
    return tiles(batch, channels, device)


def lanes(batch: int, steps: int, channels: int, device) -> SelectiveScanConfig:
    """The lanes forward's config: one-warp programs of 32 channels (1 a thread, with its N states
    and 8 steps in registers: sm_90 compile at N 16, 252 registers, no spill (an offline Triton 3.6
    compile at D 2048 of this code: 255 and 36 spill loads); faster than 4 steps
    at every H200 shape but B3 T1000 D1000, 2% slower there), time whole or in segments (see
    _LANES_FULL); the tiles backward's config and chunk (8 channels a program and 4 steps on the
    CPU)."""
    cpu = arch(device) == "cpu"
    block_d, tile = (8, 4) if cpu else (32, 8)
    programs = max(1, batch * triton.cdiv(channels, block_d))
    want = 1 if programs >= _LANES_FULL * sm_count(device) else \
        triton.cdiv(_LANES_WARPS_PER_SM * sm_count(device), programs)
    return replace(tiles(batch, channels, device), block_d=block_d, warps=1, path="lanes", steps=tile,
                   segments=max(1, min(want, triton.cdiv(steps, tile))))


def tiles(batch: int, channels: int, device) -> SelectiveScanConfig:
    """The tiles path's config."""
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
