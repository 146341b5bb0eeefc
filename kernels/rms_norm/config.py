"""RMSNorm's tuned launches (shared by add_rms_norm), as data: one frozen config per kernel path and
the heuristics `pick_forward` / `pick_backward` that choose one from the shape, the dtype, whether
a residual (dh) comes along, and the GPU's architecture. The choices were measured on H100/H200
('sm90'); other GPUs take the same ones without the sm_90 register caps and L2 prefetch; 'cpu' (the
Triton interpreter) avoids what it cannot run (PTX, programs that wait for each other). Percentages
below are of the GPU's measured copy bandwidth, bf16, H200."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton

from .._host.config import arch, tunable
from .._host.device import sm_count
from .._host.rows import lines_config, LinesConfig

# Widest row (next power of two) a program keeps in registers: 32 warps x 32 threads x 16 elements.
MAX_REG_BLOCK = 16384
# Rows narrower than this are packed several to a program, so that each program moves a few KB.
MIN_TILE = 2048
# Elements per thread per tile, chosen with ptxas's register counts for sm_90 (Triton 3.6) so that
# each SM holds ~30-64 KB of prefetched loads (Little's law at 3-4.8 TB/s and ~1 us of loaded
# latency needs ~20-30 KB per SM): 16 in the forward (tile, prefetch and w in registers, 48-64
# registers with the caps below: 5 programs of 8 warps per SM at 4096 wide in bf16); 8 in the
# backward, which also holds dy, its prefetch and the dw accumulator (64 registers: 2 programs of
# 16 warps at 4096 wide); 16 (2-byte types) in the backward with dh, whose 80 registers at 8 per
# thread would leave one program per SM.
FWD_PER_THREAD = 16
BWD_PER_THREAD = 8
# Register caps of the forward's register path on sm_90, (has residual, element size) ->
# {(BLOCK_N, BLOCK_B): maxnreg}: ptxas allocates a few registers more than it needs, which at these
# sizes costs a resident program per SM; each cap is the smallest that buys one more program (e.g.
# 5120 wide, 2-byte types: 80 -> 64 registers, 3 -> 4 programs of 8 warps) with at most one register
# spilled (ptxas -v, with and without the rstd store).
FWD_MAXNREG = {
    (False, 2): {(1024, 0): 48, (2048, 0): 48, (2048, 512): 64, (2048, 1024): 72, (4096, 1024): 64},
    (False, 4): {(1024, 0): 56, (2048, 0): 64, (8192, 0): 64, (2048, 512): 72},
    (True, 2): {(1024, 0): 64, (4096, 0): 64, (8192, 0): 64, (2048, 512): 80, (4096, 1024): 80},
    (True, 4): {(1024, 0): 72, (2048, 0): 80, (4096, 0): 80, (2048, 512): 96},
}
# Rows held in one block of 4096 (3584 and 4096 wide) without a residual: 4 warps (32 elements a
# thread, 96 registers, uncapped) instead of 8: 92% -> 98% of copy at 32768x4096, 81% -> 86% at 8192x4096; with
# a residual, or at 8192 wide, fewer warps did nothing or lost.
FWD_WARPS = {(False, 4096): 4}
# Rows wider than MAX_REG_BLOCK, forward. Without a residual, "lines" (two passes of chunks, 64 KB
# ones for rows over LINES_NARROW_ROW_BYTES, one program a row, w loaded at its use): 88.2% at
# 1024x65536, against 76.3-76.6% for the row in one program's registers ("packed") and 70.1%
# "split". With a residual, bf16 rows up to PACKED_MAX_BLOCK on the GPU take "packed" (kept bf16
# and widened at each use, which takes PTX: 88.4% against 86.8% for the best lines launch);
# widened to fp32 (other dtypes) the row spills, so those take "split" (segments of
# SPLIT_SEG_BYTES over 16-warp programs, the row's last program writing y: 84.1% with a residual,
# against 82.3% for two streaming passes), as do fewer rows than SMs (one program a row would leave
# SMs idle).
LINES_NARROW_ROW_BYTES = 65536
PACKED_MAX_BLOCK = 65536
SPLIT_SEG_BYTES = 32768
# Rows wider than MAX_REG_BLOCK, backward, on a GPU: "coop", a row's segments of COOP_SEG elements in
# the registers of COOP_WARPS-warp programs that wait for each other's partial sums (x and dy read
# once): 67.8% at 1024x65536 against 52.2% for the two passes of "cols" (row dots, then column
# blocks: x and dy read twice), the CPU's path and the fallback where a group of coop programs does
# not fit; 73.7% with the refinements below, 81.0% at 4096x65536. Segments of 4096 or 8192
# elements measured 53-68%. The row finished a step late is re-read from L2 (it was loaded a step
# ago, and the loads are issued before the wait) rather than held: 2-4 points faster. Capped at
# COOP_MAXNREG registers on sm_90 (128 uncapped without dh, 164 with it): 4 programs of 4 warps per
# SM, no spill; 96 or 80 (more programs, spills) measured 43-59%. One row ahead prefetched into L2
# without dh (COOP_L2_AHEAD): 73.6 -> 74.5% at 1024x65536, 78.1 -> 79.1% at 2048x65536; with dh it
# lost (77.6 -> 72.4%).
COOP_SEG = 2048
COOP_WARPS = 4
COOP_MAXNREG = 128
COOP_L2_AHEAD = 1
# The cols path: row dots in chunks of DOT_CHUNK (16 warps x 16 elements), then tiles of COLS_TILE
# (BLOCK_R x BLOCK_C, 8 warps: 64 registers, 4 programs per SM).
DOT_CHUNK = 8192
COLS_TILE = (4, 1024)
# Partial rows a load of the dw sum (_sum_partials): 512, one load for the 264 partial rows of 2
# programs per SM, instead of 128: 94.8% -> 95.2% at 32768x4096, 55.9% -> 57.4% at 3000x3584.
SUM_ROWS = 512


@dataclass(frozen=True)
class RowsConfig:
    """The forward's register path (_fwd_rows): each program owns `rows` rows of `block_n` (+
    `block_b`, a second column block) elements and strides over the tiles of the matrix on a
    `persistent` grid sized to the resident programs (else one tile per program), loading its next
    tile before it reduces the current one if `prefetch`; `maxnreg`: a register cap."""

    block_n: int
    block_b: int = 0
    rows: int = 1
    warps: int = 8
    maxnreg: int | None = None
    prefetch: bool = False
    persistent: bool = True
    path: str = field(default="rows", init=False)


@dataclass(frozen=True)
class PackedConfig:
    """The forward of a wide row in one program's registers (_fwd_packed), `block` >= N."""

    block: int
    warps: int
    path: str = field(default="packed", init=False)


