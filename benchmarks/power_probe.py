"""Do the providers of a case run at the same clocks? Each provider's call is replayed from a CUDA
graph for a few seconds back to back while nvidia-smi samples the SM clock, power draw and
temperature every 100 ms; printed per provider: replays per second (ms per call) and the median and
range of the samples. A compute-bound case that moves more bytes draws more power and, at the power
cap, runs at lower clocks: the collector's sustained timing sees it, a single profiled call does not.

    python benchmarks/profile_kernels.py ...  # single call, kernels and idle gaps (--timeline)
    python benchmarks/power_probe.py fused_linear_cross_entropy:8192x4096x128256x0:fwd+bwd --seconds 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import ab_tools  # noqa: E402,F401  (the collector's CUDA allocator and ptxas)
from benchmarks.profile_kernels import graph_of, provider_calls  # noqa: E402

QUERY = "clocks.sm,power.draw,temperature.gpu"


def sampled(fn, seconds: float) -> tuple[float, list[tuple[float, ...]]]:
    """(ms per call, nvidia-smi samples) of fn replayed for `seconds`."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    try:
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            calls += 5
        ms = (time.perf_counter() - t0) / calls * 1e3
    finally:
        smi.terminate()
        out, _ = smi.communicate()
    rows = []
    for line in out.splitlines():
        try:
            rows.append(tuple(float(v) for v in line.split(",")))
        except ValueError:  # a partial line at the end
            pass
    return ms, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="KERNEL:SHAPE[:MODE[:PROVIDER]] as profile_kernels.py")
    ap.add_argument("--seconds", type=float, default=3.0, help="replay time per provider (default 3)")
    ap.add_argument("--rest", type=float, default=2.0, help="idle seconds before each provider (default 2)")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}; samples of {QUERY} every 100 ms", flush=True)
    for spec, shape, mode, p, call in provider_calls(args.cases):
        head = f"{spec.name} {shape.label} {mode} {p.name:10s}"
        try:
            graph = graph_of(call)
            replay, how = graph.replay, "graph"
        except Exception as e:  # a provider that syncs with the host (Liger): plain calls
            print(f"{head} not capturable ({type(e).__name__}): plain calls", flush=True)
            graph, replay, how = None, call, "calls"
        torch.cuda.synchronize()
        time.sleep(args.rest)
        ms, rows = sampled(replay, args.seconds)
        if graph is not None:
            graph.reset()
        if not rows:
            print(f"{head} {ms:9.3f} ms/call ({how})  (no samples)", flush=True)
            continue
        cols = list(zip(*rows))
        stat = "  ".join(f"{name} median {statistics.median(c):.0f} [{min(c):.0f}-{max(c):.0f}]"
                         for name, c in zip(("SM MHz", "W", "C"), cols))
        print(f"{head} {ms:9.3f} ms/call ({how})  {stat}", flush=True)


if __name__ == "__main__":
    main()
