"""Launch heuristics shared by every kernel file (one place, like Liger's ops/utils.py)."""
from __future__ import annotations

import triton

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


def elementwise_settings(n: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for flat elementwise kernels: 16 bytes per thread per load, several
    loads in flight per thread."""
    return 4096, 8


def sm_count(device) -> int:
    """Multiprocessors on a CUDA device; on the CPU (interpreter) a small number keeps the
    interpreted grid short."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
