"""GPU A/B of the flat elementwise kernels' launch (gelu, swiglu, geglu): elements per program
(BLOCK) and warps, against today's default (_utils.elementwise_settings), at the decode shapes
(one row: a few programs, latency-bound) and the largest full-grid shapes (bandwidth-bound).

Each (shape, mode, variant) is checked against the float64 reference first (FAIL: not timed), then
timed like the collector (CUDA graph replays, L2 flushed before each, timing.Budget(5, 25)), bf16.
Peers are not timed here: the collector's runs in data/ hold torch.compile's times for these shapes.

    python benchmarks/elementwise_ab.py                               # GPU, < 60 s on an H200
    TRITON_INTERPRET=1 python benchmarks/elementwise_ab.py --dry-run  # CPU: tiny shapes, no timing
"""
from __future__ import annotations

import argparse
import os
import sys
import time

T0 = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import geglu, gelu, swiglu  # noqa: E402

COPY_GBPS = 4250.0  # H200, measured copy (read + write)
DTYPE = torch.bfloat16
DEADLINE_S = 55

VARIANTS = [  # (label, launch keywords)
    ("default", {}),
    ("1024/4w", {"block": 1024, "num_warps": 4}),
    ("2048/4w", {"block": 2048, "num_warps": 4}),
    ("2048/8w", {"block": 2048, "num_warps": 8}),
    ("8192/8w", {"block": 8192, "num_warps": 8}),
    ("8192/16w", {"block": 8192, "num_warps": 16}),
]
# (kernel, (M, N), approximate for gelu)
SHAPES = [
    ("gelu", (1, 4099), "none"), ("gelu", (1, 3072), "tanh"), ("swiglu", (1, 14336), None),
    ("geglu", (1, 16384), None), ("gelu", (4096, 3072), "none"), ("swiglu", (1024, 5632), None),
    ("swiglu", (16384, 14336), None), ("geglu", (16384, 16384), None), ("gelu", (8192, 16384), "tanh"),
]
DRY_SHAPES = [("gelu", (3, 4099), "none"), ("swiglu", (2, 1000), None), ("geglu", (1, 5003), None)]


def calls(kernel, mode, t, approx, kw):
    """(callable of our launch with keywords kw, float64 reference answer)."""
    if kernel == "gelu":
        x, dy = t[0], t[1]
        xd = x.double().requires_grad_(True)
        ref = gelu.reference(xd, approx)
        if mode == "fwd":
            return (lambda: (gelu.gelu_forward(x, approx, **kw),)), (ref.detach(),)
        return (lambda: (gelu.gelu_backward(dy, x, approx, **kw),)), torch.autograd.grad(ref, xd, dy.double())
    mod = swiglu if kernel == "swiglu" else geglu
    fwd, bwd = getattr(mod, f"{kernel}_forward"), getattr(mod, f"{kernel}_backward")
    a, b, dc = t
    ad, bd = a.double().requires_grad_(True), b.double().requires_grad_(True)
    ref = mod.reference(ad, bd)
    if mode == "fwd":
        return (lambda: (fwd(a, b, **kw),)), (ref.detach(),)
    return (lambda: bwd(dc, a, b, **kw)), torch.autograd.grad(ref, (ad, bd), dc.double())


def nbytes(kernel, mode, n):
    tensors = {("gelu", "fwd"): 2, ("gelu", "bwd"): 3, ("swiglu", "fwd"): 3, ("swiglu", "bwd"): 5}
    return tensors[("gelu" if kernel == "gelu" else "swiglu", mode)] * n * DTYPE.itemsize


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU (TRITON_INTERPRET=1): tiny shapes, checks only")
    args = ap.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    flush = None if args.dry_run else torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    budget = timing.Budget(5, 25)
    print(f"elementwise A/B, bf16, {'dry run' if args.dry_run else torch.cuda.get_device_name()}", flush=True)
    for kernel, (m, n), approx in DRY_SHAPES if args.dry_run else SHAPES:
        g = torch.Generator(device=device).manual_seed(0)
        t = [(torch.randn(m, n, generator=g, device=device) * 2).to(DTYPE) for _ in range(3)]
        for mode in ("fwd", "bwd"):
            default_ms = None
            for label, kw in VARIANTS:
                name = f"{kernel:6s} {mode} {m}x{n}{' ' + approx if approx else '':6s} {label:9s}"
                if time.perf_counter() - T0 > DEADLINE_S:
                    print(f"{name} SKIP (past the time budget)", flush=True)
                    continue
                fn, want = calls(kernel, mode, t, approx, kw)
                err = verify.max_error(fn(), want)
                if not err <= 8e-3:  # the bf16 tolerance of these kernels' specs
                    print(f"{name} FAIL error {err:.3g}", flush=True)
                    continue
                if args.dry_run:
                    print(f"{name} ok (dry run, error {err:.1e})", flush=True)
                    continue
                ms = timing.time_cuda_graph(fn, budget, flush).median_ms
                default_ms = default_ms or ms
                gbps = nbytes(kernel, mode, m * n) / ms / 1e6
                print(f"{name} {ms * 1000:8.2f} us {gbps:6.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}% of copy"
                      f"  x{default_ms / ms:.3f} vs default", flush=True)
    print(f"total {time.perf_counter() - T0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
