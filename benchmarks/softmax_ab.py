"""A/B of softmax's launch variants on a GPU (bf16), timed like the collector (CUDA graph replays,
L2 flushed before each, Budget(5, 25)): first the few-rows split path (rows cut into segments over a
rows x segments grid, two launches) against the default and the no-split paths, then the wide-row
register and streaming variants of the earlier runs (after torch.compile: that order puts the
split path's comparisons first when the deadline cuts the run short). Per (shape, mode, variant): check against the
float64 reference first (FAIL lines are not timed), then print us, GB/s (the spec's bytes_moved),
% of the H200's measured 4250 GB/s copy and the default's time over this one (x > 1: faster than
the default). Variants whose launches (kernels, grids, constexprs, warps) equal an earlier one's
are named and not timed again. Peers: Liger (rows <= 65536) and torch.compile (the 1-row shapes,
fwd and bwd, after the few-row shapes: several seconds of compile each, as its deadline allows). The keywords are those of softmax_forward /
softmax_backward.

    python benchmarks/softmax_ab.py                               # GPU, < 75 s on an H200
    TRITON_INTERPRET=1 python benchmarks/softmax_ab.py --dry-run  # CPU: small shapes, no timing
"""
from __future__ import annotations

import argparse
import os
import sys
import time

T0 = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.ab_tools import add_case_options, launches  # noqa: E402
from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import softmax  # noqa: E402
from kcollect.spec import compiled  # noqa: E402

SPEC = softmax.SPEC
COPY_GBPS = 4250.0  # H200 copy (read + write), measured by the collector
DEADLINE_S = 68  # cases not started by then are skipped, so the script stays under 75 s
COMPILE_DEADLINE_S = 50  # a torch.compile case compiles for several seconds before it is timed


def few(m, n):
    return m <= 16


def many(m, n):
    return m >= 1024


