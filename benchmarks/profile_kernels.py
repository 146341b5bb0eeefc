"""Where does a provider's time go? For each (kernel, shape, mode): the collector's flushed CUDA-event
median, the host time per call (calls queued without synchronising), and the CUDA kernels one call
launches with their device time (torch.profiler). Run on a GPU:
    python benchmarks/profile_kernels.py rms_norm:8192x4096 cross_entropy:1024x32000x0 ...
    python benchmarks/profile_kernels.py rms_norm:8192x4096:bwd:triton   # one mode, one provider"""
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


def main(args):
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    budget = timing.Budget(10, 40)
    for arg in args:
        spec, shape, modes, names = parse(arg)
        inputs = spec.make_inputs(shape.dims, torch.bfloat16, "cuda", 0)
        for mode in modes:
            dys, _ = verify.reference_answers(spec, inputs, mode, 1)
            for p in spec.providers:
                if p.name not in names or p.available("cuda"):
                    continue
                call = verify.build_call(spec, p.fn, verify.clone_inputs(inputs), mode, dys)
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


if __name__ == "__main__":
    main(sys.argv[1:])