@dataclass(frozen=True)
class SplitConfig:
    """The forward of a wide row in segments of `seg` elements, one `warps`-warp program each; the
    row's last program to finish writes y (_fwd_split)."""

    seg: int
    warps: int
    path: str = field(default="split", init=False)


@dataclass(frozen=True)
class BwdRowsConfig:
    """The backward's register path (_bwd_rows): tiles of `rows` rows of `block_n` elements on a
    persistent grid; `prefetch`: the next tile's loads issued before this one is reduced;
    `rstd_ahead` (with prefetch): the next tile's rstd loaded with them."""

    block_n: int
    rows: int
    warps: int
    prefetch: bool
    rstd_ahead: bool
    path: str = field(default="rows", init=False)


@dataclass(frozen=True)
class CoopConfig:
    """The backward of wide rows in segments of `seg` elements held by co-resident `warps`-warp
    programs that wait for each other (_bwd_coop); `maxnreg`: a register cap; `l2_ahead`: rows past
    the next one each step prefetches into L2 (sm_90, rows of whole 16-byte vectors)."""

    seg: int = COOP_SEG
    warps: int = COOP_WARPS
    maxnreg: int | None = None
    l2_ahead: int = 0
    path: str = field(default="coop", init=False)


@dataclass(frozen=True)
class ColsConfig:
    """The backward of wide rows in two passes: row dots in chunks of `dot_chunk` (_bwd_row_dot),
    then tiles of `block_r` x `block_c` on 8 warps (_bwd_cols)."""

    dot_chunk: int = DOT_CHUNK
    block_r: int = COLS_TILE[0]
    block_c: int = COLS_TILE[1]
    path: str = field(default="cols", init=False)


ForwardConfig = RowsConfig | LinesConfig | PackedConfig | SplitConfig
BackwardConfig = BwdRowsConfig | CoopConfig | ColsConfig


