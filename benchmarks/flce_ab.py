"""GPU A/B of fused_linear_cross_entropy's tokens per chunk against torch eager and torch.compile,
bf16, fwd+bwd (loss, dx and dW, as the collector times it).

Per (shape, variant): check against the float64 reference first (FAIL lines are not timed), then
time like the collector (CUDA graph replays, L2 flushed before each, Budget(5, 25)) and print ms,
TFLOPS (the spec's 6 T H V), peak memory of the call, and our default's time over this one.

    python benchmarks/flce_ab.py                               # GPU
    TRITON_INTERPRET=1 python benchmarks/flce_ab.py --dry-run  # CPU: tiny shapes, checks only
"""
from __future__ import annotations

import argparse
import os
import sys
import time

T0 = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import ab_tools  # noqa: E402,F401  (the collector's CUDA allocator and ptxas)
from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import fused_linear_cross_entropy as flce  # noqa: E402

SPEC = flce.SPEC
DTYPE = torch.bfloat16
MODE = "fwd+bwd"
# tokens per chunk (None: the default, _chunk_rows); a chunk of all the tokens is the unchunked path
CHUNKS = [None, 512, 1024, 1536, 2048, "all"]
SHAPES = [(3000, 3584, 152064), (8192, 4096, 128256)]
DRY = {(3000, 3584, 152064): (300, 64, 1501), (8192, 4096, 128256): (257, 32, 1000)}


def ours(chunk):
    def fn(x, weight, target, ignore_index=flce.IGNORE_INDEX, label_smoothing=0.0):
        c = x.shape[0] if chunk == "all" else chunk
        return flce.fused_linear_cross_entropy(x, weight, target, ignore_index, label_smoothing, chunk=c)
    return fn


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU (TRITON_INTERPRET=1): small shapes, checks only")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--chunks", default="", help="comma-separated tokens per chunk, or 'all' "
                    f"(default: {','.join(str(c or 'default') for c in CHUNKS)})")
    ap.add_argument("--shapes", default="", help="comma-separated TxHxV (default: "
                    f"{','.join('x'.join(map(str, s)) for s in SHAPES)})")
    args = ap.parse_args()
    chunks = [None] + [c if c == "all" else int(c) for c in args.chunks.split(",") if c] if args.chunks else CHUNKS
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    flush = None if dry else torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    budget = timing.Budget(5, 25)
    print(f"fused_linear_cross_entropy A/B, bf16, fwd+bwd, {'dry run' if dry else torch.cuda.get_device_name()}; "
          f"default chunk budget {flce._CHUNK_BYTES >> 20} MiB of logits", flush=True)
    for shape in shapes:
        t, h, v = DRY.get(shape, (257, 32, 1000)) if dry else shape
        dims = {"tokens": t, "hidden": h, "vocab": v, "smoothing": "0"}
        inputs = SPEC.make_inputs(dims, DTYPE, device, seed=t)
        dys, want = verify.reference_answers(SPEC, inputs, MODE, seed=1)
        cases = [(f"chunk {c or f'default ({flce._chunk_rows(t, v, 2)})'}", ours(c)) for c in chunks]
        cases.append(("torch eager", SPEC.provider("torch").fn))
        if not (dry or args.no_compile):
            cases.append(("torch.compile", SPEC.provider("compile").fn))
        default_ms = None
        for label, fn in cases:
            head = f"{t}x{h}x{v} {label:24s}"
            try:
                call = verify.build_call(SPEC, fn, verify.clone_inputs(inputs), MODE, dys)
                err = verify.max_error(call(), want)
                if not err <= SPEC.tolerance[DTYPE]:
                    print(f"{head} FAIL error {err:.3g}", flush=True)
                    continue
                if dry:
                    print(f"{head} dry-run ok (error {err:.1e})", flush=True)
                    continue
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                call()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
                ms = timing.time_cuda_graph(call, budget, flush).median_ms
                default_ms = default_ms or ms
                tflops = SPEC.flops(dims, MODE) / ms / 1e9
                print(f"{head} {ms:8.3f} ms {tflops:6.0f} TFLOPS  peak +{peak / 2**30:5.2f} GiB  "
                      f"x{default_ms / ms:.3f} vs default  (error {err:.1e})", flush=True)
            except Exception as e:  # one failing case must not stop the others
                print(f"{head} ERROR {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", flush=True)
        del inputs, dys, want
        if not dry:
            torch.cuda.empty_cache()
    print(f"total {time.perf_counter() - T0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
