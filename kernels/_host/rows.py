"""What the row kernels' launchers share (softmax, rms_norm, add_rms_norm, layer_norm): the N_ALIGN of
a row (the device side is kernels/_jit/rows.py), persistent grids, and the config of a "lines" kernel
(launch.lines_launch)."""
from __future__ import annotations

from dataclasses import dataclass, field

import triton

from .launch import LINES_NARROW_ROW_BYTES, LINES_PROGRAMS_PER_SM, LINES_PROGRAMS_PER_SM_WIDE, lines_launch


def align(n: int) -> int:
    """The largest power of two (up to 16) dividing n: the N_ALIGN constexpr of row_start/col_mask."""
    return min(16, n & -n)


def persistent_grid(tiles: int, resident: int) -> tuple[int, int]:
    """(programs, tiles per program) for `tiles` units of work striped over at most `resident`
    programs. Fewest programs for the same number of sweeps, so that the last sweep is as full as
    it can be (528 slots, 8192 tiles: 512 programs x 16 tiles, rather than 528 programs of which
    272 do a 16th tile while the other 256 idle)."""
    per = triton.cdiv(tiles, resident)
    return triton.cdiv(tiles, per), per


@dataclass(frozen=True)
class LinesConfig:
    """A "lines" kernel (two passes over each row in chunks of [block // vec, vec]): `block` elements a
    chunk, `vec` elements a line, `warps`, and `programs_per_sm` (None: one program a row)."""

    block: int
    vec: int
    warps: int
    programs_per_sm: float | None = None
    path: str = field(default="lines", init=False)


def lines_config(M: int, N: int, elem: int, device, narrow_row_bytes: int = LINES_NARROW_ROW_BYTES,
                 wide_programs=LINES_PROGRAMS_PER_SM_WIDE) -> LinesConfig:
    """lines_launch's choice for M rows of N elements of `elem` bytes, as a config."""
    _, meta = lines_launch(M, N, elem, device, narrow_row_bytes=narrow_row_bytes, wide_programs=wide_programs)
    pps = wide_programs if N * elem > narrow_row_bytes else LINES_PROGRAMS_PER_SM
    return LinesConfig(meta["BLOCK"], meta["VEC"], meta["num_warps"], None if pps == "rows" else pps)


def lines_grid(config: LinesConfig, M: int, N: int, elem: int, device) -> tuple[int, dict]:
    """(grid, launch keywords N_FULL, TAIL, BLOCK, VEC, num_warps) of a lines kernel with `config`."""
    return lines_launch(M, N, elem, device, chunk=config.block, programs_per_sm=config.programs_per_sm or "rows",
                        num_warps=config.warps, vec=config.vec)
