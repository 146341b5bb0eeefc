"""Timing: CUDA events with an L2 flush before every timed call, budgets in milliseconds.

Follows triton.testing.do_bench: estimate one call, derive the number of warm-up and timed calls
from the budgets, flush L2 by writing a buffer larger than it before each call, and record an
event pair around the call alone. Unlike do_bench, the estimating calls count towards the warm-up
budget, a measurement that knows the call's time (a recheck) makes none, and every sample is
kept, so the store gets median, p20, p80, mean, std and min. On the CPU (interpreter) a plain
clock is used and the rows say so.

Samples are taken in chunks; after each chunk (and at least `min_reps` samples) timing stops once
the 95% confidence interval of the median is within ±`ci_rel` of it: a steady fast kernel needs a
few dozen replays, not the whole budget, while a noisy one still gets the budget. The peak memory
of one call is read from the eager calls timing makes anyway (the estimate, or the warm-up before a
capture), not from an extra call.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

# The CPU timing's clock (seconds). A test injects a virtual one (tests/test_find.py: a planted
# delay then takes exactly its time on any machine, however loaded).
clock = time.perf_counter

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current L2 (H100 50 MB, H200 60 MB)


@dataclass(frozen=True)
class Budget:
    warmup_ms: float
    rep_ms: float
    min_reps: int = 10
    max_reps: int = 1000
    ci_rel: float = 0.0  # stop once the median's 95% interval is within ±ci_rel of it; 0: whole budget


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
    peak_bytes: int | None = None  # what one call allocates beyond what existed before it (CUDA)
    clock_mhz: float | None = None  # SM clock read while the timed calls ran
    p99_ms: float | None = None  # the tail a frame budget is judged on (each sample is one call)
    max_ms: float | None = None


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
        p99_ms=quantile(xs, 0.99),
        max_ms=xs[-1],
    )


def median_ci_rel(samples_ms: list[float]) -> float:
    """Half-width of the distribution-free 95% interval of the median (order statistics
    n/2 ± 0.98·√n), relative to the median; inf with too few samples to bound it."""
    xs = sorted(samples_ms)
    n = len(xs)
    lo, hi = math.floor(n / 2 - 0.98 * math.sqrt(n)), math.ceil(n / 2 + 0.98 * math.sqrt(n))
    if n < 5 or lo < 0 or hi > n - 1:
        return math.inf
    med = quantile(xs, 0.5)
    return (xs[hi] - xs[lo]) / 2 / med if med > 0 else math.inf


# The floor of min_reps timed calls gives way, down to SLOW_REPS, where it would take longer than
# SLOW_MS: the step-by-step PyTorch references (Cortex's RTU, the eager selective scan: up to
# 1.4-1.7 s a call on the H200) took 53 of the 56 s of timed calls of the rtu grid and 36 of the
# 43 s of the scans' grid, on rows 10-1000x slower than the providers they stand beside, which a
# few calls pin down well enough.
SLOW_MS, SLOW_REPS = 1000.0, 3


def _counts(estimate_ms: float, budget: Budget, warmed_ms: float = 0.0) -> tuple[int, int]:
    """(warm-up calls, timed calls). `warmed_ms`: what the estimating calls just took on the device:
    they count towards the warm-up budget (a call slower than it needs no warm-up call beside its
    estimate), and without them one warm-up call at least."""
    est = max(estimate_ms, 1e-3)
    warmup = max(0 if warmed_ms > 0 else 1, int(max(0.0, budget.warmup_ms - warmed_ms) / est))
    floor = min(budget.min_reps, max(SLOW_REPS, int(SLOW_MS / est)))
    reps = min(budget.max_reps, max(floor, int(budget.rep_ms / est)))
    return warmup, reps


def _sample(chunk: Callable[[int], list[float]], reps: int, budget: Budget) -> list[float]:
    """Up to `reps` samples in growing chunks, stopping early once the median is pinned down."""
    samples: list[float] = []
    size = budget.min_reps
    while len(samples) < reps:
        samples += chunk(min(size, reps - len(samples)))
        if budget.ci_rel > 0 and median_ci_rel(samples) <= budget.ci_rel:
            break
        size = max(size, len(samples) // 2)
    return samples


@contextlib.contextmanager
def _peak(out: list):
    """Appends the bytes allocated at the peak of the block beyond what existed before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    yield
    torch.cuda.synchronize()
    out.append(int(torch.cuda.max_memory_allocated() - before))


