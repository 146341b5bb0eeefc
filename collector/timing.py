"""Timing: CUDA events with an L2 flush before every timed call, budgets in milliseconds.

Follows triton.testing.do_bench: estimate one call, derive the number of warm-up and timed calls
from the budgets, flush L2 by writing a buffer larger than it before each call, and record an
event pair around the call alone. Unlike do_bench it keeps every sample, so the store gets median,
p20, p80, mean, std and min. On the CPU (interpreter) a plain clock is used and the rows say so.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current L2 (H100 50 MB, H200 60 MB)


@dataclass(frozen=True)
class Budget:
    warmup_ms: float
    rep_ms: float
    min_reps: int = 10
    max_reps: int = 1000


@dataclass(frozen=True)
class Timing:
    method: str  # 'cuda-events', 'cuda-graph', 'cpu-clock'
    median_ms: float
    p20_ms: float
    p80_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    reps: int


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(method: str, samples_ms: list[float]) -> Timing:
    xs = sorted(samples_ms)
    return Timing(
        method=method,
        median_ms=quantile(xs, 0.5),
        p20_ms=quantile(xs, 0.2),
        p80_ms=quantile(xs, 0.8),
        mean_ms=statistics.fmean(xs),
        std_ms=statistics.pstdev(xs),
        min_ms=xs[0],
        reps=len(xs),
    )


def _counts(estimate_ms: float, budget: Budget) -> tuple[int, int]:
    est = max(estimate_ms, 1e-3)
    warmup = max(1, int(budget.warmup_ms / est))
    reps = min(budget.max_reps, max(budget.min_reps, int(budget.rep_ms / est)))
    return warmup, reps


def time_cuda(fn: Callable[[], object], budget: Budget, flush: torch.Tensor) -> Timing:
    torch.cuda.synchronize()
    # Estimate with a few flushed calls (the first call already ran: compile is out of the way).
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    warmup, reps = _counts(start.elapsed_time(end) / 3, budget)
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return summarize("cuda-events", [s.elapsed_time(e) for s, e in zip(starts, ends)])


class CaptureError(RuntimeError):
    """A call could not be captured into a CUDA graph (a host sync inside it, say)."""


def time_cuda_graph(fn: Callable[[], object], budget: Budget, flush: torch.Tensor) -> Timing:
    """Captures one call into a CUDA graph and times its replays, with the same L2 flush and
    budgets as time_cuda. A replay runs exactly the device work of the call without the host's
    Python, autograd and launch overhead in between, which in training is hidden because the CPU
    runs ahead of the GPU; at small and medium shapes that overhead would otherwise be most of
    what events measure, for every provider alike. Rows are labelled 'cuda-graph'."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm the allocator and autograd on a side stream, as capture requires
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as e:
        # Free what the failed capture allocated before the caller falls back to events: the
        # exception's traceback would otherwise keep this frame, the graph and its private memory
        # pool alive (on the H200 a run of failed captures of large cross-entropy cases ran the
        # 140 GB device out of memory). The caller gets the message, without the frames.
        message = f"{type(e).__name__}: {e}"
        with contextlib.suppress(Exception):
            graph.reset()
        del graph, e
        raise CaptureError(message) from None
    try:
        return dataclasses.replace(time_cuda(graph.replay, budget, flush), method="cuda-graph")
    finally:
        graph.reset()  # frees the graph's private memory pool now, not whenever it is collected


def time_cpu(fn: Callable[[], object], budget: Budget) -> Timing:
    t0 = time.perf_counter()
    fn()
    warmup, reps = _counts((time.perf_counter() - t0) * 1e3, budget)
    for _ in range(min(warmup, 3)):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return summarize("cpu-clock", samples)


def peak_memory(fn: Callable[[], object], device: str) -> int | None:
    """Bytes one call allocates beyond what was allocated before it (its working memory and
    outputs). CUDA only: the CPU allocator keeps no such statistic."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return int(peak)


def measure_ceilings(device: str) -> tuple[float, float]:
    """(copy GB/s counting read + write, bf16 matmul TFLOP/s), measured on this device now: the
    "speed of light" the site compares against is this machine's, not a datasheet's."""
    if device == "cuda":
        budget = Budget(warmup_ms=50, rep_ms=300, min_reps=10)
        flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        n = 1 << 30  # 1 Gi bf16 elements: 2 GiB each way
        src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        t = time_cuda(lambda: dst.copy_(src), budget, flush)
        copy_gbps = 2 * n * 2 / (t.median_ms * 1e6)
        del src, dst
        m = 8192
        a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
        t = time_cuda(lambda: a @ b, budget, flush)
        tflops = 2 * m**3 / (t.median_ms * 1e9)
        del a, b, flush
        torch.cuda.empty_cache()
        return copy_gbps, tflops
    budget = Budget(warmup_ms=20, rep_ms=200, min_reps=5)
    n = 1 << 25  # 64 MiB of fp16: past the CPU caches
    src = torch.randn(n, dtype=torch.float16)
    dst = torch.empty_like(src)
    t = time_cpu(lambda: dst.copy_(src), budget)
    copy_gbps = 2 * n * 2 / (t.median_ms * 1e6)
    m = 1024
    a, b = torch.randn(m, m), torch.randn(m, m)
    t = time_cpu(lambda: a @ b, budget)
    return copy_gbps, 2 * m**3 / (t.median_ms * 1e9)
