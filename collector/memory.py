"""Device memory and clocks around each measurement, and giving back what a case created.

On an 80 GB H100 the full grid once crept from 16 to 81 GB within one kernel's cases and rows went
out of memory for shapes that fit many times over alone. What a case can leave behind:

- the tensors of its closures (inputs, reference answers, a bwd mode's saved forward graph),
  kept alive by a traceback or a frame: the runner drops them and collects before measuring here;
- torch.compile's graphs and guards for every shape it saw (dynamo's caches, per code object, for
  the whole process): reset at the end of each case that ran compile; each case is a new shape, so
  nothing reusable is lost (the on-disk caches still serve the next run);
- a CUDA graph's private memory pool: each graph is reset once timed, or once its row was
  rechecked where it was kept for the recheck (KEEP_SHARE, below), which releases its pool. A
  capture that fails (a host sync inside the call) is the exception torch.cuda.graph leaves behind:
  its allocator routing stays on and its pool is never released, so every later capture allocated
  into it (timing._capture ends both), and the runner stops capturing a (kernel, mode, provider)
  after its first failure. Each capture keeps its own pool: captures sharing one handle broke
  PyTorch's allocator on the H100 (torch 2.11: a graph reset while its outputs lived left the pool
  at use count 0, and the next capture into it failed an internal assert, and so did every capture
  after it);
- cuBLAS workspaces (one per stream it ran on, from PyTorch's pool) and the blocks PyTorch's
  allocator caches: given back after each provider and each case, so that the next one (and the
  memory outside PyTorch: CUDA context, Triton modules) sees the device as the run found it. That
  is why a GPU keeps no graph for its recheck yet (KEEP_ON_GPU, below).

Each row records free, allocated and reserved bytes when it was timed, so a creep shows in the store.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Snapshot:
    free: int | None  # bytes free on the device (all processes), None on the CPU
    allocated: int | None  # bytes of live PyTorch tensors of this process
    reserved: int | None  # bytes PyTorch's allocator holds (live + cached + graph pools)
    retries: int = 0  # allocator retries so far: a cudaMalloc that failed, caches freed, tried again


def snapshot(device: str) -> Snapshot:
    if device != "cuda":
        return Snapshot(None, None, None)
    free, _total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    return Snapshot(int(free), int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved()),
                    int(stats.get("num_alloc_retries", 0)))


# The share of the memory a case would find free without them that the calls it keeps for their
# rows' recheck (runner.py: their copies of the inputs, a bwd mode's forward graph, their CUDA
# graphs' pools) may hold together. A kept call's recheck only replays it; beyond the share a row's
# recheck copies its inputs and builds and captures a fresh call. An eighth: each later provider of
# the case still finds 7/8 of the memory it would have found, and one that needs more was at the
# edge of running out (or of the allocator's retries, which make a row unstable) anyway. On the
# H200's memory-bound grid (run 46566b68) the case that allocated the most, cross_entropy at
# tokens 8192 x vocab 128256, summed 10.5 GB of peaks over its four rows, 10% of the 105 GB free.
KEEP_SHARE = 1 / 8
# Off: on an H200 at d12112f, with kept graphs, 4 of 90 LSTM rows (backward: ours at B64 T256 H512
# and H2048 and at T2048, eager at B16 T256 H128) died of illegal addresses in their recheck, and
# only there; the memory-bound grid's 448 rows kept theirs without a fault and its warm wall fell
# from 48.1 to 39.6 s. The likely cause: PyTorch recycles its side streams, so a capture can take a
# cuBLAS workspace made before it, outside its pool, which the per-provider release gives back
# under the kept graph. Until a GPU run confirms a fix (workspaces given back only at a case's
# end), a GPU rechecks on a fresh call, as before; the CPU keeps its calls.
KEEP_ON_GPU = False


def may_keep(held: int, more: int, free: int | None) -> bool:
    """Whether a measured call holding `more` bytes may be kept until its row's recheck, beside
    the `held` bytes of the calls its case keeps already, with `free` bytes free now (those kept
    and this one allocated; None: not known, and nothing is kept)."""
    return free is not None and held + more <= KEEP_SHARE * (free + held + more)


def free_bytes(device: str) -> int | None:
    """Bytes free for new allocations: the GPU's (every process's use counted), or the host's."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that counts its pages
        return None


def tensor_bytes(values) -> int:
    """Bytes of the tensors among `values` (a case's inputs, say)."""
    return sum(v.nbytes for v in values if torch.is_tensor(v))


def allocated(device: str) -> int | None:
    """Bytes of live PyTorch tensors on the GPU (None on the CPU): the level a release returns to."""
    return int(torch.cuda.memory_allocated()) if device == "cuda" else None


def release(device: str, compiled: bool = False, case_end: bool = False, level: int | None = None,
            collect: bool | None = None) -> None:
    """Give back what a case (or, within one, a provider) created: torch.compile's in-memory graphs
    when the case compiled, Python garbage (tensors in reference cycles), then the allocator's
    cached blocks.

    Garbage is collected only where it may hold device memory (`collect`; default: on a GPU, when
    the bytes allocated are still above `level`, the count before the case or provider began, once
    the rest is freed; always without a level; never on the CPU). A case's end then collects every
    object, frozen ones included; after a provider, only those made since the last case ended. A
    case's end always collects what the case made and freezes what survives, so that later
    collections (ours and Python's own) do not scan it again. On an H100 the full memory-bound
    grid spent 505 s of its 1045 in gc.collect (0.22 s a call, after each provider), scanning what
    the run imported as it went (the CuTe DSL, inductor's modules); with freezing, a warm H200 run
    still spent 51 s of 160 in releases, most providers leaving no garbage behind."""
    if compiled:
        from torch import _dynamo  # (`import torch._dynamo` here would make torch a local name)

        _dynamo.reset()
    if device == "cuda":
        torch.cuda.synchronize()
        # cuBLAS keeps a workspace per stream it ran on, allocated from PyTorch's pool; each
        # capture runs on a side stream, so they would add up over a run
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        if collect is None:
            collect = level is None or torch.cuda.memory_allocated() > level
    if case_end and collect:
        gc.unfreeze()
    if case_end or collect:
        gc.collect()
    if case_end:
        gc.freeze()
    if device == "cuda":
        torch.cuda.empty_cache()


def freeze_imports() -> None:
    """Exempt what exists now (torch, Triton, the kernels: modules and their objects, alive until
    the process ends) from garbage collection. A full collection then scans only what the cases
    created: with everything imported it took 0.4 s of CPU, and a run collects after every case
    (and every provider on a GPU)."""
    gc.collect()
    gc.freeze()


def clock_mhz(device: str) -> float | None:
    """The SM clock now (NVML through torch, which maps CUDA_VISIBLE_DEVICES to the physical GPU);
    None on the CPU or where nvidia-ml-py is not installed."""
    if device != "cuda":
        return None
    try:
        return float(torch.cuda.clock_rate())
    except Exception:  # no pynvml, no permission, an NVML error: the clock is evidence, not a need
        return None

