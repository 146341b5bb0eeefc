"""GPU A/B of layer_norm's launch variants against the default and the peers (Liger, eager, compile).

Each (shape, variant) is first checked against the float64 reference (FAIL: not timed), then timed
exactly like the collector (CUDA graph replays, L2 flushed before each, timing.Budget(5, 25)), bf16.
One line per case: ms, GB/s from layer_norm.SPEC.bytes_moved, % of the H200's measured copy
bandwidth, and our default's time over this one (x > 1: faster than the default). Variants whose
launches (kernels, grids, scalars, constexprs, warps) equal the default's or an earlier variant's
are named and not timed again. The forward is timed as the collector's fwd mode calls it (y, mean
and rstd written); the backward as our kernels on our forward's mean and rstd, plus the collector's
autograd call and the peers. torch.compile's forward (slow to compile) comes after every other case,
for the first two forward shapes, while time is left.

    python benchmarks/layer_norm_ab.py              # on the GPU, < 75 s (later cases skipped past --budget-s)
    TRITON_INTERPRET=1 python benchmarks/layer_norm_ab.py --dry-run   # CPU: tiny shapes, checks only
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import time

T0 = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.ab_tools import launches, lazy  # noqa: E402

from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import layer_norm as L  # noqa: E402

COPY_GBPS = 4250.0  # H200, measured copy (read + write)
DTYPE = torch.bfloat16
EPS = 1e-5
SPEC = L.SPEC
HAVE_LIGER = importlib.util.find_spec("liger_kernel") is not None


# (label, keywords of layer_norm_forward given N). Run 1 (docs/evidence/layer_norm_ab_h200_run1.txt)
# chose today's defaults: 32 elements per thread; persistent + prefetch at 16384 wide; the chunked
# path at 2 programs per SM. Run 2: the cache hint of the x loads, and the runners-up of run 1.
FWD_VARIANTS = [
    ("default", lambda n: {}),
    ("evict_last", lambda n: {"policy": "evict_last"}),
    ("no hint", lambda n: {"policy": ""}),
    ("persistent+prefetch", lambda n: {"persistent": True, "prefetch": True}),
    ("persistent+prefetch evict_last", lambda n: {"persistent": True, "prefetch": True, "policy": "evict_last"}),
    ("16/thread", lambda n: {"per_thread": 16}),
    ("wide 1/SM", lambda n: {"wide_per_sm": 1, "lines": False}),
    ("wide 2/SM chunk 32768 32w", lambda n: {"chunk": 32768, "wide_warps": 32, "lines": False}),
    # run 7: where Liger or torch.compile led (1x4096, 1024x2048, 4096x16384): more warps; none
    # gained more than 3% (layer_norm_ab_h200_run7.txt), the defaults stayed
    ("8 warps", lambda n: {"num_warps": 8}),
    ("16 warps", lambda n: {"num_warps": 16}),
    ("4 warps", lambda n: {"num_warps": 4}),
    ("16/thread persistent+prefetch", lambda n: {"per_thread": 16, "persistent": True, "prefetch": True}),
    # run 10: w and b loaded with x or after the reductions (with x: the default since run 11;
    # run 11 also without the x cache hint). Also measured in run 10 and removed since: rows of 16384 and 65536 on the chunked paths,
    # _ln_fwd_wide (chunk 8192) or a per-lane Welford kernel that prefetched the next chunk
    # (57-62% of copy at 4096x16384 against 83% by default, 48-57% at 2048x65536 against 71%)
    ("early w/b", lambda n: {"early_wb": True}),
    ("late w/b", lambda n: {"early_wb": False}),
    ("early w/b, no hint", lambda n: {"early_wb": True, "policy": ""}),
    ("late w/b, no hint", lambda n: {"early_wb": False, "policy": ""}),
    ("one tile, cap 64 (2/SM)", lambda n: {"persistent": False, "prefetch": False, "maxnreg": 64}
     if n == 16384 else {}),
    # run 14: softmax's lines path for rows too wide for registers (_ln_fwd_lines: per-line sums of
    # x - x[0] and their squares, both passes prefetched) at _utils.lines_launch's defaults (65536
    # bf16: 16 KB chunks of 8 warps, one program a row) and other chunks (elements) and grids,
    # against _ln_fwd_wide; at 16384 the lines path instead of the register path (max_block 8192)
    ("chunked Chan (_ln_fwd_wide)", lambda n: {"lines": False}),
    ("lines", lambda n: {"lines": True}),
    ("lines 2/SM", lambda n: {"lines": True, "lines_programs": 2}),
    ("lines 32K 16w rows", lambda n: {"lines": True, "chunk": 16384}),
    ("lines 64K 32w 1/SM", lambda n: {"lines": True, "chunk": 32768, "lines_programs": 1}),
    ("lines at 16384", lambda n: {"lines": True, "max_block": 8192} if n == 16384 else {}),
    ("lines at 16384, 8K chunks", lambda n: {"lines": True, "max_block": 8192, "chunk": 4096} if n == 16384 else {}),
    # run 15: w and b loaded at their use in pass 2 instead of a chunk ahead (their prefetch cost
    # registers: 207 -> 94 at 16 KB chunks of 8 warps, 2 programs per SM instead of 1; no spills at
    # 16 and 32 warps, which spilled 288-360 bytes a thread)
    ("lines wb@use", lambda n: {"lines": True, "lines_wb_ahead": False}),
    ("lines wb@use 2/SM", lambda n: {"lines": True, "lines_wb_ahead": False, "lines_programs": 2}),
    ("lines wb@use 32K 16w rows", lambda n: {"lines": True, "lines_wb_ahead": False, "chunk": 16384}),
    ("lines wb@use 64K 32w 1/SM", lambda n: {"lines": True, "lines_wb_ahead": False, "chunk": 32768,
                                             "lines_programs": 1}),
    ("lines wb@use 8K 4w rows", lambda n: {"lines": True, "lines_wb_ahead": False, "chunk": 4096}),
    ("lines wb@use at 16384", lambda n: {"lines": True, "lines_wb_ahead": False, "max_block": 8192}
     if n == 16384 else {}),
    # run 16: the defaults since run 15 with one program a row (fp8_quant's best at its widest rows);
    # at 16384 a whole row a chunk (16 warps), 1-2 per SM, and the register path (the default before)
    ("lines rows", lambda n: {"lines_programs": "rows"}),
    ("lines 2/SM", lambda n: {"lines_programs": 2}),
    ("lines 32K 16w", lambda n: {"chunk": 16384}),
    ("lines 32K 16w 2/SM", lambda n: {"chunk": 16384, "lines_programs": 2}),
    ("register path", lambda n: {"max_block": 16384} if n == 16384 else {}),
]

# (label, keywords of layer_norm_backward given N). Run 3 (layer_norm_ab_h200_run3.txt) chose the
# persistent, prefetching backward with evict_first loads for rows up to 8192 (8 warps at 4096);
# run 4: its warps, hints and prefetch once more.
BWD_VARIANTS = [
    ("default", lambda n: {}),
    ("16 warps", lambda n: {"num_warps": 16}),
    ("4 warps", lambda n: {"num_warps": 4}),
    ("evict_last", lambda n: {"policy": "evict_last"}),
    ("no hint", lambda n: {"policy": ""}),
    ("no prefetch", lambda n: {"prefetch": False}),
    ("w re-read", lambda n: {"w_reload": True}),
    ("16 warps, w re-read", lambda n: {"num_warps": 16, "w_reload": True}),
    ("16 warps, w re-read, cap 64", lambda n: {"num_warps": 16, "w_reload": True, "maxnreg": 64}),
    ("w re-read, cap 80", lambda n: {"w_reload": True, "maxnreg": 80}),
    # run 20: 16 warps with w held, capped at 64 (82 registers uncapped, one program per SM; 64
    # spills 16 bytes: 2 programs, 32 warps per SM, as rms_norm's backward at 4096 wide)
    ("16 warps, cap 64", lambda n: {"num_warps": 16, "maxnreg": 64}),
    # run 22: the next tile's mean and rstd loaded with its x and dy (same registers, sm_90); the
    # default since run 23, with evict_last up to 4096 wide; "stats at use" is the one before
    ("stats at use", lambda n: {"stats_ahead": False, "policy": "evict_first"}),
    ("stats ahead", lambda n: {"stats_ahead": True}),
    ("stats ahead, no hint", lambda n: {"stats_ahead": True, "policy": ""}),
    ("stats ahead, evict_last", lambda n: {"stats_ahead": True, "policy": "evict_last"}),
    ("stats ahead, evict_first", lambda n: {"stats_ahead": True, "policy": "evict_first"}),
    # run 25: 32 warps (8192 wide: 8 elements a thread, 64 registers, one program of 32 warps per
    # SM instead of one of 16 at 125 registers; sm_90): lost everywhere, 8192x8192 80.2% -> 64.0%
    ("32 warps", lambda n: {"num_warps": 32}),
    ("32 warps, evict_last", lambda n: {"num_warps": 32, "policy": "evict_last"}),
    # (run 24 timed the coop backward with the next row's mean and rstd loaded with its x and dy,
    # "coop stats ahead": it lost and was removed, see layer_norm._BWD_COOP_SEG)
    # c1 and c2 in two reductions, the default before run 9 (now one reduction over the pair)
    ("two sums", lambda n: {"fused_sums": False}),
    ("registers 16384 (w re-read)", lambda n: {"max_block": 16384} if n == 16384 else {}),
    # run 5 chose 32 columns per program of the partial sums (was 128); this is the old setting
    ("sum 128 cols", lambda n: {"sum_block": 128}),
    # run 26: the partial sums in fewer, wider loads (32 rows x 32 columns a program before, the
    # rows in a loop: 9 dependent loads for 264 partial rows; 128 x 32 since)
    ("sum 512x8", lambda n: {"sum_rows": 512, "sum_block": 8}),
    ("sum 256x16", lambda n: {"sum_rows": 256, "sum_block": 16}),
    ("sum 32x32", lambda n: {"sum_rows": 32, "sum_block": 32}),
    # rows wider than the register block: the two-pass column blocks the GPU's default replaced, and
    # other segments and warps of the default (_ln_bwd_coop); at 8192 wide, coop instead of registers
    ("cols", lambda n: {"wide": "cols"}),
    ("coop seg 1024", lambda n: {"coop_seg": 1024}),
    ("coop 8 warps", lambda n: {"coop_warps": 8}),
    ("coop seg 4096 8 warps", lambda n: {"coop_seg": 4096, "coop_warps": 8}),
    ("coop at 8192", lambda n: {"max_block": 4096} if n == 8192 else {}),
    # run 17: register caps on the coop backward (168 registers a thread uncapped: 3 programs of 4
    # warps per SM; 128: 4, 96: 5, with spills; sm_90 compile)
    ("coop cap 128", lambda n: {"coop_maxnreg": 128}),
    ("coop cap 96", lambda n: {"coop_maxnreg": 96}),
    # run 20 also measured the coop row finished a step late re-read from L2 instead of held in
    # registers (rms_norm's COOP_RELOAD): lost, removed (layer_norm.py, _BWD_COOP_SEG)
    # run 10 also measured dw and db partials added atomically (red.global) and cast by the last
    # program to arrive, in one launch: 32768x4096 the same (86.2%), 1024x2048 and 3000x3584 8-10%
    # slower; removed
    # run 27: each coop step also prefetches into L2 the row 1 or 2 steps past the one it loads
    # (_utils.prefetch_l2: no registers, same occupancy)
    ("coop L2 ahead 1", lambda n: {"coop_l2_ahead": 1}),
    ("coop L2 ahead 2", lambda n: {"coop_l2_ahead": 2}),
    # run 28: the register path prefetching into L2 the tile 1 or 2 past the next one
    ("rows L2 ahead 1", lambda n: {"rows_l2_ahead": 1}),
    ("rows L2 ahead 2", lambda n: {"rows_l2_ahead": 2}),
]

# (mode, M, N), most important first: past --budget-s the rest is skipped
CASES = [
    ("fwd", 1, 4096),
    ("fwd", 1024, 2048),
    ("fwd", 4096, 16384),
    ("fwd", 2048, 65536),
    ("fwd", 4096, 4096),
    ("fwd", 3000, 3584),
    ("fwd", 32768, 4096),
    ("fwd", 8192, 8192),
    ("bwd", 32768, 4096),
    ("bwd", 2048, 65536),
    ("bwd", 4096, 16384),
    ("bwd", 8192, 8192),
    ("bwd", 1024, 2048),
    ("bwd", 1, 4096),
    ("bwd", 3000, 3584),
    ("bwd", 4096, 4096),
    ("bwd", 3000, 5120),
    ("bwd", 16384, 4096),
    ("bwd", 8192, 4096),
]
COMPILE_CASES = [("fwd", 4096, 16384)]  # torch.compile peer (forward only), last
DRY_M = {2048: 9, 3584: 7, 5120: 3, 4096: 11, 8192: 5, 16384: 3, 65536: 6}  # --dry-run: the same widths, a few rows (more than
# the interpreter's 4 'SMs' where a grid size should differ from the default's)


def make_inputs(m, n, device, seed=0):
    """layer_norm.make_inputs' distribution, drawn on the device (a CPU draw of 32768 x 4096 would
    eat the time budget)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn((m, n), generator=g, device=device) * (1.0 + 3.0 * torch.rand((m, 1), generator=g, device=device))
         + torch.randn((m, 1), generator=g, device=device))
    w = 1.0 + 0.2 * torch.randn(n, generator=g, device=device)
    b = 0.1 * torch.randn(n, generator=g, device=device)
    return {"x": x.to(DTYPE), "weight": w.to(DTYPE), "bias": b.to(DTYPE), "eps": EPS}


