"""GPU A/B of fp8_quant's launch variants against the default and torch.compile.

Each (shape, variant) is first checked against the float64 reference as the collector does
(SPEC.compare dequantises q * scale, the input itself is the reference; FAIL: not timed), then timed
exactly like the collector (CUDA graph replays, L2 flushed before each, timing.Budget(5, 25)), bf16
in, e4m3 out. One line per case: ms, GB/s from SPEC.bytes_moved (bf16 read + fp8 write + scales),
% of the H200's measured copy bandwidth, and our default's time over this one (x > 1: faster than
the default). Variants whose launch (kernel, grid, constexprs, warps) is the default's or an earlier
one's are named and not timed again. The torch.compile peer runs on the first case only, last.

    python benchmarks/fp8_quant_ab.py              # on the GPU, < 75 s (later cases skipped past --budget-s)
    TRITON_INTERPRET=1 python benchmarks/fp8_quant_ab.py --dry-run   # CPU: tiny shapes, checks only
"""
from __future__ import annotations

import argparse
import os
import sys
import time

T0 = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from benchmarks.ab_tools import launches  # noqa: E402

from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import fp8_quant as K  # noqa: E402

COPY_GBPS = 4250.0  # H200, measured copy (read + write)
DTYPE = torch.bfloat16
SPEC = K.SPEC

# Keywords of fp8_quant_forward per launch path; the first run of this script chose today's
# defaults (docs/evidence/fp8_quant_ab_h200_run1.txt). Wide rows (N > ROW_MAX, two-pass kernel;
# default: one program per SM, 32 warps, 16384 columns per load, cache hints).
WIDE = [
    ("default", {}),
    ("two-pass pairs (_quant_wide_rows)", {"lines": False}),
    ("16w", {"num_warps": 16, "lines": False}),
    ("former default: 2/SM 8w 8k no hints", {"programs_per_sm": 2, "num_warps": 8, "chunk": 8192, "hints": False,
                                             "lines": False}),
    ("no hints", {"hints": False, "lines": False}),
    ("chunk 8k", {"chunk": 8192, "lines": False}),
    ("32w chunk 32k", {"num_warps": 32, "chunk": 32768, "lines": False}),
    # run 4: softmax's lines path (_quant_wide_lines: per-line amax, both passes prefetched; the
    # default since, one program a row) at _utils.lines_launch's wide rows' chunks (64 KB of 32
    # warps) and other chunks (elements) and grids
    ("lines 1/SM", {"lines": True, "lines_programs": 1}),
    ("lines 32K 16w", {"lines": True, "lines_chunk": 16384, "lines_programs": 1}),
    ("lines 16K 8w 2/SM", {"lines": True, "lines_chunk": 8192, "lines_programs": 2}),
    ("lines 32K 16w rows", {"lines": True, "lines_chunk": 16384, "lines_programs": "rows"}),
    ("lines 64K 32w rows", {"lines": True, "lines_programs": "rows"}),
    # run 5: 16 elements a line (two 16-byte loads, one 16-byte store of e4m3: 8-byte stores at 8)
    ("lines vec16", {"lines_vec": 16}),
    ("lines vec16 2/SM", {"lines_vec": 16, "lines_programs": 2}),
    ("lines 2/SM", {"lines_programs": 2}),
]
# One-pass row kernel (default: 8192 // next_pow2(N) rows per program, min 1; warps by tile size)
ROWS_16K = [("default", {}), ("16w", {"num_warps": 16}), ("evict_last", {"policy": "evict_last"}),
            ("evict_first", {"policy": "evict_first"}), ("16w evict_last", {"num_warps": 16, "policy": "evict_last"})]
ROWS_4K = [("default", {}), ("evict_last", {"policy": "evict_last"}), ("evict_first", {"policy": "evict_first"})]
# 128x128 tiles (default: one tile per program, 4 warps)
TILES = [("default", {}), ("evict_last", {"policy": "evict_last"}), ("evict_first", {"policy": "evict_first"})]

# (gran, M, N, variants), most important first: past --budget-s the rest is skipped
CASES = [
    ("row", 1024, 128256, WIDE),
    ("row", 1024, 16384, ROWS_16K),
    ("128x128", 4096, 14336, TILES),
    ("row", 8192, 4096, ROWS_4K),
    ("128x128", 14336, 4096, TILES),
]
# --dry-run: small shapes on the same launch paths (N > ROW_MAX stays wide, 16384 stays one-pass)
DRY = {(1024, 128256): (3, 40000), (1024, 16384): (5, 16384), (4096, 14336): (200, 300),
       (8192, 4096): (9, 4096), (14336, 4096): (260, 384)}


