"""GPU A/B of rope's launch options (kernels/rope.py: rope_apply's keywords) against the default and
the peers (Liger, torch.compile), bf16, at the full-grid shapes where a peer was ahead.

Inputs are rope.make_inputs' (the collector's: HF's transposed [B, T, H, D] q/k, cos/sin [B or 1,
T, D]); the backward's upstream gradients are contiguous [B, H, T, D], as the collector's bwd mode
passes them. Per (shape, mode, variant): check against the float64 reference first (FAIL lines are
not timed), then time exactly like the collector (CUDA graph replays, L2 flushed before each,
timing.Budget(5, 25)) and print us, GB/s (SPEC.bytes_moved), % of the H200's measured 4250 GB/s
copy and the default's time over this one (x > 1: faster than the default), with the launch
(ROWS x W tiles, NC rows a token, heads per thread for q/k, warps, grid). Variants whose launches
(kernel, grid, scalars, constexprs, warps) equal an earlier one's are named and not timed again.
fwd is rope_apply(q, k, cos, sin, **kw); bwd is rope_apply(dq, dk, cos, sin, backward=True, **kw),
then the collector's autograd call of the default (ours via autograd). Peers: Liger (where
importable), then torch.compile of the eager code for the first two shapes, fwd and bwd, last, as
the deadline allows (several seconds of compile each).

    python benchmarks/rope_ab.py                               # GPU, < 75 s on an H200
    python benchmarks/rope_ab.py --only x80x,8192              # GPU: only the shapes whose labels match
    TRITON_INTERPRET=1 python benchmarks/rope_ab.py --dry-run  # CPU: small shapes, checks only
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

from benchmarks.ab_tools import launches, lazy  # noqa: E402
from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import rope  # noqa: E402

SPEC = rope.SPEC
DTYPE = torch.bfloat16
COPY_GBPS = 4250.0  # H200 copy (read + write), measured by the collector
DEADLINE_S = 68  # cases not started by then are skipped, so the script stays under 75 s
COMPILE_DEADLINE_S = 50  # a torch.compile case compiles for several seconds before it is timed


def _dims(b, hq, hk, t, d, pos):
    return {"B": b, "Hq": hq, "Hk": hk, "T": t, "D": d, "pos": pos}


def half_not_pow2(dims):
    half = dims["D"] // 2
    return half & (half - 1) != 0


def always(dims):
    return True


# (label, keywords of rope_apply, applies to the shape's dims, modes). Defaults: 4 warps, up to 4
# heads per thread, BT from the warps, no cache hints, the "half" layout.
VARIANTS = [
    ("default", {}, always, ("fwd", "bwd")),
    ("warps 2", {"num_warps": 2}, always, ("fwd", "bwd")),
    ("warps 8", {"num_warps": 8}, always, ("fwd", "bwd")),
    ("max_hb 1", {"max_hb": 1}, always, ("fwd", "bwd")),
    ("max_hb 2", {"max_hb": 2}, always, ("fwd", "bwd")),
    ("max_hb 8", {"max_hb": 8}, always, ("fwd", "bwd")),
    ("qk evict_first", {"policy": "evict_first"}, always, ("fwd", "bwd")),
    ("qk evict_last", {"policy": "evict_last"}, always, ("fwd", "bwd")),
    ("cs evict_last", {"cs_policy": "evict_last"}, always, ("fwd", "bwd")),
    ("qk evict_first cs evict_last", {"policy": "evict_first", "cs_policy": "evict_last"}, always, ("fwd", "bwd")),
    # combos: more loads in flight per SM at the same registers per thread (compile report)
    ("warps 8 max_hb 2", {"num_warps": 8, "max_hb": 2}, always, ("fwd", "bwd")),
    ("warps 2 max_hb 8", {"num_warps": 2, "max_hb": 8}, always, ("fwd", "bwd")),
    ("max_hb 8 cs evict_last", {"max_hb": 8, "cs_policy": "evict_last"}, always, ("fwd", "bwd")),
    # a half that is not a power of two (D = 80: 40 of 64 lanes): W-wide chunks, no padding
    ("chunks", {"layout": "chunks"}, half_not_pow2, ("fwd", "bwd")),
    ("chunks warps 8", {"layout": "chunks", "num_warps": 8}, half_not_pow2, ("fwd", "bwd")),
    ("chunks max_hb 2", {"layout": "chunks", "max_hb": 2}, half_not_pow2, ("fwd", "bwd")),
    ("chunks max_hb 8", {"layout": "chunks", "max_hb": 8}, half_not_pow2, ("fwd", "bwd")),
    ("chunks cs evict_last", {"layout": "chunks", "cs_policy": "evict_last"}, half_not_pow2, ("fwd", "bwd")),
    # run 2, at the shapes where Liger stayed ahead (3x32x32x1000x80, 8x14x2x2048x64): the chunks
    # layout and fewer heads per thread together, now that cs evict_last is the default
    ("chunks max_hb 2 warps 8", {"layout": "chunks", "max_hb": 2, "num_warps": 8}, half_not_pow2, ("fwd", "bwd")),
    ("chunks max_hb 1", {"layout": "chunks", "max_hb": 1}, half_not_pow2, ("fwd", "bwd")),
    ("max_hb 2 warps 2", {"max_hb": 2, "num_warps": 2}, always, ("fwd", "bwd")),
    ("max_hb 1 warps 8", {"max_hb": 1, "num_warps": 8}, always, ("fwd", "bwd")),
    # run 3: the default launch writing over its inputs as Liger does (on private copies): whether
    # Liger's lead at the small shapes is the in-place footprint (half the L2 lines) or the kernel
    ("in place (Liger's semantics)", {"inplace": True}, always, ("fwd", "bwd")),
    # run 4: the defaults before run 4 (4 heads per thread everywhere), and 2 heads at 4 warps
    # (run 4's default had 8 warps for D = 80: since run 4, 4 warps and 2 heads but at D >= 256)
    ("before run 3 (max_hb 4 warps 4)", {"max_hb": 4, "num_warps": 4}, always, ("fwd", "bwd")),
    ("max_hb 2 warps 4", {"max_hb": 2, "num_warps": 4}, always, ("fwd", "bwd")),
]

# The full-grid shapes where Liger or torch.compile was ahead (H200, CUDA graphs, bf16)
SHAPES = [
    _dims(2, 64, 8, 8192, 128, "ids"),
    _dims(4, 32, 8, 4096, 128, "ids"),
    _dims(1, 28, 4, 32768, 128, "ids"),
    _dims(3, 32, 32, 1000, 80, "ids"),
    _dims(8, 14, 2, 2048, 64, "ids"),
    _dims(4, 8, 1, 4096, 256, "shared"),
]
COMPILE_SHAPES = SHAPES[:2]
# --dry-run: the same head_dim and positions, a few tokens (T not a multiple of any token block),
# head counts that give the same heads per thread (and odd ones where the shape has them)
DRY = [
    _dims(2, 16, 8, 9, 128, "ids"),
    _dims(3, 32, 8, 5, 128, "ids"),
    _dims(1, 28, 4, 37, 128, "ids"),
    _dims(3, 8, 8, 11, 80, "ids"),
    _dims(3, 14, 2, 13, 64, "ids"),
    _dims(2, 8, 1, 7, 256, "shared"),
]


def label_of(dims) -> str:
    return "x".join(str(dims[k]) for k in ("B", "Hq", "Hk", "T", "D", "pos"))


def grad_outputs(inp, device, seed):
    """Upstream gradients in float64, contiguous [B, H, T, D] like the collector's, drawn on the
    device (a CPU draw of 134M float64 values takes seconds)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(inp[n].shape, generator=g, device=device, dtype=torch.float64) for n in ("q", "k"))


