"""Softmax's tuned configs, one frozen dataclass per kernel path, and the heuristic that picks them
(`pick_forward`, `pick_backward`). Percentages are of the measured copy bandwidth, bf16, on the H200
unless said otherwise; the H100 runs the same choices.

The paths, by row width (next_pow2(N) = block):
  rows    a tile of whole rows in registers per program (rows up to 64 KB of the input dtype);
  split   a few wide rows (M <= SPLIT_MAX_ROWS): each row cut into segments over a (row, segment)
          grid, two launches;
  coop    many wide rows on a GPU: a row's segments held in the registers of co-resident programs
          that wait for each other's partials, one launch (the backward; the forward from
          FWD_COOP_FROM elements);
  lines   the forward's other wide rows: one program a row, two passes over it in chunks;
  stream  the backward's wide rows where coop cannot run (the CPU interpreter, or no group fits).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton

from .._host.config import arch, tunable
from .._host.launch import lines_launch, LINES_NARROW_ROW_BYTES

# Widest row kept in registers, in bytes of one input row: 32768 bf16 (16384 fp32) elements, one
# program of 32 warps, 32 elements a thread. At 4096x32000 this took the forward from 44% of copy
# (split) to 70% and the backward from 58% to 89%; rows of 64K elements in registers spill.
MAX_ROW_BYTES = 65536
MAX_BLOCK = 16384  # rows up to this many elements run at most 16 warps (~16 elements a thread)
# but the forward's rows of 4097-8192 elements: 8 warps (32 elements a thread) took 0.885-0.920x the
# time of 16 at 5000 and 6000 wide (3000, 4096 and 16384 rows), 1.000x at 512x5000, 0.990-1.014x at
# 8192 wide; 4 warps 0.98-1.10x. The backward measured 8 at 0.99-1.02x: it keeps 16
# (lab/results/softmax_rows_h200_e9e4ad2.txt; 16384-element rows kept 16 warps there too)
FWD_WARPS_8K = 8
# 8 KB of each input per program (a 4096-wide bf16 row: one row, 8 warps), with evict_last loads
# (rows.py), against the earlier tiles and hints: fwd 32768x4096 92.7% -> 98.5% of copy, 65536x2048
# 85.1% -> 98.5%, 4096x32000 83.7% -> 89.7%; bwd 94% -> 101-102% (the hint: the tile did not matter).
TILE_BYTES = 8192
# A few wide rows take the split path: 1x128256 7.4 us fwd / 7.2 us bwd against 25.8 / 16.7 us
# streamed by one SM (torch.compile 13.6 / 9.7), 16x128256 2.6x / 2.0x faster than streamed; 1x32000
# (32 warps in registers) 1.19x / 1.15x faster than the register path, 1x16384 0.96x / 0.86x. So:
# up to 16 rows (the most measured) of more than MAX_BLOCK elements. Segments of 4096 (8 warps):
# 8192, 2048 and 1024 were no better overall.
SPLIT_MAX_ROWS = 16
# The second launch loads all of a row's partials in one masked vector of next_pow2(S): a bound on
# S = cdiv(N, seg) keeps that vector small.
SPLIT_MAX_SEGMENTS = 1024
# The forward takes the coop path from rows of this many elements (where the lines path's re-read
# rows, one a program, no longer fit the L2 together): 1024x262144 79.5% against lines 71.8%,
# 2048x128256 85.0% against 82.4%; at 65536 lines stays ahead (80.8% against 76.9%).
FWD_COOP_FROM = 65537
# and for rows of these widths, segments of 8192 in 8 warps (lab/results/softmax_coop_wide_h200_2620356.txt):
# 0.91-0.93x the time of 4096 in 4 warps at 196608 and 262144 wide (256 to 4096 rows); 1.415x at
# 128256, 1.6-2.0x at 393216 to 1048576 (why there is not known). Measured on the H200 only.
FWD_COOP_WIDE = (131073, 262144)
# The backward's coop segments: 4096 elements for rows of 65537-131072 (2048x128256 82.0% against
# 77.1% with 2048), 2048 otherwise (2048x65536 83.4% against 81.1% with 4096; 1024x262144 81.3%
# against 78.1%); why the middle widths prefer 4096 is not known.
BWD_COOP_MID_WIDTHS = (65537, 131072)


@dataclass(frozen=True)
class RowsConfig:
    """Tiles of `rows` whole rows of `block` (next_pow2(N)) elements per program, `warps` warps.
    persist (forward): a persistent grid of this many programs per SM, each loading its next tile
    before it reduces the current one (0: one tile a program). packed (backward): bf16 y and dy
    kept packed across the reduction (_jit.widen.widen; PTX, a GPU only)."""

    block: int
    rows: int
    warps: int
    persist: int = 0
    packed: bool = False
    path: str = field(default="rows", init=False)  # in the stored record: which path ran


@dataclass(frozen=True)
class SplitConfig:
    """Rows cut into segments of `seg` elements (a power of two), one program each, two launches."""

    seg: int = 4096
    warps: int = 8
    path: str = field(default="split", init=False)  # in the stored record: which path ran


@dataclass(frozen=True)
class CoopConfig:
    """A row's segments of `seg` elements held by co-resident programs of `warps` warps, at most
    `maxnreg` registers a thread; each step also prefetches into L2 the row `l2_ahead` steps past
    the one it loads (0: none; sm_90)."""

    seg: int
    warps: int = 4
    maxnreg: int | None = None
    l2_ahead: int = 0
    path: str = field(default="coop", init=False)  # in the stored record: which path ran


@dataclass(frozen=True)
class LinesConfig:
    """The forward's two passes over a row in chunks of `block` elements as [block // vec, vec]
    (one 16-byte vector a line), `warps` warps; `programs_per_sm` programs per SM striding over
    the rows (None: one program a row); pass 1 prefetches into L2 the chunks up to `l2_ahead` past
    the one it loads (0: none; sm_90)."""

    block: int
    vec: int
    warps: int
    programs_per_sm: float | None = None
    l2_ahead: int = 0
    path: str = field(default="lines", init=False)  # in the stored record: which path ran


@dataclass(frozen=True)
class StreamConfig:
    """The backward's two passes over a row in chunks of `chunk` elements, `warps` warps, a grid of
    `programs_per_sm` programs per SM striding over the rows (None: one program a row)."""

    chunk: int
    warps: int
    programs_per_sm: int | None = 1
    path: str = field(default="stream", init=False)  # in the stored record: which path ran


def warps_for(tile: int, max_warps: int) -> int:
    """~16 elements a thread (32 at 32 warps): enough loads in flight without spilling. 32 warps =
    1024 threads, where the hardware caps a thread at 64 registers."""
    return max(4, min(max_warps, tile // 512))


def fits_registers(N: int, elt: int) -> bool:
    return triton.next_power_of_2(N) <= MAX_ROW_BYTES // elt


def uses_split(M: int, N: int) -> bool:
    return triton.next_power_of_2(N) > MAX_BLOCK and M <= SPLIT_MAX_ROWS


def _rows(M: int, N: int, elt: int) -> tuple[int, int, int]:
    block = triton.next_power_of_2(N)
    rows = max(1, min(TILE_BYTES // (block * elt), triton.next_power_of_2(M)))
    return block, rows, warps_for(rows * block, 32 if block > MAX_BLOCK else 16)


@tunable
def pick_forward(M: int, N: int, dtype, device, coop: bool | None = None):
    """The forward's config for x [M, N] of `dtype` on `device`. `coop=False`: not the coop path
    (the launcher's fallback where no group of a row's programs fits on the GPU)."""
    elt = dtype.itemsize
    gpu = arch(device)
    if uses_split(M, N):
        return SplitConfig()
    if fits_registers(N, elt):
        block, rows, warps = _rows(M, N, elt)
        if block == 8192:
            warps = FWD_WARPS_8K
        # Rows over MAX_BLOCK take one 32-warp program a SM (64 registers a thread): a persistent
        # grid that prefetches the next row keeps the SM loading while its one program reduces
        # (4096x32000 70% -> 84%; at 4096 wide, 2 programs per SM lost: 68% -> 64%).
        return RowsConfig(block, rows, warps, persist=1 if block > MAX_BLOCK else 0)
    if gpu != "cpu" and N >= FWD_COOP_FROM and coop is not False:
        # segments of 4096 (3 programs per SM with the prefetch) against 2048: 1024x262144 79.5%
        # against 75.8% (8192 in 8 warps there: FWD_COOP_WIDE); one row ahead into L2: 2048x128256
        # 81.7% -> 85.0%, 2 rows 82.2%
        wide = FWD_COOP_WIDE[0] <= N <= FWD_COOP_WIDE[1]
        return CoopConfig(seg=8192 if wide else 4096, warps=8 if wide else 4, l2_ahead=1 if gpu == "sm90" else 0)
    _, meta = lines_launch(M, N, elt, device)
    # one chunk ahead into L2 for rows up to LINES_NARROW_ROW_BYTES (16 KB chunks of 8 warps):
    # 2048x65536 81.0% -> 85.9% (2 chunks 82.4%); the wider rows' 64 KB chunks lost with it
    # (2048x128256 82.3% -> 75.9%)
    ahead = 1 if gpu == "sm90" and N * elt <= LINES_NARROW_ROW_BYTES else 0
    return LinesConfig(meta["BLOCK"], meta["VEC"], meta["num_warps"], l2_ahead=ahead)


@tunable
def pick_backward(M: int, N: int, dtype, device, coop: bool | None = None):
    """The backward's config for y, dy [M, N] of `dtype` on `device` (`coop` as pick_forward's)."""
    elt = dtype.itemsize
    gpu = arch(device)
    if uses_split(M, N):
        return SplitConfig()
    if fits_registers(N, elt):
        # bf16 kept packed: at 4096x32000 (32 warps, 64 registers a thread) the plain kernel spills
        # 8 registers a thread, packed none: 92.6% -> 99.9% of copy; other shapes within 0.2%
        return RowsConfig(*_rows(M, N, elt), packed=gpu != "cpu" and dtype == torch.bfloat16)
    if gpu != "cpu" and coop is not False:
        return _bwd_coop(N, gpu)
    # streamed: 32 KB chunks of 32 warps, one program per SM (better than 16 KB chunks and more
    # programs per SM at every wide shape measured)
    chunk = 32768 // elt
    return StreamConfig(chunk, warps_for(chunk, 32))


def _bwd_coop(N: int, gpu: str) -> CoopConfig:
    lo, hi = BWD_COOP_MID_WIDTHS
    if lo <= N <= hi:
        # segments of 4096 at 8 warps (16 elements a thread, as 2048 at 4; 2 programs per SM with
        # twice the loads in flight): 2048x128256 81.0% -> 85.0%, 2048x131072 83.0% -> 86.9%
        seg, warps = 4096, 8
    else:
        seg, warps = 2048, 4
    # segments of 2048 at 4 warps take 119 registers uncapped (4 programs per SM); capped at 96, 5
    # fit (8 bytes of stack): 2048x65536 82.4% -> 86.5%, 1024x262144 80.3% -> 83.9%; at 80 (6
    # programs, more spill) 53-57%. Measured on sm_90 only.
    maxnreg = 96 if gpu == "sm90" and (seg, warps) == (2048, 4) else None
    # one row ahead into L2: 2048x128256 85.0% -> 90.8%, 1024x262144 83.8% -> 88.4% (2 rows: less)
    return CoopConfig(seg, warps, maxnreg, l2_ahead=1 if gpu == "sm90" else 0)
