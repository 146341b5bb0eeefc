"""What the device holds: multiprocessors, architecture, L2, and how many programs of a kernel fit at once."""
from __future__ import annotations

import warnings

import triton

def sm_count(device) -> int:
    """Multiprocessors on a CUDA device; on the CPU (interpreter) a small number keeps the
    interpreted grid short."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def on_sm90(device) -> bool:
    """A Hopper (sm_90) GPU: where the register caps in the kernel files were measured."""
    import torch

    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


_RESIDENT: dict[tuple, int] = {}


def resident_programs(kernel, args: tuple, constexprs: dict, num_warps: int, device, strict: bool = False) -> int:
    """How many programs of this compiled kernel the GPU holds at once (registers, threads and shared
    memory per SM, as in Triton's fused-softmax tutorial), so that a persistent grid never spills into
    a second wave. On the CPU interpreter: a few programs, enough to exercise the striding. If the
    query fails (a Triton whose warmup API differs): a guess of 64 registers a thread, or with
    `strict` (grids whose programs wait for each other, which a guess could deadlock) 0."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return sm_count(device)
    key = (kernel.fn.__name__, tuple(sorted(constexprs.items())), num_warps, device.index,
           tuple(a.dtype for a in args if torch.is_tensor(a)), strict)
    if key not in _RESIDENT:
        props = torch.cuda.get_device_properties(device)
        by_threads = props.max_threads_per_multi_processor // (32 * num_warps)
        try:
            compiled = kernel.warmup(*args, grid=(1,), num_warps=num_warps, **constexprs)
            compiled._init_handles()
            regs_per_warp = triton.cdiv(max(compiled.n_regs, 1) * 32, 256) * 256  # allocation granularity
            by_regs = getattr(props, "regs_per_multiprocessor", 65536) // regs_per_warp // num_warps
            smem = compiled.metadata.shared
            by_smem = props.shared_memory_per_multiprocessor // (smem + 1024) if smem else 32
            per_sm = max(1, min(by_regs, by_threads, by_smem, 32))
        except Exception as e:
            warnings.warn(f"{kernel.fn.__name__}: occupancy query failed ({e!r})"
                          + ("" if strict else "; assuming 64 registers per thread"))
            per_sm = 0 if strict else max(1, min(65536 // (64 * 32 * num_warps), by_threads))
        _RESIDENT[key] = per_sm * props.multi_processor_count
    return _RESIDENT[key]


def l2_bytes(device) -> int:
    """The L2 cache's size on a CUDA device; on the CPU (interpreter) the H100/H200's 50 MB, so that
    the CPU tests take the branches the GPU takes."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    return 50 << 20