def peer_calls(mode, inp, dys, with_compile):
    """(label, callable) of the peers, built lazily (inside the case's try)."""
    peers = [("eager", L.layer_norm_eager)]
    if HAVE_LIGER:
        peers.append(("liger", L.layer_norm_liger))
    if mode == "bwd":
        peers.insert(0, ("ours via autograd (collector)", L.layer_norm))
    if with_compile:
        peers = [("compile", SPEC.provider("compile").fn)]
    return [(label, lazy(lambda fn=fn: verify.build_call(SPEC, fn, verify.clone_inputs(inp), mode, dys)))
            for label, fn in peers]


def run_case(mode, m, n, device, dry, flush, budget, deadline, compile_only=False):
    tol = SPEC.tolerance[DTYPE]
    dims = {"M": m, "N": n}
    nbytes = SPEC.bytes_moved(dims, DTYPE, mode)
    inp = make_inputs(m, n, device)
    x, w, b = inp["x"], inp["weight"], inp["bias"]
    dys, want = verify.reference_answers(SPEC, inp, mode, seed=1)  # float64, on the device
    cases = []  # (label, callable returning what is compared with `want`, is ours)
    if not compile_only:
        if mode == "fwd":
            for label, kw in FWD_VARIANTS:
                cases.append((label, lambda kw=kw(n): (L.layer_norm_forward(x, w, b, EPS, **kw)[0],), True))
        else:
            dy = dys[0].to(DTYPE)
            _, mean, rstd = L.layer_norm_forward(x, w, b, EPS)
            for label, kw in BWD_VARIANTS:
                cases.append((label, lambda kw=kw(n): L.layer_norm_backward(dy, x, w, mean, rstd, **kw), True))
    cases += [(label, fn, False) for label, fn in peer_calls(mode, inp, dys, compile_only)]

    seen = {}
    default_ms = DEFAULT_MS.get((mode, m, n))
    for label, fn, is_ours in cases:
        name = f"layer_norm {mode} {m}x{n} {label:34s}"
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
            with torch.no_grad() if mode == "fwd" else contextlib.nullcontext():
                err = verify.max_error(verify.as_tuple(fn()), want)
                if not err <= tol:
                    print(f"{name} FAIL error {err:.3g} > {tol:.3g}", flush=True)
                    continue
                if dry:
                    print(f"{name} ok (dry run, error {err:.2e})", flush=True)
                    continue
                ms = timing.time_cuda_graph(fn, budget, flush).median_ms
            if label == "default":
                default_ms = DEFAULT_MS[(mode, m, n)] = ms
            gbps = nbytes / ms / 1e6
            vs = f"x{default_ms / ms:.3f} vs default" if default_ms else ""
            print(f"{name} {ms:8.4f} ms {gbps:7.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}% of copy  {vs}"
                  f"  (error {err:.1e})", flush=True)
        except Exception as e:  # one failing case (a missing peer, a compile error) is a result
            print(f"{name} ERROR {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}", flush=True)


