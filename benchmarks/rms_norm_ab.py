"""GPU A/B of rms_norm's and add_rms_norm's launch variants against the default and Liger.

Each (shape, variant) is first checked against the float64 reference (FAIL: not timed), then timed
exactly like the collector (CUDA graph replays, L2 flushed before each, timing.Budget(5, 25)), bf16.
One line per case: ms, GB/s from the kernel's own bytes_moved, % of the H200's measured copy
bandwidth, and our default's time over this one (x > 1: faster than the default). Variants whose
launch (kernel, grid, constexprs, warps, register cap) is the default's or an earlier one's are
named and not timed again. The forward is timed as the collector's fwd mode calls it: no rstd (the
inference path), except the "+rstd" row (what training's forward writes).

    python benchmarks/rms_norm_ab.py              # on the GPU, < 75 s (later cases skipped past --budget-s)
    TRITON_INTERPRET=1 python benchmarks/rms_norm_ab.py --dry-run   # CPU: tiny shapes, checks only
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

T0 = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
from benchmarks.ab_tools import launches, lazy  # noqa: E402

from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import add_rms_norm as A  # noqa: E402
from kcollect.kernels import rms_norm as K  # noqa: E402

COPY_GBPS = 4250.0  # H200, measured copy (read + write)
DTYPE = torch.bfloat16
EPS = 1e-6


def _tile(n):
    return K._tile(n, K.FWD_PER_THREAD)  # the forward's default (BLOCK_N, BLOCK_B, ROWS, warps)


# (label, keywords of rms_norm_forward given (N, has_residual)); need_rstd=False unless given
FWD_VARIANTS = [
    ("default", lambda n, res: {}),
    ("evict_first", lambda n, res: {"x_policy": "evict_first"}),
    ("liger_like", lambda n, res: {"liger_like": True}),
    ("liger_like+evict_first", lambda n, res: {"liger_like": True, "x_policy": "evict_first"}),
    ("half_warps", lambda n, res: {"num_warps": max(4, _tile(n)[3] // 2)}),
    ("double_warps", lambda n, res: {"num_warps": min(32, _tile(n)[3] * 2)}),
    # run 32: the persistent grid prefetching into L2 the tile 1 or 2 past the next one
    ("L2 ahead 1", lambda n, res: {"l2_ahead": 1}),
    ("L2 ahead 2", lambda n, res: {"l2_ahead": 2}),
    # rows that are not whole 16-byte vectors (5003): the prefetch the default leaves out there,
    # and without the register cap
    ("prefetch", lambda n, res: {"prefetch": True}),
    ("no cap", lambda n, res: {"maxnreg": False}),
    # rows too wide for registers (65536): row segments in one launch, finished by each row's last
    # program, against the two-pass chunked default
    ("split", lambda n, res: {"wide": "split"}),
    ("split seg 4096", lambda n, res: {"wide": "split", "split_seg": 4096}),
    ("split seg 16384", lambda n, res: {"wide": "split", "split_seg": 16384}),
    ("split 16 warps", lambda n, res: {"wide": "split", "split_warps": 16}),
    ("split seg 16384 8 warps", lambda n, res: {"wide": "split", "split_seg": 16384, "split_warps": 8}),
    # the whole row in one 32-warp program's registers, in bf16 (_fwd_packed)
    ("packed", lambda n, res: {"wide": "packed"}),
    # softmax's lines path (_fwd_lines: two passes in chunks of 16-byte lines, both prefetched) at
    # _utils.lines_launch's defaults (65536 bf16: 16 KB chunks of 8 warps, one program a row) and
    # other chunks (elements) and grids
    ("lines", lambda n, res: {"wide": "lines"}),
    ("lines 2/SM", lambda n, res: {"wide": "lines", "lines_programs": 2}),
    ("lines 32K 16w rows", lambda n, res: {"wide": "lines", "lines_chunk": 16384}),
    ("lines 64K 32w 1/SM", lambda n, res: {"wide": "lines", "lines_chunk": 32768, "lines_programs": 1}),
    ("lines 8K 4w rows", lambda n, res: {"wide": "lines", "lines_chunk": 4096}),
    # run 17: w loaded at its use in pass 2 instead of a chunk ahead (its prefetch cost registers:
    # 139 -> 99 at 16 KB chunks of 8 warps, 2 programs per SM instead of 1; no spill at 16 warps)
    ("lines w@use", lambda n, res: {"wide": "lines", "lines_w_ahead": False}),
    ("lines w@use 2/SM", lambda n, res: {"wide": "lines", "lines_w_ahead": False, "lines_programs": 2}),
    ("lines w@use 32K 16w rows", lambda n, res: {"wide": "lines", "lines_w_ahead": False, "lines_chunk": 16384}),
    ("lines w@use 64K 32w 1/SM", lambda n, res: {"wide": "lines", "lines_w_ahead": False, "lines_chunk": 32768,
                                                 "lines_programs": 1}),
    ("lines w@use 8K 4w rows", lambda n, res: {"wide": "lines", "lines_w_ahead": False, "lines_chunk": 4096}),
    ("lines w@use 8K 4w 4/SM", lambda n, res: {"wide": "lines", "lines_w_ahead": False, "lines_chunk": 4096,
                                               "lines_programs": 4}),
    # run 18: the default (64 KB chunks of 32 warps, one per SM) with one program a row (fp8_quant's
    # best), and with w prefetched
    ("lines rows", lambda n, res: {"wide": "lines", "lines_programs": "rows"}),
    ("lines w ahead", lambda n, res: {"wide": "lines", "lines_w_ahead": True}),
    # small grids (1024x2048, where torch.compile led by 5%): one tile per program, tiles of 2 rows
    ("one tile per program", lambda n, res: {"persistent": False}),
    ("2 rows", lambda n, res: {"rows": 2}),
    ("2 rows, one tile per program", lambda n, res: {"rows": 2, "persistent": False}),
]

# (label, keywords of rms_norm_backward given N)
BWD_VARIANTS = [
    ("default", lambda n: {}),
    ("evict_last", lambda n: {"policy": "evict_last"}),
    ("no hint", lambda n: {"policy": ""}),
    # run 26: the next tile's rstd loaded with its x and dy (same registers, sm_90), the default
    # since without dh (run 27); "rstd at use" is the one before
    ("rstd ahead", lambda n: {"rstd_ahead": True}),
    ("rstd at use", lambda n: {"rstd_ahead": False}),
    # run 29: the dw sum's partial rows a load (128 before: 3 dependent loads for 264 rows; 512 since)
    ("sum 128 rows", lambda n: {"sum_rows": 128}),
    ("sum 256 rows", lambda n: {"sum_rows": 256}),
    # rows too wide for registers: the two-pass column blocks the default replaced on the GPU, and
    # other segments and warps of the default (_bwd_coop)
    ("cols", lambda n: {"wide": "cols"}),
    ("coop seg 4096", lambda n: {"coop_seg": 4096}),
    ("coop seg 2048 8 warps", lambda n: {"coop_warps": 8}),
    ("coop at 16384", lambda n: {"max_block": 8192} if n == 16384 else {}),
    # run 22: register caps on the coop backward (168 registers a thread uncapped: 3 programs of 4
    # warps per SM; 128: 4, 96: 5, 80: 6, with some spill; sm_90 compile)
    ("coop cap 128", lambda n: {"coop_maxnreg": 128}),
    ("coop cap 96", lambda n: {"coop_maxnreg": 96}),
    ("coop cap 80", lambda n: {"coop_maxnreg": 80}),
    # run 23: w loaded at its uses (from L1) instead of held: 128 registers without spill, with dh too
    ("coop w@use", lambda n: {"coop_w_at_use": True}),
    ("coop w@use cap 128", lambda n: {"coop_w_at_use": True, "coop_maxnreg": 128}),
    ("coop w@use cap 120", lambda n: {"coop_w_at_use": True, "coop_maxnreg": 120}),
    ("coop no cap", lambda n: {"coop_maxnreg": 0}),
    # run 24: the row finished a step late re-read from L2 instead of held in registers (sm_90, no
    # dh: 128 registers uncapped without spill; 96 with 88 bytes of stack: 5 programs per SM)
    ("coop reload", lambda n: {"coop_reload": True}),
    ("coop reload cap 96", lambda n: {"coop_reload": True, "coop_maxnreg": 96}),
    ("coop reload cap 80", lambda n: {"coop_reload": True, "coop_maxnreg": 80}),
    # the default before run 25: the row finished late held in registers (w at its uses with dh)
    ("coop held", lambda n: {"coop_reload": False}),
    # (run 28 timed the coop with the next row's rstd loaded with its x and dy, "coop rstd ahead":
    # no gain, removed; see rms_norm.COOP_RELOAD)
    # run 25: with dh, reload and w held instead of loaded at its uses (164 registers uncapped,
    # 128 without spill)
    ("coop reload w held cap 128", lambda n: {"coop_reload": True, "coop_w_at_use": False, "coop_maxnreg": 128}),
    # run 31: each coop step also prefetches into L2 the row 1 or 2 steps past the one it loads
    # (_utils.prefetch_l2: no registers, same occupancy)
    ("coop L2 ahead 1", lambda n: {"coop_l2_ahead": 1}),
    ("coop L2 ahead 2", lambda n: {"coop_l2_ahead": 2}),
    # run 32: the register path prefetching into L2 the tile 1 or 2 past the next one
    ("rows L2 ahead 1", lambda n: {"rows_l2_ahead": 1}),
    ("rows L2 ahead 2", lambda n: {"rows_l2_ahead": 2}),
]

# (kernel, mode, M, N), most important first: past --budget-s the rest is skipped
CASES = [
    ("rms_norm", "fwd", 32768, 4096),
    ("rms_norm", "bwd", 32768, 4096),
    ("rms_norm", "bwd", 1024, 65536),
    ("add_rms_norm", "bwd", 1024, 65536),
    ("rms_norm", "bwd", 2048, 16384),
    ("add_rms_norm", "fwd", 32768, 4096),
    ("add_rms_norm", "bwd", 2048, 16384),
    ("rms_norm", "fwd", 8192, 4096),
    ("add_rms_norm", "fwd", 8192, 4096),
    ("rms_norm", "fwd", 16384, 5120),
    ("rms_norm", "fwd", 4096, 8192),
    ("rms_norm", "fwd", 1024, 65536),
    ("rms_norm", "fwd", 1024, 2048),
    ("add_rms_norm", "fwd", 1024, 65536),
    ("add_rms_norm", "fwd", 999, 5003),
    ("rms_norm", "fwd", 999, 5003),
    # run 20 (--only): the coop backward with more rows a group (1024 rows: 16 a group of 32
    # programs, a pipeline of 17 steps whose first and last are half used)
    ("rms_norm", "bwd", 2048, 65536),
    ("rms_norm", "bwd", 4096, 65536),
    ("rms_norm", "bwd", 8192, 4096),
    ("rms_norm", "bwd", 16384, 5120),
    ("rms_norm", "bwd", 4096, 8192),
    ("add_rms_norm", "bwd", 4096, 8192),
    ("add_rms_norm", "bwd", 999, 5003),
    ("add_rms_norm", "bwd", 3000, 3584),
    ("add_rms_norm", "bwd", 8192, 4096),
    ("rms_norm", "bwd", 999, 5003),
    ("rms_norm", "bwd", 3000, 3584),
]
DRY_M = {2048: 9, 4096: 6, 3584: 3, 5003: 3, 65536: 3, 5120: 3, 8192: 2, 16384: 3}  # --dry-run: the same widths, a few rows


def make_inputs(kernel, m, n, device, seed=0):
    """The distributions of the kernels' own make_inputs, drawn on the device (a CPU draw of 32768 x
    4096 would eat the time budget)."""
    g = torch.Generator(device=device).manual_seed(seed)
    scaled = torch.randn((m, n), generator=g, device=device) * torch.exp(torch.randn((m, 1), generator=g, device=device))
    w = (1.0 + 0.3 * torch.randn(n, generator=g, device=device)).to(DTYPE)
    if kernel == "rms_norm":
        return {"x": scaled.to(DTYPE), "w": w, "eps": EPS}
    x = (0.5 * torch.randn((m, n), generator=g, device=device)).to(DTYPE)
    return {"x": x, "residual": scaled.to(DTYPE), "w": w, "eps": EPS}


def run_case(kernel, mode, m, n, device, dry, flush, budget, deadline):
    spec = K.SPEC if kernel == "rms_norm" else A.SPEC
    tol = spec.tolerance[DTYPE]
    dims = {"M": m, "N": n}
    nbytes = spec.bytes_moved(dims, DTYPE, mode)
    inp = make_inputs(kernel, m, n, device)
    x, w = inp["x"], inp["w"]
    r = inp.get("residual")
    has_res = r is not None
    dys, want = verify.reference_answers(spec, inp, mode, seed=1)  # float64, on the device
    cases = []  # (label, callable returning the outputs compared with `want`, launches or None)
    if mode == "fwd":
        for label, kw in FWD_VARIANTS:
            kw = {"need_rstd": False, **kw(n, has_res)}

            def ours(kw=kw):
                y, h, _ = K.rms_norm_forward(x, w, EPS, residual=r, **kw)
                return (h, y) if has_res else (y,)
            cases.append((label, ours, True))
        if has_res:
            cases.append(("liger", lambda: A.add_rms_norm_liger(x, r, w, EPS), False))
        else:
            cases.append(("liger", lambda: (K.rms_norm_liger(x, w, EPS),), False))
    else:  # bwd: our backward kernels on the (h and) rstd of our forward
        if has_res:
            dh, dy = (d.to(DTYPE) for d in dys)
        else:
            dh, dy = None, dys[0].to(DTYPE)
        _, h, rstd = K.rms_norm_forward(x, w, EPS, residual=r)
        xin = h if has_res else x
        for label, kw in BWD_VARIANTS:
            def ours(kw=kw(n)):
                dx, dw = K.rms_norm_backward(dy, xin, w, rstd, dh=dh, **kw)
                return (dx, dx, dw) if has_res else (dx, dw)  # add_rms_norm: d/dx = d/dresidual
            cases.append((label, ours, True))
        liger = A.add_rms_norm_liger if has_res else K.rms_norm_liger
        cases.append(("liger", lazy(lambda: verify.build_call(spec, liger, verify.clone_inputs(inp), "bwd", dys)),
                      False))

    seen = {}
    default_ms = None
    for label, fn, is_ours in cases:
        name = f"{kernel:12s} {mode} {m}x{n} {label:30s}"
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
                default_ms = ms
            gbps = nbytes / ms / 1e6
            vs = f"x{default_ms / ms:.3f} vs default" if default_ms else ""
            print(f"{name} {ms:8.4f} ms {gbps:7.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}% of copy  {vs}"
                  f"  (error {err:.1e})", flush=True)
        except Exception as e:  # one failing case (a missing peer, a compile error) is a result
            print(f"{name} ERROR {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU (TRITON_INTERPRET=1): tiny shapes, checks only")
    ap.add_argument("--only", default="", help="comma-separated substrings of 'kernel mode MxN': only those cases")
    ap.add_argument("--budget-s", type=float, default=68.0, help="skip the cases left after this many seconds")
    args = ap.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    flush = None if args.dry_run else torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    budget = timing.Budget(5, 25)
    where = "dry run, CPU interpreter" if args.dry_run else torch.cuda.get_device_name()
    print(f"rms_norm / add_rms_norm A/B, bf16, {where}; % of {COPY_GBPS:.0f} GB/s copy", flush=True)
    for kernel, mode, m, n in CASES:
        if args.only and not any(o in f"{kernel} {mode} {m}x{n}" for o in args.only.split(",")):
            continue
        if args.dry_run:
            m = DRY_M[n]
        try:
            run_case(kernel, mode, m, n, device, args.dry_run, flush, budget, T0 + args.budget_s)
        except Exception as e:
            print(f"{kernel} {mode} {m}x{n}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
        if not args.dry_run:
            torch.cuda.empty_cache()
    print(f"total {time.perf_counter() - T0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
