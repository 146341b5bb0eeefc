"""LayerNorm's tuned launches, as data: one frozen config per kernel path and the heuristics
`pick_forward` / `pick_backward` that choose one from the shape, the dtype and the GPU's
architecture. Measured on H100/H200 ('sm90'); other GPUs take the same choices without the L2
prefetch (sm_90 PTX); 'cpu' (the Triton interpreter) avoids programs that wait for each other.
Percentages below are of the GPU's measured copy bandwidth, bf16, H200."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton

from .._host.config import arch, tunable
from .._host.device import l2_bytes
from .._host.rows import lines_config, LinesConfig

# Forward, rows up to FWD_MAX_BLOCK (next power of two) in registers: tiles of FWD_TILE_BYTES of x a
# program, FWD_PER_THREAD elements a thread (half the warps of 16: 32768x4096 82% -> 91% of copy,
# 8192x8192 64% -> 82%). From FWD_PERSIST_FROM wide, a persistent grid with the next tile prefetched
# (8192 wide: 82% -> 86%); narrower, one tile per program, w and b loaded with x rather than after
# the reductions (1x4096: 6.0 -> 5.2 us, one memory round trip fewer; 3000x3584 3-4% faster; the
# rest within 1%), x hinted evict_last (32768x4096: 90% -> 97%, as for rms_norm and softmax) except
# for an x between FWD_NO_HINT_FROM and the L2's size (4096x4096: 4-6% faster without a hint,
# 3000x3584 8.5%; no hint was 3.5% slower at 32768x4096 and 6% at 1x4096).
FWD_TILE_BYTES = 16384
FWD_MAX_BLOCK = 8192
FWD_PER_THREAD = 32
FWD_PERSIST_FROM = 8192
FWD_NO_HINT_FROM = 8 << 20
# Wider rows: the lines kernel (two passes of chunks, w and b loaded at their use), the wide rows'
# chunks (64 KB of 32 warps) from rows over FWD_LINES_NARROW_ROW_BYTES, two programs per SM there:
# 2048x65536 71.5% (a streaming kernel with Chan merges) -> 89.6% (one per SM 87.3%, one a row
# 85.4%); 4096x16384 83.5% (the register path) -> 85.6%.
FWD_LINES_NARROW_ROW_BYTES = 65536
FWD_LINES_WIDE_PROGRAMS = 2
# Backward, rows up to BWD_MAX_BLOCK (whose dw/db accumulators fit in registers with x and dy) on a
# persistent grid with the next tile's x, dy, mean and rstd prefetched, c1 and c2 in one reduction
# on a GPU (one exchange between warps instead of two, 3 barriers fewer: 32768x4096 84.5% -> 86.2%;
# the interpreter runs such a reduction element by element in Python: a 23x300 backward took 1.7 s
# instead of 0.22 s), BWD_TILE elements a tile (x and dy each, ~5 fp32 registers an element).
# Loads hinted evict_last for rows of up to 4096, evict_first wider (the stats ahead with evict_last
# / evict_first: 32768x4096 90.9 / 82.2%, 8192x8192 77.9 / 79.6%). One tile past the
# next prefetched into L2 on sm_90 (BWD_ROWS_L2_AHEAD): 32768x4096 91.6 -> 94.3%, 8192x8192 80.0 ->
# 85.7%, 4096x4096 the same.
BWD_MAX_BLOCK = 8192
BWD_TILE = 4096
BWD_ROWS_L2_AHEAD = 1
# Wider rows on the GPU: "coop", segments of COOP_SEG elements held by COOP_WARPS-warp programs that
# wait for each other's partial sums (rms_norm's scheme): 2048x65536 46.0% (two passes, "cols") ->
# 66.7%, 4096x16384 51.9% -> 67.9%; segments of 1024 or 4096, or 8 warps, 54-56%; register caps
# (spills), w at its uses and the finished row re-read from L2 all lost here. One row ahead
# prefetched into L2 for rows of COOP_L2_FROM elements and more: 2048x65536 65.6 -> 71.8%; but
# 4096x16384 67.4 -> 53.5%, so none below (widths between were not measured).
COOP_SEG = 2048
COOP_WARPS = 4
COOP_L2_AHEAD = 1
COOP_L2_FROM = 65536
# The CPU's path, and the GPU's where a coop group does not fit: "cols", row sums in chunks, then a
# grid of [row group, column block] programs that read x and dy a second time, as PyTorch does (16
# warps, evict_last: 16384 wide 48% -> 52%).
COLS_BLOCK = 4096
COLS_WARPS = 16
# The dw/db partial sums (_ln_sum_partials): SUM_BLOCK_C columns a program, many small blocks so that
# all SMs help (1024x2048 16.8 -> 13.2 us with 32 instead of 128), SUM_BLOCK_G partial rows a load
# (4096x4096 62.8% -> 64.0% with 128 instead of 32).
SUM_BLOCK_G, SUM_BLOCK_C = 128, 32


@dataclass(frozen=True)
class TileConfig:
    """The forward's one-tile-per-program path (_ln_fwd): `rows` rows of `block_n` elements a
    program, `warps`, the x loads' cache `policy` ('' for none); w and b loaded with x."""

    rows: int
    block_n: int
    warps: int
    policy: str = "evict_last"
    path: str = field(default="tile", init=False)


