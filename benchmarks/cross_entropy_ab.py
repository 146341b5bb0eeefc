"""GPU A/B of cross_entropy's few-rows split path (rows cut into segments over a rows x S grid)
against the one-program-per-row path, torch eager and torch.compile, bf16, label smoothing 0.

Per (shape, mode, variant): check against the float64 reference first (FAIL lines are not timed),
then time exactly like the collector (CUDA graph replays, L2 flushed before each, Budget(5, 25)) and
print ms, GB/s (the spec's bytes_moved), % of the H200's measured copy and our default's time over
this one (x > 1: faster than the default). Calls go through autograd as the collector makes them
(verify.build_call): "fwd" under no_grad (need_grad=False), "fwd+bwd" the loss and its gradient
with an upstream gradient of 1 (the gradient is computed in the forward; backward's scale_ launch
returns at once). Variants whose launches (kernels, grids, constexprs, warps) equal an earlier
one's are named and not timed again. torch.compile runs last (a compile per shape and mode), on the
single-row shapes first.

    python benchmarks/cross_entropy_ab.py                               # GPU, < 75 s on an H200
    TRITON_INTERPRET=1 python benchmarks/cross_entropy_ab.py --dry-run  # CPU: tiny shapes, no timing
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
from kcollect.kernels import cross_entropy as ce  # noqa: E402

SPEC = ce.SPEC
DTYPE = torch.bfloat16
COPY_GBPS = 4250.0  # H200 copy (read + write), measured by the collector
MODES = ("fwd", "fwd+bwd")
DEADLINE_S = 68  # cases not started by then are skipped, so the script stays under 75 s
COMPILE_DEADLINE_S = 55  # a torch.compile case compiles for several seconds before it is timed

# Keywords of cross_entropy_forward. "default" is the public cross_entropy (the automatic rule:
# split for <= _SPLIT_MAX_ROWS rows of >= _SPLIT_MIN_ROW_BYTES, segments by split_segment).
VARIANTS = [
    ("default", None),
    ("split", {"split": True}),
    ("no split", {"split": False}),
    ("split seg 8192", {"split": True, "split_seg": 8192}),
    ("split seg 2048", {"split": True, "split_seg": 2048}),
    # run 2: the per-row path's grid for many rows (default: persistent, 1-2 programs per SM with a
    # gradient): one program a row (softmax's lines forward gained 2.5-4 points of copy so; n_valid
    # then counted once beforehand) and 2 per SM
    ("rows grid", {"programs": "rows"}),
    ("2/SM grid", {"programs": 264}),
    # run 3: at 4096x256000 (512 KB rows) fewer rows in flight than SMs (132 x 512 KB = 67 MB, more
    # than the L2, which pass 2 re-reads from)
    ("66 programs", {"programs": 66}),
    ("100 programs", {"programs": 100}),
    # run 5: pass 1 also prefetches into L2 the chunk 1 or 2 past the one it loads (_utils.prefetch_l2)
    ("L2 ahead 1", {"l2_ahead": 1}),
    ("L2 ahead 2", {"l2_ahead": 2}),
    # run 6: further ahead
    ("L2 ahead 3", {"l2_ahead": 3}),
    ("L2 ahead 4", {"l2_ahead": 4}),
]
# (tokens, vocab), most important first: the decode / RL sampling case, a few rows, rows above
# the provisional threshold, a narrower and a wider vocabulary, and a batch the split never takes.
SHAPES = [(1, 128256), (4, 128256), (16, 128256), (1, 32000), (1, 256000), (64, 128256), (8192, 128256),
          (4096, 256000), (8192, 32000)]
COMPILE_SHAPES = [(1, 128256), (4, 128256), (1, 256000), (1, 32000)]  # as the deadline allows
# --dry-run: small shapes on the same paths of the automatic rule (rows <= 8 and > 64 KB: split;
# 16 and 64 rows: not; 1 x 32000 bf16 is 64000 B: not) and every variant's kernels
DRY = {(1, 128256): (1, 40000), (4, 128256): (3, 40000), (16, 128256): (10, 33000),
       (1, 32000): (1, 20000), (1, 256000): (1, 70001), (64, 128256): (12, 20000), (8192, 128256): (70, 5003),
       (4096, 256000): (9, 20000), (8192, 32000): (70, 1000)}
DRY_COMPILE = [(1, 128256)]


def ours(kw):
    """cross_entropy with the A/B's keywords: the public function's code with split / split_seg
    passed on (its signature has no such options)."""
    if kw is None:
        return ce.cross_entropy

    def fn(logits, target, ignore_index=ce.IGNORE_INDEX, label_smoothing=0.0):
        need_grad = torch.is_grad_enabled() and logits.requires_grad
        return ce.CrossEntropyFunction.apply(logits, target, ignore_index, float(label_smoothing), need_grad,
                                             kw.get("split"), kw.get("split_seg"), kw.get("programs"),
                                             kw.get("l2_ahead"))
    return fn


class Runner:
    def __init__(self, dry: bool):
        self.dry = dry
        self.device = "cpu" if dry else "cuda"
        self.flush = None if dry else torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        self.budget = timing.Budget(5, 25)
        self.default_ms = {}

    def case(self, dims, mode, label, fn, inputs, dys, want, deadline=None, seen=None):
        """Check fn (called as the collector calls a provider) against want, then time it; one
        line, never raises."""
        head = f"{dims['tokens']}x{dims['vocab']} {mode:7s} {label:16s}"
        deadline = deadline or DEADLINE_S
        if time.perf_counter() - T0 > deadline:
            print(f"{head} SKIPPED: past the {deadline} s deadline", flush=True)
            return
        try:
            call = verify.build_call(SPEC, fn, verify.clone_inputs(inputs), mode, dys)
            if seen is not None:
                key = launches(call)
                if key in seen:
                    print(f"{head} same launches as {seen[key]}", flush=True)
                    return
                seen[key] = label
            err = verify.max_error(call(), want)
            tol = SPEC.tolerance[DTYPE]
            if not err <= tol:
                print(f"{head} FAIL error {err:.3g} > {tol:.3g}", flush=True)
                return
            if self.dry:
                print(f"{head} dry-run ok (error {err:.1e})", flush=True)
                return
            ms = timing.time_cuda_graph(call, self.budget, self.flush).median_ms
            key = (dims["tokens"], dims["vocab"], mode)
            if label == "default":
                self.default_ms[key] = ms
            gbps = SPEC.bytes_moved(dims, DTYPE, mode) / ms / 1e6
            vs = f"x{self.default_ms[key] / ms:.3f} vs default" if key in self.default_ms else ""
            print(f"{head} {ms * 1e3:8.2f} us {gbps:6.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}% of copy  {vs}"
                  f"  (error {err:.1e})", flush=True)
        except Exception as e:  # one failing case must not stop the others
            print(f"{head} ERROR {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", flush=True)


def setup(m, n, mode, device):
    """(dims, inputs, upstream gradients, float64 answers): the spec's inputs (about 10% of rows
    ignored, row 0 never), on the device."""
    dims = {"tokens": m, "vocab": n, "smoothing": "0"}
    inputs = SPEC.make_inputs(dims, DTYPE, device, seed=m * n)
    dys, want = verify.reference_answers(SPEC, inputs, mode, seed=1)
    return dims, inputs, dys, want


def main():
    global DEADLINE_S
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU (TRITON_INTERPRET=1): small shapes, checks only")
    add_case_options(ap, DEADLINE_S, "8192x128256 (tokens x vocab)")
    args = ap.parse_args()
    dry = args.dry_run
    DEADLINE_S = args.deadline
    only = args.only
    run = Runner(dry)
    where = "dry run, CPU interpreter" if dry else torch.cuda.get_device_name()
    print(f"cross_entropy A/B, bf16, {where}; split rule: <= {ce._SPLIT_MAX_ROWS} rows, >= "
          f"{ce._SPLIT_MIN_ROW_BYTES} B per row, seg {ce._SPLIT_SEG} (more than {ce._SPLIT_SEG_ROWS} rows: "
          f"{ce._SPLIT_SEG_WIDE}); % of {COPY_GBPS:.0f} GB/s copy", flush=True)
    for shape in SHAPES:
        if only and shape not in only:
            continue
        m, n = DRY[shape] if dry else shape
        for mode in MODES:
            try:
                dims, inputs, dys, want = setup(m, n, mode, run.device)
            except Exception as e:
                print(f"{m}x{n} {mode}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            seen = {}
            for label, kw in VARIANTS:
                run.case(dims, mode, label, ours(kw), inputs, dys, want, seen=seen)
            run.case(dims, mode, "torch eager", SPEC.provider("torch").fn, inputs, dys, want)
            del inputs, dys, want
        if not dry:
            torch.cuda.empty_cache()
    # torch.compile last: a compile per shape and mode (dynamic=False, as the collector)
    from torch import _dynamo  # (a bare "import torch._dynamo" here would make torch a local name)

    for name in ("cache_size_limit", "recompile_limit"):  # more graphs than dynamo's default 8
        if hasattr(_dynamo.config, name):
            setattr(_dynamo.config, name, 64)
    for shape in [] if only else (DRY_COMPILE if dry else COMPILE_SHAPES):
        m, n = DRY[shape] if dry else shape
        for mode in (("fwd",) if dry else MODES):  # a CPU compile of the backward takes long
            dims, inputs, dys, want = setup(m, n, mode, run.device)
            run.case(dims, mode, "torch.compile", SPEC.provider("compile").fn, inputs, dys, want,
                     deadline=COMPILE_DEADLINE_S)
    print(f"total {time.perf_counter() - T0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
