"""Cross-entropy's tuned configs, one frozen dataclass per kernel path, and the heuristic that picks
them (`pick`). Percentages are of the measured copy bandwidth, bf16, fwd+bwd, on the H200 unless
said otherwise; the H100 runs the same choices.

  rows   one program a row at a time, two passes over it in chunks (the second, for the gradient,
         from L2): every shape but
  split  a few wide rows (decode, RL sampling: at most SPLIT_MAX_ROWS rows of SPLIT_MIN_ROW_BYTES
         or more), each cut into segments over a (row, segment) grid, so that more than one SM
         reads a row.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import triton

from .._host.config import arch

# Split path: 1x128256 7.8 / 10.5 us (fwd / fwd+bwd) against 19.5 / 21.1 on the rows path
# (torch.compile 13.2 / 18.1); 16x128256 1.9x / 1.6x faster, 64x128256 1.2x / 1.2x (the most rows
# measured); 1x32000 (64000 bytes, the narrowest row measured) 1.3x. Segments: 4096 elements won at
# 1 and 4 rows, 8192 at 16 and 64 rows.
SPLIT_MAX_ROWS = 64
SPLIT_MIN_ROW_BYTES = 64000
# A persistent grid of 1-2 programs per SM (whose programs count the valid targets themselves) for
# a gradient on logits under this size or when the count is given; one program a row otherwise.
ROWS_GRID_MIN_BYTES = 256 << 20


@dataclass(frozen=True)
class RowsConfig:
    """Chunks of `block` elements (a power of two), `warps` warps; `programs_per_sm` programs per
    SM striding over the rows (None: one program a row); with a gradient, pass 1 prefetches into
    L2 the chunks up to `l2_ahead` past the one it loads (0: none; sm_90)."""

    block: int
    warps: int
    programs_per_sm: int | None = None
    l2_ahead: int = 0
    path: str = field(default="rows", init=False)  # in the stored record: which path ran


@dataclass(frozen=True)
class SplitConfig:
    """Rows cut into segments of `seg` elements (a power of two >= 16), one program of `warps` warps
    each, two launches."""

    seg: int
    warps: int
    path: str = field(default="split", init=False)


def uses_split(n_rows: int, V: int, elt: int) -> bool:
    """The automatic rule: a few wide rows (never 0 rows: an empty grid)."""
    return 0 < n_rows <= SPLIT_MAX_ROWS and V * elt >= SPLIT_MIN_ROW_BYTES


def pick(n_rows: int, V: int, dtype, device, has_grad: bool, counted: bool = False):
    """The config for logits [n_rows, V] of `dtype` on `device`; `counted`: the number of valid
    targets is given (fused_linear_cross_entropy's chunks) rather than counted by the kernel."""
    elt = dtype.itemsize
    if uses_split(n_rows, V, elt):
        # 4096 elements a segment up to 4 rows (S = 32 at vocab 128256), 8192 for more
        seg = min(4096 if n_rows <= 4 else 8192, triton.next_power_of_2(V))
        return SplitConfig(seg, max(1, min(16, seg * elt // 2048)))  # 64 B per thread, as below
    return _rows(n_rows, V, elt, arch(device), has_grad, counted)


def _rows(n_rows: int, V: int, elt: int, gpu: str, has_grad: bool, counted: bool) -> RowsConfig:
    """Each thread holds 64 bytes of a chunk (four 16-byte loads, twice that with the next chunk
    prefetched): 16 KB chunks of 8 warps (no gradient: 64-80 registers, 3-4 programs per SM; with
    a gradient on rows up to 128 KB: 128 registers, 2 per SM), 32 KB of 16 warps for wider rows
    with a gradient (1 per SM). No spills (sm_90, Triton 3.6)."""
    if not has_grad:
        return RowsConfig(*_block_warps(16384, V, elt))
    small = V * elt <= 131072
    block, warps = _block_warps(16384 if small else 32768, V, elt)
    # two chunks ahead into L2: 8192x128256 82.2% -> 88.9% (1 chunk 84.6%), 4096x256000 72.2% ->
    # 79.3%, 8192x32000 74.0% -> 77.7%. The loss alone (one pass) lost with it: 108.5% -> 102.5%.
    ahead = 2 if gpu == "sm90" else 0
    if not counted and n_rows * V * elt >= ROWS_GRID_MIN_BYTES:
        # one program a row (the valid targets counted once beforehand) against 1 per SM:
        # 8192x128256 78.5% -> 83.2%, 4096x256000 68.6% -> 72.7%, 3000x151936 74.0% -> 77.7%; but
        # 1024x32000 (65 MB) 53.6 -> 59.8 us, the counting launch
        return RowsConfig(block, warps, None, ahead)
    # the rows in flight (programs x row bytes: 33 MB at 132 SMs x 128256 bf16) within L2.
    # (fused_linear_cross_entropy's 8192x4096x128256 measured the same with either grid.)
    return RowsConfig(block, warps, 2 if small else 1, ahead)


def _block_warps(chunk: int, V: int, elt: int) -> tuple[int, int]:
    block = min(chunk // elt, triton.next_power_of_2(V))
    return block, max(1, min(chunk // 2048, block * elt // 2048))  # 64 B per thread = 2048 B per warp