@dataclass(frozen=True)
class RowsConfig:
    """The forward's persistent path (_ln_fwd_rows): tiles of `rows` rows of `block_n` elements on a
    grid sized to the resident programs, the next tile's x loaded before this one is reduced."""

    rows: int
    block_n: int
    warps: int
    path: str = field(default="rows", init=False)


@dataclass(frozen=True)
class BwdRowsConfig:
    """The backward's register path (_ln_bwd_rows): tiles of `rows` rows of `block_n` elements on a
    persistent grid, the next tile's x, dy, mean and rstd prefetched; `policy`: the x and dy loads'
    cache hint; `l2_ahead`: tiles past the next one prefetched into L2 (sm_90, aligned rows);
    `fused_sums`: c1 and c2 in one reduction over the pair, else two."""

    rows: int
    block_n: int
    warps: int
    policy: str
    l2_ahead: int = 0
    fused_sums: bool = True
    path: str = field(default="rows", init=False)


@dataclass(frozen=True)
class CoopConfig:
    """The backward of wide rows in segments of `seg` elements held by co-resident `warps`-warp
    programs that wait for each other (_ln_bwd_coop); `l2_ahead`: rows past the next one each step
    prefetches into L2 (sm_90, aligned rows)."""

    seg: int = COOP_SEG
    warps: int = COOP_WARPS
    l2_ahead: int = 0
    path: str = field(default="coop", init=False)


@dataclass(frozen=True)
class ColsConfig:
    """The backward of wide rows in two passes: row sums in chunks of `sums_chunk`
    (_ln_bwd_row_sums), then programs of `warps` warps over [row group, column block of `block_c`]
    walking `rows` rows at a time, about `groups_per_sm` row groups per SM and column block (_ln_bwd)."""

    block_c: int = COLS_BLOCK
    rows: int = 1
    warps: int = COLS_WARPS
    groups_per_sm: int = 2
    sums_chunk: int = COLS_BLOCK
    path: str = field(default="cols", init=False)


ForwardConfig = TileConfig | RowsConfig | LinesConfig
BackwardConfig = BwdRowsConfig | CoopConfig | ColsConfig


@tunable
def pick_forward(M: int, N: int, dtype: torch.dtype, device) -> ForwardConfig:
    """The forward's config for M rows of N elements of `dtype`."""
    elem, block = dtype.itemsize, triton.next_power_of_2(N)
    if block > FWD_MAX_BLOCK:
        return lines_config(M, N, elem, device, narrow_row_bytes=FWD_LINES_NARROW_ROW_BYTES,
                            wide_programs=FWD_LINES_WIDE_PROGRAMS)
    rows = max(1, min(FWD_TILE_BYTES // (block * elem), triton.next_power_of_2(M)))
    warps = max(4, min(32, rows * block // (32 * FWD_PER_THREAD)))
    if block >= FWD_PERSIST_FROM:
        return RowsConfig(rows, block, warps)
    policy = "" if FWD_NO_HINT_FROM <= M * N * elem <= l2_bytes(device) else "evict_last"
    return TileConfig(rows, block, warps, policy)


@tunable
def pick_backward(M: int, N: int, dtype: torch.dtype, device) -> BackwardConfig:
    """The backward's config for M rows of N elements of `dtype`."""
    gpu, block = arch(device), triton.next_power_of_2(N)
    if block <= BWD_MAX_BLOCK:
        rows = max(1, min(BWD_TILE // block, triton.next_power_of_2(M)))
        warps = max(4, min(16, rows * block // 512))  # ~16 elements a thread
        return BwdRowsConfig(rows, block, warps, "evict_last" if block <= 4096 else "evict_first",
                             BWD_ROWS_L2_AHEAD if gpu == "sm90" else 0, fused_sums=gpu != "cpu")
    if gpu == "cpu":  # the interpreter runs programs one after the other: none may wait for another
        return ColsConfig()
    return CoopConfig(l2_ahead=COOP_L2_AHEAD if gpu == "sm90" and N >= COOP_L2_FROM else 0)
