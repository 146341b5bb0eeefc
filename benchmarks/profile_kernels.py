"""Where does a provider's time go? For each (kernel, shape, mode): the collector's flushed CUDA-event
median, the host time per call (calls queued without synchronising), and the CUDA kernels one call
launches with their device time (torch.profiler). Run on a GPU:
    python benchmarks/profile_kernels.py rms_norm:8192x4096 cross_entropy:1024x32000x0 ...
    python benchmarks/profile_kernels.py rms_norm:8192x4096:bwd:triton   # one mode, one provider
    python benchmarks/profile_kernels.py --timeline ...   # also each kernel's start, duration and the
                                                          # GPU idle before it, in a CUDA-graph replay"""
import sys
import time

import torch

from kcollect import timing, verify
from kcollect.kernels import get


def parse(arg):
    """KERNEL:SHAPE[:MODE[:PROVIDER]] -> (spec, shape, modes, provider names)."""
    name, shape, *rest = arg.split(":")
    spec = get(name)
    modes = [rest[0]] if rest and rest[0] else spec.modes
    providers = [rest[1]] if len(rest) > 1 else [p.name for p in spec.providers]
    for grid in spec.grids.values():
        for s in grid:
            if s.label == shape:
                return spec, s, modes, providers
    raise SystemExit(f"{shape} not in {name}'s grids")


def provider_calls(args):
    """(spec, shape, mode, provider, call) for each case KERNEL:SHAPE[:MODE[:PROVIDER]] in args: the
    call as the collector makes it (bf16 inputs on the GPU, a backward's upstream gradient), for
    each provider available on the GPU."""
    for arg in args:
        spec, shape, modes, names = parse(arg)
        inputs = spec.make_inputs(shape.dims, torch.bfloat16, "cuda", 0)
        for mode in modes:
            dys, _ = verify.reference_answers(spec, inputs, mode, 1)
            for p in spec.providers:
                if p.name in names and not p.available("cuda"):
                    yield spec, shape, mode, p, verify.build_call(spec, p.fn, verify.clone_inputs(inputs), mode, dys)


def graph_of(call) -> torch.cuda.CUDAGraph:
    """`call` captured into a CUDA graph, after one warm call on a side stream (as capture needs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def timeline(call) -> None:
    """One CUDA-graph replay of `call` under torch.profiler: its kernels in order with start (us from
    the first), duration and the idle gap before each, then the span, busy and idle totals."""
    graph = graph_of(call)
    graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    if not kernels:
        print("  (no kernels traced)")
        return
    t0, prev_end, busy = kernels[0][0], kernels[0][0], 0.0
    for start, end, name in kernels:
        print(f"  {start - t0:10.1f} us  {end - start:9.1f} us  gap {max(0.0, start - prev_end):7.1f}  {name[:60]}")
        busy += end - start
        prev_end = max(prev_end, end)
    span = prev_end - t0
    print(f"  span {span:.1f} us, kernels {busy:.1f} us, idle {span - busy:.1f} us")
    graph.reset()


def main(args):
    show_timeline = "--timeline" in args
    args = [a for a in args if a != "--timeline"]
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    budget = timing.Budget(10, 40)
    for spec, shape, mode, p, call in provider_calls(args):
        call()
        t = timing.time_cuda(call, budget, flush)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            call()
        host = (time.perf_counter() - t0) / 50 * 1e3
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        kern = [(e.key[:38], e.device_time_total / 1e3) for e in prof.key_averages() if e.device_time_total > 0]
        ks = " ".join(f"{n}={ms:.4f}" for n, ms in kern)
        print(f"{spec.name} {shape.label} {mode:7s} {p.name:11s} event {t.median_ms:.4f} host {host:.4f} | {ks}")
        if show_timeline:
            timeline(call)


if __name__ == "__main__":
    main(sys.argv[1:])
