"""A/B of softmax's wide-row variants on a GPU (bf16), timed like the collector (CUDA graph replays,
L2 flushed before each, Budget(5, 25)). Per (shape, mode, variant): check against the float64
reference first (FAIL lines are not timed), then print ms, GB/s (the spec's bytes_moved) and % of
the H200's measured 4250 GB/s copy. Peers: Liger (rows <= 65536) and torch.compile (two fwd shapes,
run last: slow to compile). The keywords are those of softmax_forward / softmax_backward.

    python benchmarks/softmax_ab.py                               # GPU, < 75 s on an H200
    TRITON_INTERPRET=1 python benchmarks/softmax_ab.py --dry-run  # CPU: tiny shapes, no timing
"""
from __future__ import annotations

import argparse
import time

import torch

from kcollect import timing, verify
from kcollect.spec import compiled
from kcollect.kernels import softmax

SPEC = softmax.SPEC
COPY_GBPS = 4250.0  # H200 copy (read + write), measured by the collector
E = 2  # bf16 bytes
DEADLINE_S = 68  # cases not started by then are skipped, so the script stays under 75 s

# (label, keywords, applies to width n, modes). The defaults, chosen from the earlier runs of this
# script (docs/evidence/softmax_ab_h200_run*.txt): rows up to 64 KB in registers (32 warps and a
# persistent prefetching forward above 16384 elements), wider rows streamed in 32 KB chunks by one
# program per SM.
VARIANTS = [
    ("default", {}, lambda n: True, ("fwd", "bwd")),
    ("one row per program", {"persist": 0}, lambda n: 16384 < n <= 32768, ("fwd",)),
    ("persist2", {"persist": 2}, lambda n: 16384 < n <= 32768, ("fwd",)),
    ("tile 16K", {"tile_bytes": 16384}, lambda n: n <= 4096, ("fwd", "bwd")),
    ("evict_first", {"policy": "evict_first"}, lambda n: n <= 32768, ("fwd", "bwd")),
    ("no hint", {"policy": ""}, lambda n: n <= 32768, ("fwd", "bwd")),
    ("stream 32K pps2/16w", {"programs_per_sm": 2, "max_warps": 16}, lambda n: n > 32768, ("fwd",)),
]
SHAPES = [(4096, 32000), (4096, 4096), (32768, 4096), (65536, 2048), (2048, 65536), (2048, 128256), (1024, 262144)]
COMPILE_SHAPES = [(4096, 32000), (2048, 65536)]  # fwd only
# --dry-run: tiny rows that still reach every variant's path (<= 32768, <= 65536, > 65536)
DRY_SHAPES = [(3, 20000), (9, 4096), (2, 70000)]


def inputs(m, n, device, seed):
    # as make_inputs (a spread of 1 to 4 per row), drawn on the device: a CPU draw of 268M
    # elements would take seconds per shape
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, n, generator=g, device=device) * (1 + 3 * torch.rand(m, 1, generator=g, device=device))
    dy = torch.randn(m, n, generator=g, device=device, dtype=torch.float64)
    return x.to(torch.bfloat16), dy


def reference(x, dy64, mode):
    xd = x.detach().double().requires_grad_(mode == "bwd")
    y = SPEC.reference(x=xd)
    if mode == "fwd":
        return y.detach()
    return torch.autograd.grad(y, xd, dy64)[0]


class Runner:
    def __init__(self, dry: bool):
        self.dry, self.t0 = dry, time.perf_counter()
        self.device = "cpu" if dry else "cuda"
        self.flush = None if dry else torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        self.budget = timing.Budget(5, 25)

    def case(self, m, n, mode, label, fn, want):
        """Check fn() against want, then time it; one line, never raises."""
        head = f"{m}x{n} {mode}"
        if time.perf_counter() - self.t0 > DEADLINE_S:
            print(f"{head} {label:30s} SKIPPED: past the {DEADLINE_S} s deadline", flush=True)
            return
        try:
            got = verify.as_tuple(fn())[0]
            err = verify.rel_error(got, want)
            if err > SPEC.tolerance[torch.bfloat16]:
                print(f"{head} {label:30s} FAIL error {err:.3g} > {SPEC.tolerance[torch.bfloat16]:.3g}", flush=True)
                return
            note = f"err {err:.1e}"
            if self.dry:
                print(f"{head} {label:30s} dry-run ok ({note})", flush=True)
                return
            t = timing.time_cuda_graph(fn, self.budget, self.flush)
            gbps = SPEC.bytes_moved({"M": m, "N": n}, torch.bfloat16, mode) / t.median_ms / 1e6
            print(f"{head} {label:30s} {t.median_ms:8.4f} ms {gbps:6.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}%  ({note})",
                  flush=True)
        except Exception as e:  # one failing case must not stop the others
            print(f"{head} {label:30s} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)

    def peer(self, m, n, mode, label, fn, x, dy64, want):
        """A provider's function (label: its name in the spec), called as the collector calls it."""
        try:
            reason = SPEC.provider(label).available(self.device)
            if reason:
                print(f"{m}x{n} {mode} {label:30s} skipped: {reason}", flush=True)
                return
            call = verify.build_call(SPEC, fn, {"x": x.detach().clone()}, mode, (dy64,) if mode == "bwd" else ())
            self.case(m, n, mode, label, call, want)
        except Exception as e:
            print(f"{m}x{n} {mode} {label:30s} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, no timing")
    dry = ap.parse_args().dry_run
    run = Runner(dry)
    shapes = DRY_SHAPES if dry else SHAPES
    for m, n in shapes:
        x, dy64 = inputs(m, n, run.device, seed=m * n)
        for mode in ("fwd", "bwd"):
            want = reference(x, dy64, mode)
            y = softmax.softmax_forward(x)  # bwd: the saved output, as in training
            dy = dy64.to(torch.bfloat16)
            for label, kw, applies, modes in VARIANTS:
                if applies(n) and mode in modes:
                    if mode == "fwd":
                        fn = lambda kw=kw: softmax.softmax_forward(x, **kw)  # noqa: E731
                    else:
                        fn = lambda kw=kw: softmax.softmax_backward(dy, y, **kw)  # noqa: E731
                    run.case(m, n, mode, label, fn, want)
            if n <= 65536 or dry:  # Liger refuses wider rows
                run.peer(m, n, mode, "liger", softmax.softmax_liger, x, dy64, want)
            del want, y, dy
        del x, dy64
        if not dry:
            torch.cuda.empty_cache()
    # torch.compile last: ~5-10 s of compile per shape
    for m, n in (DRY_SHAPES[:1] if dry else COMPILE_SHAPES):
        x, dy64 = inputs(m, n, run.device, seed=m * n)
        run.peer(m, n, "fwd", "compile", compiled(softmax.softmax_eager), x, dy64, reference(x, dy64, "fwd"))
    print(f"total {time.perf_counter() - run.t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