def reference(inp, dys, mode):
    x64 = verify.upcast(inp)
    if mode == "fwd":
        with torch.no_grad():
            return SPEC.reference(**x64)
    leaves = [x64[n].requires_grad_(True) for n in ("q", "k")]
    return torch.autograd.grad(SPEC.reference(**x64), leaves, dys)


def describe(key) -> str:
    """The launch in short: tile ROWS x W, NC rows a token, q/k heads per thread, warps, grid."""
    if len(key) != 1:
        return f"{len(key)} launches"
    _, grid, _, kw = key[0]
    kw = dict(kw)
    return (f"[R{kw['ROWS']} W{kw['W']} nc{kw['NC']} hb{kw['HBQ']}/{kw['HBK']} w{kw['num_warps']} "
            f"grid {grid[0]}]")


class Runner:
    def __init__(self, dry: bool):
        self.dry = dry
        self.device = "cpu" if dry else "cuda"
        self.flush = None if dry else torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        self.budget = timing.Budget(5, 25)
        self.default_ms = {}

    def case(self, dims, mode, label, fn, want, seen=None, deadline=DEADLINE_S):
        """Check fn() against want, then time it; one line, never raises. seen: launches -> label
        of the variants already run on this shape and mode (ours only)."""
        head = f"{label_of(dims)} {mode} {label:30s}"
        if time.perf_counter() - T0 > deadline:
            print(f"{head} SKIPPED: past the {deadline} s deadline", flush=True)
            return
        try:
            launch = ""
            if seen is not None:
                key = launches(fn)
                if key in seen:
                    print(f"{head} same launch as {seen[key]}", flush=True)
                    return
                seen[key] = label
                launch = describe(key)
            with torch.no_grad() if mode == "fwd" else contextlib.nullcontext():
                err = verify.max_error(verify.as_tuple(fn()), want)
                tol = SPEC.tolerance[DTYPE]
                if not err <= tol:
                    print(f"{head} FAIL error {err:.3g} > {tol:.3g} {launch}", flush=True)
                    return
                if self.dry:
                    print(f"{head} dry-run ok (err {err:.1e}) {launch}", flush=True)
                    return
                ms = timing.time_cuda_graph(fn, self.budget, self.flush).median_ms
            key = (label_of(dims), mode)
            if label == "default":
                self.default_ms[key] = ms
            base = self.default_ms.get(key)
            vs = f"x{base / ms:.3f} vs default" if base else ""
            gbps = SPEC.bytes_moved(dims, DTYPE, mode) / ms / 1e6
            print(f"{head} {ms * 1e3:8.1f} us {gbps:6.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}%  {vs:18s} "
                  f"{launch} (err {err:.1e})", flush=True)
        except Exception as e:  # one failing case must not stop the others
            print(f"{head} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)

    def peer(self, dims, mode, label, fn, inp, dys, want, deadline=DEADLINE_S):
        """A provider's function (label: its name in the spec, or ours via autograd), called as the
        collector calls it, on a private copy of the inputs (Liger rotates in place)."""
        name = label if label in SPEC.provider_names else "triton"
        reason = SPEC.provider(name).available(self.device)
        if reason:
            print(f"{label_of(dims)} {mode} {label:30s} skipped: {reason}", flush=True)
            return
        if time.perf_counter() - T0 > deadline:  # before the first call: a compile peer compiles then
            print(f"{label_of(dims)} {mode} {label:30s} SKIPPED: past the {deadline} s deadline", flush=True)
            return
        call = lazy(lambda: verify.build_call(SPEC, fn, verify.clone_inputs(inp), mode, dys))
        self.case(dims, mode, label, call, want, deadline=deadline)


def run_shape(run, dims, seed):
    inp = SPEC.make_inputs(dims, DTYPE, run.device, seed)
    q, k, cos, sin = inp["q"], inp["k"], inp["cos"], inp["sin"]
    dys = grad_outputs(inp, run.device, seed + 1)
    for mode in ("fwd", "bwd"):
        want = reference(inp, dys, mode)
        dq, dk = (dy.to(DTYPE) for dy in dys)
        seen = {}
        for label, kw, applies, modes in VARIANTS:
            if not applies(dims) or mode not in modes:
                continue
            a, b = (q, k) if mode == "fwd" else (dq, dk)
            if kw.get("inplace"):  # private copies (the same strides): the others' inputs stay intact
                a, b = a.clone(), b.clone()
            fn = lambda kw=kw, a=a, b=b, bwd=mode == "bwd": rope.rope_apply(a, b, cos, sin, backward=bwd, **kw)  # noqa: E731
            # the in-place launch equals the default's but for its pointers: timed, not deduplicated
            run.case(dims, mode, label, fn, want, None if kw.get("inplace") else seen)
        if mode == "bwd":
            run.peer(dims, mode, "ours via autograd (collector)", rope.rope, inp, dys, want)
        run.peer(dims, mode, "liger", rope.rope_liger, inp, dys, want)
        del want, dq, dk
    del inp, q, k, cos, sin, dys
    if not run.dry:
        torch.cuda.empty_cache()


def run_compile(run, dims, seed):
    """torch.compile (dynamic=False, as the collector) of the eager code, fwd then bwd."""
    inp = SPEC.make_inputs(dims, DTYPE, run.device, seed)
    dys = grad_outputs(inp, run.device, seed + 1)
    fn = SPEC.provider("compile").fn
    for mode in ("fwd", "bwd"):
        run.peer(dims, mode, "compile", fn, inp, dys, reference(inp, dys, mode), deadline=COMPILE_DEADLINE_S)
    del inp, dys
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU (TRITON_INTERPRET=1): small shapes, checks only")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile peer")
    ap.add_argument("--only", default="", help="comma-separated substrings of the shape labels (BxHqxHkxTxDxpos, "
                    "e.g. x80x,8192): only those shapes (a full run JIT-compiles about 120 variant binaries "
                    "first, so that the deadline may cut the last shapes and the compile peer)")
    args = ap.parse_args()

    def wanted(dims):
        return not args.only or any(o in label_of(dims) for o in args.only.split(","))
    run = Runner(args.dry_run)
    where = "dry run, CPU interpreter" if args.dry_run else torch.cuda.get_device_name()
    print(f"rope A/B, bf16, {where}; shape = BxHqxHkxTxDxpos; % of {COPY_GBPS:.0f} GB/s copy; "
          f"launch [R rows x W lanes, nc rows a token, heads per thread q/k, warps, grid]", flush=True)
    for i, dims in enumerate(DRY if args.dry_run else SHAPES):
        if wanted(dims):
            run_shape(run, dims, seed=i)
    # torch.compile: not on the CPU (inductor's CPU compile is slow and says nothing of the GPU);
    # a compile per shape and grad mode of the same eager code: raise dynamo's recompile limit (8)
    if not (args.dry_run or args.no_compile):
        from torch import _dynamo  # (a bare "import torch._dynamo" here would make torch a local name)

        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(_dynamo.config, name):
                setattr(_dynamo.config, name, 64)
        for i, dims in enumerate(COMPILE_SHAPES):
            if wanted(dims):
                run_compile(run, dims, seed=i)
    print(f"total {time.perf_counter() - T0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