def time_cuda(fn: Callable[[], object], budget: Budget, flush: torch.Tensor,
              clock: Callable[[], float | None] = lambda: None, peak: bool = True,
              estimate_ms: float | None = None) -> Timing:
    """`clock` is read while the first chunk runs (the GPU busy, not idling between calls).
    `estimate_ms`: a call's duration measured just before (a recheck's: the first measurement's
    median), which spares the estimating calls; the peak memory is then read on the first warm-up."""
    torch.cuda.synchronize()
    peaks: list[int] = []
    warmed_ms = 0.0
    if estimate_ms is None:
        estimate_ms, warmed_ms = _estimate(fn, budget, flush, peaks if peak else None)
    warmup, reps = _counts(estimate_ms, budget, warmed_ms)
    for _ in range(warmup):
        with _peak(peaks) if peak and not peaks else contextlib.nullcontext():
            fn()
    clocks: list[float | None] = []

    def chunk(k: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        for i in range(k):
            flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        if not clocks:
            clocks.append(clock())
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    t = summarize("cuda-events", _sample(chunk, reps, budget))
    return dataclasses.replace(t, peak_bytes=peaks[0] if peaks else None, clock_mhz=clocks[0])


def _estimate(fn: Callable[[], object], budget: Budget, flush: torch.Tensor,
              peaks: list | None) -> tuple[float, float]:
    """(one call's milliseconds, what the estimating calls took): a flushed call (the first call
    already ran: compile is out of the way), and two more where one is short beside the budget;
    its peak memory into `peaks`."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with _peak(peaks) if peaks is not None else contextlib.nullcontext():
        start.record()
        flush.zero_()
        fn()
        end.record()
    torch.cuda.synchronize()
    estimate_ms = start.elapsed_time(end)
    if estimate_ms < budget.rep_ms:
        start.record()
        for _ in range(2):
            flush.zero_()
            fn()
        end.record()
        torch.cuda.synchronize()
        spent = estimate_ms + start.elapsed_time(end)
        return spent / 3, spent
    return estimate_ms, estimate_ms


class CaptureError(RuntimeError):
    """A call could not be captured into a CUDA graph (a host sync inside it, say)."""


def time_cuda_graph(fn: Callable[[], object], budget: Budget, flush: torch.Tensor,
                    clock: Callable[[], float | None] = lambda: None, estimate_ms: float | None = None) -> Timing:
    """Captures one call into a CUDA graph and times its replays, with the same L2 flush and
    budgets as time_cuda. A replay runs exactly the device work of the call without the host's
    Python, autograd and launch overhead in between, which in training is hidden because the CPU
    runs ahead of the GPU; at small and medium shapes that overhead would otherwise be most of
    what events measure, for every provider alike. Rows are labelled 'cuda-graph'. Each graph
    captures into its own memory pool, freed before this returns; `estimate_ms`: time_cuda's."""
    graph = Graph.capture(fn)
    try:
        return graph.time(budget, flush, clock, estimate_ms)
    finally:
        graph.close()


@dataclass
class Graph:
    """One call captured into a CUDA graph with its own memory pool, replayed until closed: timed
    once when captured, and (the runner) again at the end of its case, where the recheck replays
    it instead of copying the inputs and capturing a new call."""
    graph: Any  # torch.cuda.CUDAGraph (a stand-in in the CPU tests)
    peak_bytes: int  # what one eager call allocated beyond what existed before it
    pool_bytes: int  # what the graph's memory pool holds while the graph lives

    @classmethod
    def capture(cls, fn: Callable[[], object]) -> "Graph":
        peaks: list[int] = []
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with _peak(peaks), torch.cuda.stream(stream):
            for _ in range(3):  # warm the allocator and autograd on a side stream, as capture requires
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph, pool_bytes = _capture(fn)
        return cls(graph, peaks[0], pool_bytes)

    def time(self, budget: Budget, flush: torch.Tensor, clock: Callable[[], float | None] = lambda: None,
             estimate_ms: float | None = None) -> Timing:
        """The replays timed as time_cuda times a call, each after an L2 flush."""
        t = time_cuda(self.graph.replay, budget, flush, clock=clock, peak=False, estimate_ms=estimate_ms)
        return dataclasses.replace(t, method="cuda-graph", peak_bytes=self.peak_bytes)

    def close(self) -> None:
        """Frees the graph's memory pool now, not whenever the graph is collected."""
        self.graph.reset()


def _capture(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, int]:
    """One call of `fn` captured into a CUDA graph with its own memory pool, as torch.cuda.graph
    does, with the bytes the pool reserved (the cache is emptied before the capture: the reserve
    grows by the pool alone), except when the capture fails. There, torch.cuda.graph's capture_end
    raises before it ends the allocator's routing of the capture stream's allocations into the
    graph's pool, and before it leaves the capture stream: every later capture on that (shared)
    stream then allocated into the failed pool, which nothing releases. On the H100 at 485b723 and
    the H200 at 64f7be9, after one provider's failed capture, reserved memory grew by each case's
    working set until captures ran out of memory. Here a failed capture ends the routing, releases
    its pool and leaves its stream."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    error = None
    with torch.cuda.stream(torch.cuda.Stream()):
        graph.capture_begin(pool=pool)
        try:
            fn()
        except Exception as e:  # only its message: its frames would keep the call's tensors alive
            error = f"{type(e).__name__}: {e}"
        try:
            graph.capture_end()
        except Exception as e:
            error = error or f"{type(e).__name__}: {e}"
            device = torch.cuda.current_device()
            with contextlib.suppress(RuntimeError):
                torch._C._cuda_endAllocateToPool(device, pool)
            with contextlib.suppress(RuntimeError):
                torch._C._cuda_releasePool(device, pool)
    if error is not None:
        with contextlib.suppress(Exception):
            graph.reset()  # a capture that ended (the error was Python's) releases its pool here
        raise CaptureError(error)
    return graph, torch.cuda.memory_reserved() - reserved


def time_cpu(fn: Callable[[], object], budget: Budget, estimate_ms: float | None = None) -> Timing:
    """`estimate_ms`: the duration of a call already made (the correctness call, an earlier
    measurement), which spares the estimating call; under the interpreter a call takes 0.1-1 s."""
    if estimate_ms is None:
        t0 = clock()
        fn()  # the estimate, and the first warm-up call
        estimate_ms = (clock() - t0) * 1e3
    warmup, reps = _counts(estimate_ms, budget)
    for _ in range(min(warmup - 1, 2)):
        fn()

    def chunk(k: int) -> list[float]:
        out = []
        for _ in range(k):
            t0 = clock()
            fn()
            out.append((clock() - t0) * 1e3)
        return out

    return summarize("cpu-clock", _sample(chunk, reps, budget))


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
