"""The RTU scan's tuned config: how a program tiles time and channels, and how long sequences are
split so that the whole GPU works on them.

A program owns `block_h` channels of one sequence and walks its time steps in chunks of `chunk`
(each chunk one tl.associative_scan, the state carried from chunk to chunk in registers). With few
sequences x channel blocks (Cortex's B 8 x H 64), time is also cut into `segments`: a first pass
scans each segment from a zero state and keeps its end state and transition, the main pass
starts each segment from the combined ends of those before it (one extra read of the inputs, so
it only pays where programs would otherwise leave SMs idle). The forward keeps the state at every
chunk's end for the backward, which recomputes each chunk from it instead of storing the
pre-activations: the backward's chunk is the forward's.

The sm90 values are lab/scans_tune.py's on the H100 (bf16, torch 2.11, Triton 3.6; its output is in
lab/results/scans_tune_h100.txt). The backward's chunk is the forward's, so they were chosen
together: 32-step chunks of 16 channels (one 32-byte sector a time step), 4 warps both ways. Against
the first guess (64 steps, backward 8 warps): B8 T8192 H1024 forward 0.915 -> 0.600 ms, backward
2.911 -> 2.233; B32 T2048 H2048 forward 1.278 -> 1.071, backward 5.766 -> 3.451. Splitting time
into segments lost wherever batch x channel blocks already fill the GPU (0.59 -> 1.02 ms), and won
at Cortex's B8 H64. Not tuned on the H200: there these are a guess. The CPU values are small so that
the interpreter's tests cross several chunks, segments and channel blocks.

The lanes path (lanes.py, path / bwd_path "lanes") keeps time in each thread's registers instead;
`lanes` is its config, which `pick` returns from LANES_FWD_FROM / LANES_BWD_FROM steps x channels
(B * T * H) on. lab/scans_ab.py on an H200 (lab/results/scans_ab_h200.txt): the lanes path was
faster at every shape measured, B4 T128 H64 (32768) the smallest: forward 0.86x to 0.16x the
tiles pick's time, backward 0.77x to 0.11x (B8 T8192 H1024 with resets: forward 0.951 -> 0.177 ms,
backward 2.338 -> 0.510)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import triton

from .._host.config import arch, tunable
from .._host.device import sm_count


@dataclass(frozen=True)
class RTUConfig:
    chunk: int = 32  # time steps a scan (and the backward's checkpoint interval)
    block_h: int = 16  # channels a program (forward)
    warps: int = 4
    segments: int = 1  # time splits of the forward (1: one program walks the whole sequence)
    bwd_block_h: int = 16
    bwd_warps: int = 4
    bwd_segments: int = 1
    path: str = "tiles"  # the forward's kernels: "tiles" (scan.py) or "lanes" (lanes.py)
    bwd_path: str = "tiles"  # the backward's (either reads the states either forward kept)
    steps: int = 0  # the lanes forward's tile (0: chunk; a multiple or a divisor of chunk)


# programs per SM below which a split over time pays for its extra read
_FILL = 2

# B * T * H from which pick returns the lanes path, forward and backward (None: never); each path's
# kept states serve the other's backward, so the two switch independently
LANES_FWD_FROM: int | None = 32768
LANES_BWD_FROM: int | None = 32768
# Lanes programs are one warp; time is cut into segments until the grid holds this many warps an
# SM: a segment more costs one more read of its inputs (the ends pass), too few leave latency bare
_LANES_WARPS_PER_SM = 8
# A forward grid that holds half that many warps an SM or more walks time whole: where cdiv asked for
# 2 segments (1024 one-warp programs, 7.8 warps an SM), one took 0.867x-0.892x the forward's time on
# the H200 at B64 T1024 H1024, B32 T2048 H2048 (diagonal and low-rank), B16 T4096 H4096: a second
# segment's ends pass reads x again (lab/results/rtu_segments_h200_c6d5449.txt). Fewer warps keep
# the rule's count: at B8 T8192 H1024 (128 programs) 9 segments took 0.97x the time of 8, 0.94x of 16
_LANES_WHOLE = _LANES_WARPS_PER_SM // 2
# and no segment shorter than this many steps (a tile of the forward; two chunks of the backward):
# at B8 T1024 H64 (8 two-warp programs) the backward in 64 segments of one chunk took 1.6x the time
# of 32 segments of two (lab/results/scans_ab_h200.txt: 86 against 54 GB/s), where the ends pass
# and the carry of every earlier segment's ends cost as much as the chunk itself
_LANES_MIN_SEGMENT = 32
# The backward's segments are longer still, 64 steps, but at least 4 where segments of 32 steps
# allow: on the H200 16 of 64 steps took 0.0384 ms against 0.0491 for 32 of 32 at B8 T1024 H64
# (lab/results/scans_ab_h200_ca178fa.txt), 8 of 64 0.035 against 0.041 for 16 at B8 T512 H128, but
# at B4 T128 H64 2 of 64 0.023 against 0.020 for 4 of 32 (full-grid runs at 6642749 and 96d2d99)
_LANES_BWD_SEGMENT = 64
_LANES_BWD_SEGMENTS = 4
# The lanes backward's chunk (its tile, and the steps between the states the forward keeps): 16, and
# 8 with resets from LANES_CHUNK_8_FROM steps x channels (B * T * H) on. On the H200 chunks of 8 took
# 0.93x the backward's time of 16 at the three A/B'd shapes of 67M-268M with resets (B8 T8192 H1024,
# B32 T2048 H2048, B16 T4096 H4096) and 1.06x-1.12x at the three of 12M and under (B4 T3000 H1000,
# B8 T1024 H64, B4 T128 H64; lab/results/scans_chunk_ab_h200_3c3d5d4.txt). The rtu grid at 1b792b6
# (chunks of 8 at every shape of 2^25 and more) against 3c3d5d4's, the backward: with resets 0.90x-
# 0.94x at all five such shapes, without resets 1.17x at B8 T8192 H1024 (0.372 -> 0.436 ms) and 0.99x
# at B32 T2048 H2048 R16 (lab/results/rtu_chunk_grid_h200_1b792b6.txt)
LANES_CHUNK = 16
LANES_CHUNK_8_FROM = 1 << 25


def split(batch: int, steps: int, channels: int, block_h: int, chunk: int, device) -> int:
    """Segments that bring batch x channel blocks up to _FILL programs an SM, at most one a chunk."""
    programs = max(1, batch * triton.cdiv(channels, block_h))  # (an empty batch: no split)
    want = triton.cdiv(_FILL * sm_count(device), programs)
    return max(1, min(want, triton.cdiv(steps, chunk)))


def lanes(batch: int, steps: int, channels: int, device, chunk: int | None = None, resets: bool = False) -> RTUConfig:
    """The lanes path's config. The forward in tiles of 32 steps of 64 channels a one-warp program
    (2 a thread: 64 values in registers, and a tile's loads, 4 KB a warp, in flight while the one
    before is scanned; an offline sm_90 compile with Triton 3.6, the GPU's, at B8 T8192 H1024 with
    resets: 255 registers a thread, none spilled in the time loop, so 8 warps an SM at most),
    keeping the state every `chunk` steps; the backward in chunks of LANES_CHUNK steps (8 with
    resets from LANES_CHUNK_8_FROM on; or `chunk`) of 32 channels (1 a thread: its chunk's states,
    kept states, SiLU', adjoint and inputs fit the registers at 16 steps, 210 registers, where 32
    steps spilled), two warps a program: on the H200 64 channels over 2 warps took 0.88x to 0.91x
    the time of 32 over one at B8 T8192 H1024, B32 T2048 H2048 and B64 T1024 H1024. Time in as
    many segments as bring each grid to _LANES_WARPS_PER_SM warps an SM (warps, not programs:
    counted as programs, the two-warp backward at B32 T2048 H2048 split in two and took 1.40x as
    long); the forward walks time whole from _LANES_WHOLE warps an SM on. No segment shorter than
    _LANES_MIN_SEGMENT steps, nor in the backward _LANES_BWD_SEGMENT (but _LANES_BWD_SEGMENTS where
    that allows). On the CPU tiles, chunks and blocks of 8, as the tiles path's, and segments down
    to one of them (the tests cross segments at few steps)."""
    if arch(device) == "cpu":
        fwd, bwd, bwd_warps, tile, chunk = 8, 8, 1, 8, chunk or 8
        most = (triton.cdiv(steps, tile), triton.cdiv(steps, chunk))
    else:
        eight = resets and batch * steps * channels >= LANES_CHUNK_8_FROM
        fwd, bwd, bwd_warps, tile, chunk = 64, 64, 2, 32, chunk or (8 if eight else LANES_CHUNK)
        whole = batch * triton.cdiv(channels, fwd) >= _LANES_WHOLE * sm_count(device)
        most = (1 if whole else triton.cdiv(steps, max(tile, _LANES_MIN_SEGMENT)),
                max(triton.cdiv(steps, _LANES_BWD_SEGMENT),
                    min(_LANES_BWD_SEGMENTS, triton.cdiv(steps, max(chunk, _LANES_MIN_SEGMENT)))))
    want = _LANES_WARPS_PER_SM * sm_count(device)
    segs = [max(1, min(triton.cdiv(want, w * max(1, batch * triton.cdiv(channels, b))), cap))
            for b, w, cap in ((fwd, 1, most[0]), (bwd, bwd_warps, most[1]))]
    return RTUConfig(chunk, fwd, 1, segs[0], bwd, bwd_warps, segs[1], "lanes", "lanes", tile)


@tunable
def pick(batch: int, steps: int, channels: int, device, resets: bool = False) -> RTUConfig:
    """The config for B sequences of T steps and H channels (`resets`: with a reset mask) on `device`'s
    architecture: the tiles path's, with the lanes path's forward and/or backward from LANES_FWD_FROM
    / LANES_BWD_FROM on. The chunk, which the two directions share, is the backward's path's (the
    lanes backward's, LANES_CHUNK or 8, under which the tiles forward was not tuned; the tiles
    backward's 32)."""
    tiled = tiles(batch, steps, channels, device)
    work = batch * steps * channels
    fwd = LANES_FWD_FROM is not None and work >= LANES_FWD_FROM
    bwd = LANES_BWD_FROM is not None and work >= LANES_BWD_FROM
    if bwd:
        ln = lanes(batch, steps, channels, device, resets=resets)
        return ln if fwd else replace(ln, block_h=tiled.block_h, warps=tiled.warps, segments=tiled.segments,
                                      path="tiles")
    if fwd:
        ln = lanes(batch, steps, channels, device, tiled.chunk)
        return replace(tiled, block_h=ln.block_h, warps=ln.warps, segments=ln.segments, path="lanes", steps=ln.steps)
    return tiled


def tiles(batch: int, steps: int, channels: int, device) -> RTUConfig:
    """The tiles path's config."""
    if arch(device) == "cpu":
        return RTUConfig(8, 8, 1, split(batch, steps, channels, 8, 8, device), 8, 1,
                         split(batch, steps, channels, 8, 8, device))
    c = RTUConfig()
    return RTUConfig(c.chunk, c.block_h, c.warps, split(batch, steps, channels, c.block_h, c.chunk, device),
                     c.bwd_block_h, c.bwd_warps, split(batch, steps, channels, c.bwd_block_h, c.chunk, device))
