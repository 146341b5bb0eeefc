"""Launch shapes shared by the ops: rows held in registers, flat elementwise grids, "lines" kernels."""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from .config import tunable
from .device import sm_count

# Largest row a single program keeps in registers; wider rows are processed in chunks.
MAX_FUSED_SIZE = 65536


def row_settings(n: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for a program that holds one row of n elements in registers:
    the block is the next power of two; warps grow with it so that each thread holds at most
    about 16-32 elements (more spills registers, fewer leaves memory parallelism on the table)."""
    block = triton.next_power_of_2(n)
    if block > MAX_FUSED_SIZE:
        raise ValueError(f"row of {n} elements is wider than {MAX_FUSED_SIZE}")
    if block >= 32768:
        warps = 32
    elif block >= 8192:
        warps = 16
    elif block >= 2048:
        warps = 8
    else:
        warps = 4
    return block, warps


@dataclass(frozen=True)
class ElementwiseConfig:
    """Flat elementwise kernels: `block` elements a program, `warps` warps (8 elements a thread at
    the default: one 16-byte load per tensor in bf16). Measured on the H200 against 4096 elements
    of 8 warps: the one-row decode shapes 1.03-1.25x faster, gelu fwd 8192x16384 1.05x, the largest
    swiglu/geglu shapes the same."""

    block: int = 1024
    warps: int = 4


@tunable
def elementwise_config(n: int, device=None) -> ElementwiseConfig:
    """The config for n elements: one for every size and GPU measured so far."""
    return ElementwiseConfig()


def launch_elementwise(kernel, n: int, *args, config: ElementwiseConfig | None = None, **meta) -> None:
    """kernel[grid](*args, n, BLOCK=, TAIL=, **meta) over n flat elements. The kernels mask their
    block with n rounded down to a multiple of 16 and, when TAIL (n % 16 != 0), let the last
    program finish the remaining elements with a 16-wide masked block: a mask `offs < n` with an n
    the compiler cannot see is a multiple of 16 makes every load and store scalar (sm_90 compile of
    a gelu forward at 4096 elements: 16 2-byte loads a thread instead of 2 16-byte ones, 87
    registers instead of 32)."""
    config = config or elementwise_config(n)
    kernel[(triton.cdiv(n, config.block),)](*args, n, BLOCK=config.block, TAIL=n % 16 != 0,
                                            num_warps=config.warps, **meta)


# ---------------------------------------------------------------------------------------------
# Launch of a "lines" kernel (softmax's forward, rms_norm's and layer_norm's wide forwards, fp8_quant's
# wide rows): two passes over each row in chunks of [BLOCK // VEC, VEC], 64 bytes a thread per chunk.
# H200 A/B, bf16 softmax fwd, % of copy: rows up to LINES_NARROW_ROW_BYTES in 16 KB chunks of 8
# warps, one program a row (2048x65536: 81.4%; 2 per SM persistent 79.5%, 64 KB chunks 75.6%); wider rows in 64 KB chunks of
# 32 warps (2048x128256: 78.1-78.8%, 32 KB of 16 warps 75.3-75.6%), also one program a row (82.7%
# against 78.8% persistent one per SM, 80.3% two per SM; 1024x262144: 71.9% against 69.4%, 69.7%),
# as for rms_norm's and fp8_quant's wide rows.
# Kernels that also read a weight in pass 2 (rms_norm, layer_norm) measured best with the wide rows'
# chunks from 128 KB rows on, and layer_norm with another grid for them: they pass narrow_row_bytes
# and wide_programs (their comments have the numbers).
LINES_NARROW_ROW_BYTES = 131072
LINES_CHUNK_BYTES, LINES_PROGRAMS_PER_SM = 16384, "rows"
LINES_CHUNK_BYTES_WIDE, LINES_PROGRAMS_PER_SM_WIDE = 65536, "rows"


def lines_launch(M: int, N: int, elt: int, device, chunk: int | None = None, programs_per_sm=None,
                 num_warps: int | None = None, narrow_row_bytes: int = LINES_NARROW_ROW_BYTES,
                 wide_programs=LINES_PROGRAMS_PER_SM_WIDE, vec: int | None = None) -> tuple[int, dict]:
    """(grid, launch keywords N_FULL, TAIL, BLOCK, VEC, num_warps) of a lines kernel over M rows of N
    elements of `elt` bytes: chunks of `chunk` elements (a power of two; default above: the narrow
    rows' up to `narrow_row_bytes` a row, the wide rows' past it), `programs_per_sm` programs per SM
    (a fraction leaves SMs idle) or "rows" (one program a row; default: the narrow rows' above,
    `wide_programs` for wide rows), `vec` elements a line (default one 16-byte vector)."""
    wide = N * elt > narrow_row_bytes
    vec = vec or 16 // elt
    block = max(vec, min(chunk or (LINES_CHUNK_BYTES_WIDE if wide else LINES_CHUNK_BYTES) // elt,
                         triton.next_power_of_2(N)))
    pps = programs_per_sm or (wide_programs if wide else LINES_PROGRAMS_PER_SM)
    grid = M if pps == "rows" else max(1, min(M, int(pps * sm_count(device))))
    warps = num_warps or max(1, min(32, block * elt // 2048))
    return grid, dict(N_FULL=N // block, TAIL=N % block != 0, BLOCK=block, VEC=vec, num_warps=warps)