def make_inputs(gran, m, n, device, seed=0):
    """SPEC.make_inputs' distributions, drawn on the device (a CPU draw of 1024 x 128256 would eat
    the time budget)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((m, n), generator=g, device=device)
    if gran == "128x128":
        x = x * 0.02
    else:
        x = x * torch.exp(torch.randn((n,), generator=g, device=device) * 0.75)
    return {"x": x.to(DTYPE), "gran": gran}


def run_case(gran, m, n, variants, device, dry, flush, budget, deadline, with_peer, default_ms=None):
    """Our default's median ms (or the one given: the peer's run compares with the first case's)."""
    tol = SPEC.tolerance[DTYPE]
    dims = {"M": m, "N": n, "gran": gran}
    nbytes = SPEC.bytes_moved(dims, DTYPE, "fwd")
    inp = make_inputs(gran, m, n, device)
    x = inp["x"]
    _, want = verify.reference_answers(SPEC, inp, "fwd", seed=1)  # float64 x, on the device
    cases = [(label, (lambda kw=kw: K.fp8_quant_forward(x, gran, **kw)), True) for label, kw in variants]
    if with_peer:
        compile_fn = SPEC.provider("compile").fn
        cases.append(("torch.compile", lambda: compile_fn(x=x, gran=gran), False))

    seen = {}
    for label, fn, is_ours in cases:
        name = f"fp8_quant {gran:7s} {m}x{n} {label:28s}"
        if time.perf_counter() > deadline:
            print(f"{name} SKIP (past the time budget)", flush=True)
            continue
        try:
            if is_ours:
                key = launches(fn)
                if key in seen:
                    print(f"{name} same launch as {seen[key]}", flush=True)
                    continue
                seen[key] = label
            with torch.no_grad():
                err = verify.max_error(SPEC.compare(fn()), want)
                if not err <= tol:
                    print(f"{name} FAIL error {err:.3g} > {tol:.3g}", flush=True)
                    continue
                if dry:
                    print(f"{name} ok (dry run, error {err:.2e})", flush=True)
                    continue
                ms = timing.time_cuda_graph(fn, budget, flush).median_ms
            if label == "default":
                default_ms = ms
            gbps = nbytes / ms / 1e6
            vs = f"x{default_ms / ms:.3f} vs default" if default_ms else ""
            print(f"{name} {ms:8.4f} ms {gbps:7.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}% of copy  {vs}"
                  f"  (error {err:.1e})", flush=True)
        except Exception as e:  # one failing case (a compile error, a missing peer) is a result
            print(f"{name} ERROR {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}", flush=True)
    return default_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU (TRITON_INTERPRET=1): small shapes, checks only")
    ap.add_argument("--only", default="", help="comma-separated substrings of 'gran MxN': only those cases")
    ap.add_argument("--budget-s", type=float, default=68.0, help="skip the cases left after this many seconds")
    ap.add_argument("--no-peer", action="store_true", help="skip the torch.compile peer")
    args = ap.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    flush = None if args.dry_run else torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    budget = timing.Budget(5, 25)
    deadline = T0 + args.budget_s
    where = "dry run, CPU interpreter" if args.dry_run else torch.cuda.get_device_name()
    print(f"fp8_quant A/B, bf16 -> e4m3, {where}; % of {COPY_GBPS:.0f} GB/s copy", flush=True)
    selected = [c for c in CASES if not args.only or any(o in f"{c[0]} {c[1]}x{c[2]}" for o in args.only.split(","))]
    # the peer (torch.compile of the eager code, first case only) goes last, within the deadline
    runs = [(c, False) for c in selected]
    if selected and not args.no_peer:
        runs.append(((*selected[0][:3], []), True))
    first_default = None
    for i, ((gran, m, n, variants), peer) in enumerate(runs):
        if args.dry_run:
            m, n = DRY[(m, n)]
        try:
            ms = run_case(gran, m, n, variants, device, args.dry_run, flush, budget, deadline, peer,
                          first_default if peer else None)
            first_default = ms if i == 0 else first_default
        except Exception as e:
            print(f"{gran} {m}x{n}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
        if not args.dry_run:
            torch.cuda.empty_cache()
    print(f"total {time.perf_counter() - T0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