def tile(n: int, per_thread: int, split: bool = True) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_B, ROWS, num_warps) of a register path. A row is one power-of-two block, or
    (split, the forward) two when that wastes fewer lanes: 5120 = 4096 + 1024 (all lanes live)
    rather than 8192 (37.5% masked off, registers and occupancy spent on nothing); 3584 stays 4096
    (2048 + 2048 would waste as much). BLOCK_B = 0: one block."""
    block_n = triton.next_power_of_2(n)
    block_b = 0
    if split and block_n > n and triton.next_power_of_2(n - block_n // 2) < block_n // 2:
        block_n //= 2
        block_b = triton.next_power_of_2(n - block_n)
    rows = max(1, MIN_TILE // block_n)
    per_program = rows * (block_n + block_b) // (32 * per_thread)
    warps = min(32, max(4, 1 << (per_program.bit_length() - 1) if per_program else 4))
    return block_n, block_b, rows, warps


def in_registers(n: int) -> bool:
    return triton.next_power_of_2(n) <= MAX_REG_BLOCK


def _rows_forward(n: int, elem: int, residual: bool, gpu: str) -> RowsConfig:
    block_n, block_b, rows, warps = tile(n, FWD_PER_THREAD)
    warps = FWD_WARPS.get((residual, block_n + block_b), warps)
    cap = FWD_MAXNREG[(residual, elem)].get((block_n, block_b)) if gpu == "sm90" and elem in (2, 4) else None
    # Prefetch of the next tile: only rows wider than 4096 (at 4096 the 5 programs per SM hide each
    # other's latency better than a prefetched tile did; at 5120 and 8192 the prefetch won) whose
    # width is whole 16-byte vectors (otherwise every load is scalar and the prefetched tile spills
    # under the caps: 136 bytes of stack a thread with a residual at 5003 wide).
    prefetch = block_n + block_b > 4096 and n * elem % 16 == 0
    # Persistent grid, except with a residual (8192x4096: 3650 GB/s one tile per program, against
    # 3488) and at exactly 4096 wide (32768x4096: 3870 against 3540); it wins at 8192 and 16384 wide
    # (2048x16384: 3337 against 2573); the other widths tie within 5%.
    persistent = not residual and n != 4096
    return RowsConfig(block_n, block_b, rows, warps, cap, prefetch, persistent)


@tunable
def pick_forward(M: int, N: int, dtype: torch.dtype, residual: bool, device) -> ForwardConfig:
    """The forward's config for M rows of N elements of `dtype` (with a residual: add_rms_norm)."""
    gpu, elem = arch(device), dtype.itemsize
    if in_registers(N):
        return _rows_forward(N, elem, residual, gpu)
    if M >= sm_count(device):
        if not residual:
            return lines_config(M, N, elem, device, narrow_row_bytes=LINES_NARROW_ROW_BYTES)
        if gpu != "cpu" and dtype == torch.bfloat16 and triton.next_power_of_2(N) <= PACKED_MAX_BLOCK:
            block = triton.next_power_of_2(N)
            return PackedConfig(block, max(4, min(32, block // 2048)))
    seg = min(SPLIT_SEG_BYTES // elem, MAX_REG_BLOCK)
    return SplitConfig(seg, max(4, min(16, seg * elem // 2048)))


@tunable
def pick_backward(M: int, N: int, dtype: torch.dtype, has_dh: bool, device) -> BackwardConfig:
    """The backward's config for M rows of N elements of `dtype` (with dh: add_rms_norm)."""
    gpu = arch(device)
    if in_registers(N):
        per_thread = 16 if has_dh and dtype.itemsize == 2 else BWD_PER_THREAD
        block_n, _, rows, warps = tile(N, per_thread, split=False)
        # No prefetch at 16384 wide (one 32-warp program per SM, 64 registers a thread at most): the
        # prefetched tiles spill (88 bytes of stack a thread with dh) and cost more than they hide.
        prefetch = block_n < 16384
        # The next tile's rstd loaded with its x and dy: 93.6% -> 94.8% at 32768x4096, 74.6% -> 77.0%
        # at 4096x8192; with dh (16 elements a thread) it lost 1-2 points.
        return BwdRowsConfig(block_n, rows, warps, prefetch, rstd_ahead=prefetch and not has_dh)
    if gpu == "cpu":  # the interpreter runs programs one after the other: none may wait for another
        return ColsConfig()
    return CoopConfig(maxnreg=COOP_MAXNREG if gpu == "sm90" else None,
                      l2_ahead=COOP_L2_AHEAD if gpu == "sm90" and not has_dh else 0)
