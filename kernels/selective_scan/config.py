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
0.266 ms with the config below). The lanes forward's split, share and poly (lanes.py) are at 1,
off and 0 in `lanes` (lab/results/ss_variants_h200_f927bdc.txt: slower). With the lanes forward
comes the lanes backward (bwd_lanes.py, bwd_path "lanes"), which reads the states the forward keeps
every `chunk` steps: lab/ss_bwd.py on an H200 (lab/results/ss_bwd_h200_96d2d99.txt) measured it at
0.13x to 0.48x the tiles backward's time at its seven shapes (B8 T2048 D2048 N16: 10.63 -> 2.91 ms
with states kept every 16 steps; LANES_CHUNK says why 4 now)."""
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
    bwd_ahead: int = 0  # lanes backward: each tile prefetches the inputs of the tile this many on (0: none; GPU)
    bwd_level: int = 2  # ... into L1 (1) or L2 (2)


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
# The lanes backward's one-warp programs walk time whole from 4 warps an SM on; below, in twice the
# segments of the forward's rule (2 from 2 warps an SM on): lab/ss_bwd.py on the H200 (tiles of 2
# steps, 32 channels a warp), B8 T2048 D2048 (512 warps) 2 segments 2.91 ms against 4.55 whole,
# B32 T60 D512 (512) 0.114 against 0.149, B4 T4096 D2048 (256) 10 against 5 3.12 against 3.99, B3
# T1000 D1000 (96) 22 against 11; B16 T1024 D1536 (768) whole 2.43 against 2.65 in 2, B8 T2048
# D4096 (1024) 4.99 against 5.34
_LANES_BWD_WHOLE = 4
# Each lanes backward tile prefetches the inputs of the tile this many on, and the state kept before
# its chunk, into L2 (bwd_lanes._prefetch): Nsight Compute on the H200 had 55% of the backward's stall
# samples waiting on loads (lab/results/ncu_scans_lstm_h200_2e61fad.txt). lab/scan_prefetch.py on the
# H200 (lab/results/scan_prefetch_h200_d3e7e33.txt): one tile ahead took 0.86x-0.95x the time at six of
# the grid's seven shapes, 1.00x at B1 T60 D512 (L1 or L2 alike, 2 and 4 tiles ahead no better); and
# with it twice the rule's segments, where the rule cuts time at all and the segments stay at least
# _LANES_BWD_LONG steps: B8 T2048 D2048 4 against 2 (0.80x against 0.86x the time without prefetch,
# both prefetching 2 ahead), B4 T4096 D2048 20 against 10 (0.78x against 0.90x); twice the segments
# were slower where they would be shorter (B32 T60 D512 2 -> 4, B3 T1000 D1000 22 -> 44) and where
# the rule walks time whole (B16 T1024 D1536, B8 T2048 D4096: 1 -> 2). Around the pick that makes
# (lab/results/scan_prefetch_h200_b612f69.txt) it was the fastest or within 1% at six of the seven,
# and without the prefetch 1.035x-1.147x its time; B3 T1000 D1000 in half its segments (11) took
# 0.954x (one shape: left). Measured on the H200 only
LANES_BWD_AHEAD = 1
_LANES_BWD_LONG = 128
# The steps between the states the lanes forward keeps for the lanes backward (a multiple of the
# backward's tile of 2; the forward keeping them walks tiles of gcd(its tile, this)). The backward
# walks a chunk's tiles from its last and advances the kept state over the tiles before each one:
# the shorter the chunk, the less of that. On the H200 chunks of 8 took 0.63x-0.87x 16's backward
# at the grid's seven shapes (lab/results/scans_chunk_ab_h200_3c3d5d4.txt), and chunks of 4 (the
# forward in tiles of 4 while it keeps them) 0.89x-0.97x 8's backward and 0.92x-0.98x its
# forward+backward at the same seven (lab/results/ss_chunk4_ab_h200_46d29e2.txt). The inference
# forward keeps none and walks tiles of 8. The kept states are fp32, N of them a channel every
# chunk: at N 16, 16 bytes a step and channel
LANES_CHUNK = 4


@tunable
def pick(batch: int, steps: int, channels: int, states: int, device) -> SelectiveScanConfig:
    """The config for B sequences of T steps, D channels of N states, on `device`'s architecture."""
    if LANES_FROM is not None and batch * steps * channels >= LANES_FROM:
        return lanes(batch, steps, channels, device)
    return tiles(batch, channels, device)


def lanes(batch: int, steps: int, channels: int, device) -> SelectiveScanConfig:
    """The lanes forward's config: one-warp programs of 32 channels (1 a thread, with its N states
    and 8 steps in registers: sm_90 compile at N 16, 252 registers, no spill (an offline Triton 3.6
    compile at D 2048 of this code: 255 and 36 spill loads); faster than 4 steps at every H200
    inference shape but B3 T1000 D1000, 2% slower there), time whole or in segments (see
    _LANES_FULL); the states kept every LANES_CHUNK steps (in tiles of 4 while it keeps them);
    the lanes backward in tiles of 2 steps of one warp's 32 channels, its segments by
    _LANES_BWD_WHOLE and _LANES_BWD_LONG, each tile prefetching LANES_BWD_AHEAD on (on the CPU 8
    channels a program, tiles of 4 and 2 steps, chunks of 8, no prefetch)."""
    cpu = arch(device) == "cpu"
    block_d, tile, bwd_tile = (8, 4, 2) if cpu else (32, 8, 2)
    base = tiles(batch, channels, device)
    chunk = base.chunk if cpu else LANES_CHUNK
    sms = sm_count(device)
    programs = max(1, batch * triton.cdiv(channels, block_d))
    want = 1 if programs >= _LANES_FULL * sms else triton.cdiv(_LANES_WARPS_PER_SM * sms, programs)
    bwd_want = 1 if programs >= _LANES_BWD_WHOLE * sms else 2 if programs >= _LANES_FULL * sms else 2 * want
    if not cpu and bwd_want > 1 and steps // (2 * bwd_want) >= _LANES_BWD_LONG:
        bwd_want *= 2
    return replace(base, chunk=chunk, block_d=block_d, warps=1, path="lanes", steps=tile,
                   segments=max(1, min(want, triton.cdiv(steps, tile))), bwd_path="lanes", bwd_block_d=block_d,
                   bwd_warps=1, bwd_steps=bwd_tile, bwd_segments=max(1, min(bwd_want, triton.cdiv(steps, chunk))),
                   bwd_ahead=LANES_BWD_AHEAD)


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
