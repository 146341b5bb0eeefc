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


# ---------------------------------------------------------------------------------------------
# Whether a picked config fits the device it runs on. A config's shared memory (pipelined tiles,
# layout conversions, scan scratch) is known exactly only once compiled, so the check compiles:
# Kernel.warmup builds the very variant the launch then takes from the JIT's cache. Answers are
# cached per kernel, launch keywords, argument dtypes and the JIT's specialisation of the
# arguments (16-byte alignment, ints divisible by 16 or equal to 1), which decide the compiled code.

_SHARED: dict[tuple, int] = {}


def shared_limit(device) -> int:
    """Bytes of shared memory one program may use on a CUDA device (the opt-in limit a launch
    checks); on the CPU interpreter an H100's, so that the CPU takes the branches the GPU takes."""
    import torch

    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return getattr(props, "shared_memory_per_block_optin", 232448)
    return 232448


def _spec_key(a):
    import torch

    if torch.is_tensor(a):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return (a % 16 == 0, a == 1)
    return type(a).__name__


def shared_bytes(kernel, args: tuple, meta: dict, device) -> int | None:
    """Shared memory of `kernel` compiled for `args` and launch keywords `meta` (constexprs,
    num_warps, num_stages); None on the CPU interpreter, which has none."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    key = (kernel.fn.__name__, id(kernel), tuple(sorted(meta.items())), tuple(_spec_key(a) for a in args),
           device.index)
    if key not in _SHARED:
        _SHARED[key] = kernel.warmup(*args, grid=(1,), **meta).metadata.shared
    return _SHARED[key]


def first_fit(kernel, args: tuple, device, candidates: list[dict]) -> dict:
    """The first of `candidates` (launch keywords of `kernel` over `args`, best first) whose
    compiled kernel fits the device's shared memory: what a launcher calls with its picked config
    and the smaller ones to fall back to. ValueError, naming the limit, where none fits (a config
    the caller forced that the device cannot run). On the CPU interpreter: the first."""
    limit = shared_limit(device)
    needs = []
    for meta in candidates:
        n = shared_bytes(kernel, args, meta, device)
        if n is None or n <= limit:
            return meta
        needs.append(n)
    raise ValueError(f"{kernel.fn.__name__}: the config needs {min(needs)} bytes of shared memory, more than the "
                     f"{limit} bytes a program may use on this device; pick a smaller config (or config=None)")


def widen_asm(t) -> bool:
    """Whether kernels/_jit/widen.py's `widen` may use its PTX for tensor t: bf16 on a CUDA device."""
    import torch

    return t.dtype == torch.bfloat16 and t.device.type == "cuda"