# (label, keywords, applies to the shape (m, n), modes). The defaults, chosen from the earlier runs
# of this script (docs/evidence/softmax_ab_h200_run*.txt): rows up to 64 KB in registers (32 warps
# and a persistent prefetching forward above 16384 elements), wider rows streamed in 32 KB chunks
# by one program per SM, or split when there are at most softmax._SPLIT_MAX_ROWS of them
# (provisional). Run 3's evict_first / no-hint / 16 KB-tile variants (the former defaults) are not
# repeated.
VARIANTS = [
    ("default", {}, lambda m, n: True, ("fwd", "bwd")),
    # few rows: the split path (segments of 4096 by default) and the paths it replaces
    ("split", {"split": True}, few, ("fwd", "bwd")),
    ("split seg 8K", {"split": True, "split_seg": 8192}, few, ("fwd", "bwd")),
    ("split seg 2K", {"split": True, "split_seg": 2048}, few, ("fwd", "bwd")),
    ("split seg 1K", {"split": True, "split_seg": 1024}, few, ("fwd", "bwd")),  # 126 programs a row at 128256
    ("split evict_first", {"split": True, "policy": "evict_first"}, lambda m, n: few(m, n) and n == 128256,
     ("fwd", "bwd")),
    ("no split", {"split": False}, few, ("fwd", "bwd")),
    # the backward's register path with bf16 widened once and kept as fp32 across its reduction
    # (the default before run 6; it spills at 32768)
    ("unpacked", {"lean": False}, lambda m, n: n <= 32768, ("bwd",)),
    # forward rows of 32768-65536 (bf16): in registers, x packed (the default since run 7), against
    # the same unpacked (spills) and the 32 KB-chunk stream (the default before)
    ("reg64k unpacked", {"max_block": 65536, "lean": False, "persist": 0}, lambda m, n: 32768 < n <= 65536,
     ("fwd",)),
    ("stream", {"lean": False, "coop": False, "lines": False}, lambda m, n: 32768 < n <= 65536, ("fwd",)),
    ("reg32k lean", {"lean": True, "persist": 0}, lambda m, n: 16384 < n <= 32768, ("fwd",)),
    # many rows: the register path's forward grid and the streaming grid
    ("one row per program", {"persist": 0}, lambda m, n: many(m, n) and 16384 < n <= 32768, ("fwd",)),
    ("persist2", {"persist": 2}, lambda m, n: many(m, n) and 16384 < n <= 32768, ("fwd",)),
    ("stream 32K pps2/16w", {"programs_per_sm": 2, "max_warps": 16, "lean": False, "coop": False, "lines": False},
     lambda m, n: many(m, n) and n > 32768,
     ("fwd",)),
    # many rows too wide for registers: the coop path (segments in registers of programs that wait
    # for each other; the GPU's default in the backward, off in the forward) against the stream,
    # other segments and warps
    ("stream (no coop)", {"coop": False, "lines": False}, lambda m, n: many(m, n) and n > 32768, ("fwd", "bwd")),
    ("coop", {"lean": False, "coop": True}, lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    ("coop seg 4096", {"lean": False, "coop": True, "coop_seg": 4096}, lambda m, n: many(m, n) and n > 32768,
     ("fwd", "bwd")),
    ("coop 8 warps", {"lean": False, "coop": True, "coop_warps": 8}, lambda m, n: many(m, n) and n > 32768,
     ("fwd", "bwd")),
    ("coop seg 1024", {"lean": False, "coop": True, "coop_seg": 1024}, lambda m, n: many(m, n) and n > 32768,
     ("fwd", "bwd")),
    # many rows too wide for registers, forward: the lines path (cross_entropy's row structure: per-line
    # max and sum of exp, both passes prefetched; the default since run 9) at its defaults (16 KB
    # chunks of 8 warps, one program a row, for rows up to 128 KB; 64 KB of 32 warps, 1 per SM, wider)
    # and other chunks and grids (chunk in elements, bf16), against the packed one-row register path
    # (the default at 32768 < N <= 65536 before run 9)
    ("reg64k lean", {"lean": True}, lambda m, n: 32768 < n <= 65536, ("fwd",)),
    ("lines", {"lean": False, "coop": False, "lines": True}, lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    ("lines 32K pps1", {"lean": False, "coop": False, "lines": True, "chunk": 16384, "programs_per_sm": 1},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    ("lines 16K pps1", {"lean": False, "coop": False, "lines": True, "chunk": 8192, "programs_per_sm": 1},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    ("lines 16K pps2", {"lean": False, "coop": False, "lines": True, "chunk": 8192, "programs_per_sm": 2},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    ("lines 32K pps2", {"lean": False, "coop": False, "lines": True, "chunk": 16384, "programs_per_sm": 2},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    ("lines 8K pps3", {"lean": False, "coop": False, "lines": True, "chunk": 4096, "programs_per_sm": 3},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    ("lines 64K pps1 32w", {"lean": False, "coop": False, "lines": True, "chunk": 32768, "programs_per_sm": 1},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    ("lines rows", {"lean": False, "coop": False, "lines": True, "programs_per_sm": "rows"},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    # run 10: the wide rows' grid, as rms_norm (one program a row) and layer_norm (2 per SM) chose
    ("lines 2/SM", {"lean": False, "coop": False, "lines": True, "programs_per_sm": 2},
     lambda m, n: many(m, n) and n > 65536, ("fwd",)),
    # run 11: at 65536, the wide rows' launch one program a row (rms_norm's, layer_norm's and
    # fp8_quant's best at their widest rows)
    ("lines 64K 32w rows", {"lean": False, "coop": False, "lines": True, "chunk": 32768, "programs_per_sm": "rows"},
     lambda m, n: many(m, n) and 32768 < n <= 65536, ("fwd",)),
    ("lines 32K 16w rows", {"lean": False, "coop": False, "lines": True, "chunk": 16384, "programs_per_sm": "rows"},
     lambda m, n: many(m, n) and 32768 < n <= 65536, ("fwd",)),
    # run 12: 262144 wide (512 KB rows), fewer rows in flight than SMs, so that the rows pass 2
    # re-reads (one a program) fit in L2 (132 x 512 KB = 67 MB does not)
    ("lines 64K 32w 0.5/SM", {"lean": False, "coop": False, "lines": True, "chunk": 32768, "programs_per_sm": 0.5},
     lambda m, n: many(m, n) and n > 131072, ("fwd",)),
    ("lines 64K 32w 0.75/SM", {"lean": False, "coop": False, "lines": True, "chunk": 32768, "programs_per_sm": 0.75},
     lambda m, n: many(m, n) and n > 131072, ("fwd",)),
    ("lines 32K 16w 0.75/SM", {"lean": False, "coop": False, "lines": True, "chunk": 16384, "programs_per_sm": 0.75},
     lambda m, n: many(m, n) and n > 131072, ("fwd",)),
    # run 16: register caps on the coop backward (119 registers a thread uncapped: 4 programs of 4
    # warps per SM; 96: 5, 80: 6, with a little spill; sm_90 compile)
    ("coop cap 96", {"coop_maxnreg": 96}, lambda m, n: many(m, n) and n > 32768, ("bwd",)),
    ("coop cap 80", {"coop_maxnreg": 80}, lambda m, n: many(m, n) and n > 32768, ("bwd",)),
    # run 17: at 65537-131072 wide (segments of 4096 by default, 215 registers, 2 programs per SM)
    # segments of 2048 capped at 96 registers (5 programs per SM)
    ("coop seg 2048 cap 96", {"coop_seg": 2048, "coop_maxnreg": 96}, lambda m, n: many(m, n) and 65536 < n <= 131072,
     ("bwd",)),
    # run 19: the forward's coop kernel rewritten (exp(x - m_j) held in registers, exp2, no division
    # an element: 560 SASS instructions for 16 elements a thread against 760, 72 registers, 7
    # programs per SM); "coop" above is now that. Runs 19-20 also timed x held and exponentiated
    # again, and the segment as 16-byte lines with (max, sum) pairs reduced at once: both lost and
    # were removed (see softmax._FWD_COOP_FROM).
    ("coop seg 4096 8 warps", {"lean": False, "coop": True, "coop_seg": 4096, "coop_warps": 8},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    # run 21: the defaults since run 20 (the forward's coop path from 131073 wide; the backward's
    # segments of 4096 at 8 warps at 65537-131072 wide) against the earlier ones
    ("lines (no coop)", {"lean": False, "coop": False}, lambda m, n: many(m, n) and n > 131072, ("fwd",)),
    ("coop 4 warps", {"coop_warps": 4}, lambda m, n: many(m, n) and 65536 < n <= 131072, ("bwd",)),
    ("coop seg 4096 8w", {"coop_seg": 4096, "coop_warps": 8}, lambda m, n: many(m, n) and n > 32768, ("bwd",)),
    # run 23: register caps on the forward's coop kernel (72 registers uncapped, 7 programs per SM;
    # 64: 8, 16 bytes of stack; 56: 9, 56 bytes; sm_90 compile)
    ("coop cap 64", {"lean": False, "coop": True, "coop_maxnreg": 64}, lambda m, n: many(m, n) and n > 32768,
     ("fwd",)),
    ("coop cap 56", {"lean": False, "coop": True, "coop_maxnreg": 56}, lambda m, n: many(m, n) and n > 32768,
     ("fwd",)),
    # (run 25 timed the coop backward re-reading the row it finishes a step late from L2 instead of
    # holding it, "coop reload ...", as rms_norm's COOP_RELOAD: it lost and was removed, see
    # softmax._BWD_COOP_MAXNREG's note)
    # (run 24 timed the lines path software-pipelined by Triton, "pipe 2/3/4": it lost and was
    # removed, see softmax._LINES' note)
    # run 26: each coop step also prefetches into L2 the row 1 or 2 steps past the one it loads
    # (_utils.prefetch_l2: no registers, same occupancy)
    ("coop L2 ahead 1", {"lean": False, "coop": True, "coop_l2_ahead": 1}, lambda m, n: many(m, n) and n > 32768,
     ("fwd", "bwd")),
    ("coop L2 ahead 2", {"lean": False, "coop": True, "coop_l2_ahead": 2}, lambda m, n: many(m, n) and n > 32768,
     ("fwd", "bwd")),
    # run 27: the lines forward's pass 1 prefetching into L2 the chunk 1 or 2 past the one it loads
    ("lines L2 ahead 1", {"lean": False, "coop": False, "lines": True, "lines_l2_ahead": 1},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
    ("lines L2 ahead 2", {"lean": False, "coop": False, "lines": True, "lines_l2_ahead": 2},
     lambda m, n: many(m, n) and n > 32768, ("fwd",)),
]
# Few rows (the split path's A/B: 1 to 16 rows of the LLaMA-3 vocabulary, wider and narrower rows;
# 1 x 32000 and 1 x 16384 fit in registers: split=True against the register path), then the
# many-row shapes of the earlier runs.
FEW_SHAPES = [(1, 128256), (4, 128256), (16, 128256), (1, 262144), (8, 65536), (1, 32000), (1, 16384)]
MANY_SHAPES = [(4096, 32000), (4096, 4096), (32768, 4096), (65536, 2048), (2048, 65536), (2048, 128256),
               (1024, 262144),
               # run 13 (--only): the coop segments' width question, rows of whole 2048 segments
               # (126976, 131072) beside 128256, whose last is partial
               (2048, 126976), (2048, 131072),
               # run 15 (--only): the coop backward with half and twice the rows a group
               (1024, 65536), (4096, 65536)]
SHAPES = FEW_SHAPES + MANY_SHAPES
# torch.compile, fwd and bwd, most important first, as the deadline allows (it compiles per shape
# and mode: several seconds each). The many-row shapes it was timed on in runs 1-3 are not repeated.
COMPILE_SHAPES = [(1, 128256), (1, 262144), (1, 32000), (1, 16384)]
# --dry-run: each shape whose path the A/B reaches, as a small shape on the same path of the
# automatic rule (bf16: rows over 32768 elements do not fit in registers; <= 8 rows split): split
# with a masked last segment, whole segments, M = 8 at the rule's bound, more rows (stream), rows
# in registers (a 32768 and a 4096 block), a 2048-wide tile of several rows
DRY = {(1, 128256): (1, 70001), (4, 128256): (3, 40000), (16, 128256): (10, 40000), (1, 262144): (2, 65536),
       (8, 65536): (8, 33000), (1, 32000): (1, 20000), (1, 16384): (1, 4099), (4096, 32000): (9, 20000),
       (65536, 2048): (20, 2048), (2048, 65536): (9, 40000)}
DRY_COMPILE = [(1, 128256)]


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
        self.dry = dry
        self.device = "cpu" if dry else "cuda"
        self.flush = None if dry else torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        self.budget = timing.Budget(5, 25)
        self.default_ms = {}

    def case(self, m, n, mode, label, fn, want, seen=None, deadline=None):
        """Check fn() against want, then time it; one line, never raises. seen: launches -> label
        of the variants already run on this shape and mode."""
        head = f"{m}x{n} {mode} {label:22s}"
        deadline = deadline or DEADLINE_S
        if time.perf_counter() - T0 > deadline:
            print(f"{head} SKIPPED: past the {deadline} s deadline", flush=True)
            return
        try:
            if seen is not None:
                key = launches(fn)
                if key in seen:
                    print(f"{head} same launches as {seen[key]}", flush=True)
                    return
                seen[key] = label
            got = verify.as_tuple(fn())[0]
            err = verify.rel_error(got, want)
            if err > SPEC.tolerance[torch.bfloat16]:
                print(f"{head} FAIL error {err:.3g} > {SPEC.tolerance[torch.bfloat16]:.3g}", flush=True)
                return
            note = f"err {err:.1e}"
            if self.dry:
                print(f"{head} dry-run ok ({note})", flush=True)
                return
            ms = timing.time_cuda_graph(fn, self.budget, self.flush).median_ms
            if label == "default":
                self.default_ms[(m, n, mode)] = ms
            base = self.default_ms.get((m, n, mode))
            vs = f"x{base / ms:.3f} vs default" if base else ""
            gbps = SPEC.bytes_moved({"M": m, "N": n}, torch.bfloat16, mode) / ms / 1e6
            print(f"{head} {ms * 1e3:9.2f} us {gbps:6.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}%  {vs:18s} ({note})",
                  flush=True)
        except Exception as e:  # one failing case must not stop the others
            print(f"{head} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)

    def peer(self, m, n, mode, label, fn, x, dy64, want, deadline=None):
        """A provider's function (label: its name in the spec), called as the collector calls it."""
        try:
            reason = SPEC.provider(label).available(self.device)
            if reason:
                print(f"{m}x{n} {mode} {label:22s} skipped: {reason}", flush=True)
                return
            deadline = deadline or DEADLINE_S
            if time.perf_counter() - T0 > deadline:  # before build_call: its first call compiles
                print(f"{m}x{n} {mode} {label:22s} SKIPPED: past the {deadline} s deadline", flush=True)
                return
            call = verify.build_call(SPEC, fn, {"x": x.detach().clone()}, mode, (dy64,) if mode == "bwd" else ())
            self.case(m, n, mode, label, call, want, deadline=deadline)
        except Exception as e:
            print(f"{m}x{n} {mode} {label:22s} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)


def run_shape(run, shape):
    m, n = DRY[shape] if run.dry else shape
    x, dy64 = inputs(m, n, run.device, seed=m * n)
    for mode in ("fwd", "bwd"):
        want = reference(x, dy64, mode)
        y = softmax.softmax_forward(x)  # bwd: the saved output, as in training
        dy = dy64.to(torch.bfloat16)
        seen = {}
        for label, kw, applies, modes in VARIANTS:
            if applies(*shape) and mode in modes:
                if mode == "fwd":
                    fn = lambda kw=kw: softmax.softmax_forward(x, **kw)  # noqa: E731
                else:
                    bwd_kw = {k: v for k, v in kw.items() if k != "lines"}  # a forward-only option
                    fn = lambda kw=bwd_kw: softmax.softmax_backward(dy, y, **kw)  # noqa: E731
                run.case(m, n, mode, label, fn, want, seen)
        if shape[1] <= 65536:  # Liger refuses wider rows
            run.peer(m, n, mode, "liger", softmax.softmax_liger, x, dy64, want)
        del want, y, dy
    del x, dy64
    if not run.dry:
        torch.cuda.empty_cache()


def run_compile(run, shape):
    """torch.compile (dynamic=False, as the collector) of the eager softmax, fwd then bwd: one
    compiled function per shape (dynamo compiles the grad-mode graph on its first bwd call)."""
    m, n = DRY[shape] if run.dry else shape
    x, dy64 = inputs(m, n, run.device, seed=m * n)
    fn = compiled(softmax.softmax_eager)
    for mode in ("fwd",) if run.dry else ("fwd", "bwd"):  # a CPU compile of the backward takes long
        run.peer(m, n, mode, "compile", fn, x, dy64, reference(x, dy64, mode), deadline=COMPILE_DEADLINE_S)


def main():
    global DEADLINE_S
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU (TRITON_INTERPRET=1): small shapes, no timing")
    add_case_options(ap, DEADLINE_S, "2048x65536")
    args = ap.parse_args()
    DEADLINE_S = args.deadline
    dry = args.dry_run
    only = args.only
    run = Runner(dry)
    where = "dry run, CPU interpreter" if dry else torch.cuda.get_device_name()
    print(f"softmax A/B, bf16, {where}; split rule: <= {softmax._SPLIT_MAX_ROWS} rows too wide for registers, "
          f"seg {softmax._SPLIT_SEG}; % of {COPY_GBPS:.0f} GB/s copy", flush=True)
    for shape in FEW_SHAPES:
        if (not dry or shape in DRY) and (not only or shape in only):
            run_shape(run, shape)
    # torch.compile: a compile per shape and grad mode, all of the same eager function's code, so
    # dynamo's recompile limit (8) must not make it fall back to eager
    from torch import _dynamo  # (a bare "import torch._dynamo" here would make torch a local name)

    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(_dynamo.config, name):
            setattr(_dynamo.config, name, 64)
    for shape in [] if only else DRY_COMPILE if dry else COMPILE_SHAPES:
        run_compile(run, shape)
    for shape in MANY_SHAPES:
        if (not dry or shape in DRY) and (not only or shape in only):
            run_shape(run, shape)
    print(f"total {time.perf_counter() - T0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
