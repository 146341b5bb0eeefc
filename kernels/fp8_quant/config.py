"""fp8_quant's tuned configs, one per kernel path, and the heuristic that picks the path and its
config from the shape. Measured on the H200 (bf16 in, % of copy); the same choices for every
architecture so far."""
from __future__ import annotations

from dataclasses import dataclass

import triton

from .._host.config import tunable
from .._host.launch import lines_launch

GROUP = 128  # the block edge of "1x128" and "128x128"
ROW_MAX = 16384  # widest row kept in registers by the one-pass row kernel
POLICIES = ("", "evict_first", "evict_last")


@dataclass(frozen=True)
class TilesConfig:
    """"128x128": one 128 x 128 tile a program (32 KB of bf16 in flight, one scale). 4 warps:
    86-87% at 4096x14336 and 14336x4096 (83% with 8); the load hinted evict_last: 86% -> 89%."""

    warps: int = 4
    policy: str = "evict_last"


@dataclass(frozen=True)
class GroupsConfig:
    """"1x128" and "row" up to ROW_MAX columns, one pass: [rows, groups, group width] tiles, one
    scale per (row, group); a "row" group is the whole row. The load hinted evict_last: row
    8192x4096 78% -> 81%."""

    rows: int
    groups: int
    warps: int
    policy: str = "evict_last"


@dataclass(frozen=True)
class LinesConfig:
    """"row" wider than ROW_MAX: two passes over each row (the amax, then the re-read from L2 and the
    store) in chunks of `chunk` elements as [chunk // vec, vec] lines, `programs` per SM or "rows"
    (one program a row). The defaults of _host.launch.lines_launch (wide rows: 64 KB chunks of 32 warps,
    one program a row) with 16 elements a line (two 16-byte loads, one 16-byte store of e4m3):
    1024x128256 86.7% (8 elements a line 84.9-85.8%, one program per SM 83.6-84.0%, 32 KB chunks of
    16 warps 73.5-74.8%; a persistent kernel of chunk pairs 79.3-79.5%)."""

    chunk: int
    warps: int
    vec: int = 16
    programs: int | str = "rows"


def _warps(elements: int) -> int:
    # 32-64 elements per thread: 2-4 16-byte loads in flight per thread, few enough registers for
    # several programs per SM to hide each other's reduction and stores. Compiled offline for sm_90
    # (Triton 3.6, bf16, N % 16 == 0): 1x128 8x8x128 tiles 58 registers (4 programs per SM, 64 KB
    # in flight), 16k-wide rows 89; no spills.
    return max(1, min(8, elements // 1024))


def group_width(N: int, gran: str) -> int:
    """Columns a scale covers in a GroupsConfig tile: the whole (padded) row for "row", else 128."""
    return triton.next_power_of_2(N) if gran == "row" else GROUP


@tunable
def pick(M: int, N: int, gran: str, elt: int, device=None):
    """The config of the kernel path for an [M, N] input of `elt`-byte elements."""
    if gran == "128x128":
        return TilesConfig()
    if gran == "row" and N > ROW_MAX:
        _, meta = lines_launch(M, N, elt, device, vec=LinesConfig.vec)
        return LinesConfig(chunk=meta["BLOCK"], warps=meta["num_warps"])
    # ~8192 elements (16 KB of bf16) per program. "1x128": up to 8 groups (1024 columns) per row,
    # then as many rows as fill the tile; "row": whole rows, several if narrow.
    gw = group_width(N, gran)
    g = 1 if gran == "row" else min(8, triton.next_power_of_2(triton.cdiv(N, GROUP)))
    rows = max(1, min(triton.next_power_of_2(M), 8192 // (g * gw)))
    return GroupsConfig(rows=rows, groups=g, warps=_warps(rows * g * gw))
