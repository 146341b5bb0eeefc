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
    """(BLOCK_SIZE, num_warps) for flat elementwise kernels. Up to _ELEMENTWISE_BIG elements: 8
    elements per thread (one 16-byte load per tensor in bf16), 1024 per program; larger: 4096
    elements per program, 8 warps. Measured on the H200 (benchmarks/elementwise_ab.py,
    docs/evidence/elementwise_ab_h200_run1.txt, and the collector's runs): against 4096 / 8 warps,
    1024 / 4 warps made the one-row decode shapes 1.03-1.25x faster and gelu fwd 8192x16384 1.05x,
    and every other shape up to 117M elements as fast; but the two-output backwards of swiglu and
    geglu at 235M-268M elements ran 10% slower with it (run 9e1dbe21: swiglu bwd 16384x14336
    610 us against 549 us in run e3d70f92; geglu bwd 16384x16384 698 against 630). Why, we have
    not found out; above 2^27 elements the earlier blocks stay."""
    return (4096, 8) if n > _ELEMENTWISE_BIG else (1024, 4)


_ELEMENTWISE_BIG = 1 << 27


def launch_elementwise(kernel, n: int, *args, block: int | None = None, num_warps: int | None = None,
                       **meta) -> None:
    """kernel[grid](*args, n, BLOCK=, TAIL=, **meta) over n flat elements. The kernels mask their
    block with n rounded down to a multiple of 16 and, when TAIL (n % 16 != 0), let the last
    program finish the remaining elements with a 16-wide masked block: a mask `offs < n` with an n
    the compiler cannot see is a multiple of 16 makes every load and store scalar (sm_90 compile of
    _gelu_fwd at 4096 elements: 16 LDG.E.U16 per thread instead of 2 LDG.E.128, 87 registers
    instead of 32). `block` and `num_warps` override elementwise_settings (GPU A/Bs)."""
    default_block, default_warps = elementwise_settings(n)
    block = block or default_block
    kernel[(triton.cdiv(n, block),)](*args, n, BLOCK=block, TAIL=n % 16 != 0,
                                     num_warps=num_warps or default_warps, **meta)


def sm_count(device) -> int:
    """Multiprocessors on a CUDA device; on the CPU (interpreter) a small number keeps the
    interpreted grid short."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