DEFAULT_MS: dict[tuple, float] = {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU (TRITON_INTERPRET=1): tiny shapes, checks only")
    ap.add_argument("--only", default="", help="comma-separated substrings of 'mode MxN': only those cases")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip the cases left after this many seconds (default 68; none in a dry run)")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile peer")
    args = ap.parse_args()
    if args.budget_s is None:
        args.budget_s = float("inf") if args.dry_run else 68.0
    device = "cpu" if args.dry_run else "cuda"
    flush = None if args.dry_run else torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    budget = timing.Budget(5, 25)
    where = "dry run, CPU interpreter" if args.dry_run else torch.cuda.get_device_name()
    print(f"layer_norm A/B, bf16, {where}; % of {COPY_GBPS:.0f} GB/s copy; liger "
          f"{'present' if HAVE_LIGER else 'not importable'}", flush=True)
    # the compile peer is not run on the CPU: inductor's CPU compile is slow and says nothing of the GPU
    todo = [(c, False) for c in CASES]
    if not (args.dry_run or args.no_compile):
        todo += [(c, True) for c in COMPILE_CASES]
    for (mode, m, n), compile_only in todo:
        if args.only and not any(o in f"{mode} {m}x{n}" for o in args.only.split(",")):
            continue
        if args.dry_run:
            m = DRY_M[n]
        if time.perf_counter() > T0 + args.budget_s:
            print(f"layer_norm {mode} {m}x{n}{' compile' if compile_only else ''} SKIP (past the time budget)",
                  flush=True)
            continue
        try:
            run_case(mode, m, n, device, args.dry_run, flush, budget, T0 + args.budget_s, compile_only)
        except Exception as e:
            print(f"layer_norm {mode} {m}x{n}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
        if not args.dry_run:
            torch.cuda.empty_cache()
    print(f"total {time.perf_counter() - T0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
