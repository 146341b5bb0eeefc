"""What the backward's accuracy fixes of issue 40 cost and buy on a GPU.

The training forward keeps o's rounding for the backward's delta (an int8 code of o's shape, see
kernels/attention/bwd.py), the dq kernel shifts dq by a key of the row (BwdConfig.dq_shift: one
more row sum of dS a key block), and rows whose probability is all on one key give dk no dS from
it (BwdConfig.one_key: a compare and select per element a block in both kernels). Four variants:
`off` (none: the code before), `residual` (o's rounding kept), `shift` (and dq shifted) and `on`
(all three, what attention() does). This
times fwd+bwd of each interleaved on one GPU (the collector's CUDA-graph timing, L2 flushed),
shape by shape, then re-checks the attention cases the awkward sweeps listed over the gate with
each (the lab's verdict: errors against float64, gate 2x eager's):

    python -m lab.attention_delta_ab --out $OUT          # about 7-10 minutes on an H100/H200
    python -m lab.attention_delta_ab --out $OUT --shapes causal4k,gqa4k,d64s512 --minutes 6  # within 8
    python -m lab.attention_delta_ab --out $OUT --shapes causal4k,gqa4k --minutes 0 --tma  # TMA builds
    python -m lab.attention_delta_ab --device cpu --shapes tiny --rounds 1   # a dry run

Prints a table per part and writes it to OUT/attention_delta_ab.txt.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

from kcollect.common import ALLOC_CONF

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # as `kcollect run` does, before CUDA starts

SHAPES = {  # B, Hq, Hkv, S, D, causal: the shapes the reverted version was timed at, GQA and D 64
    "s512": (32, 16, 16, 512, 128, 1),
    "s1k_full": (16, 16, 16, 1024, 128, 0),
    "causal4k": (4, 16, 16, 4096, 128, 1),
    "gqa4k": (4, 32, 8, 4096, 128, 1),
    "d64s512": (32, 32, 32, 512, 64, 1),
    "tiny": (1, 2, 1, 24, 64, 1),  # the CPU dry run's
    # a ladder of sizes, from launch-bound to compute-bound: where do the measures start to cost?
    "b1s128": (1, 1, 1, 128, 64, 0),
    "b2h4s128": (2, 4, 4, 128, 64, 0),
    "b1h8s512": (1, 8, 8, 512, 64, 1),
    "b4h8s512": (4, 8, 8, 512, 64, 1),
    "b1h16s1k": (1, 16, 16, 1024, 128, 1),
    "b4h16s1k": (4, 16, 16, 1024, 128, 1),
    "b4h16s2k": (4, 16, 16, 2048, 128, 1),
}
CASE_FILES = ("lab/results/awkward_cpu_seed1129_528b9e4.txt", "lab/results/awkward_h200_attention_scans_b8e243f.txt",
              "lab/results/awkward_h200_attention_scans_bcd216a.txt",
              "lab/results/awkward_h200_attention_scans_ff8635d.txt", "lab/results/awkward_h200_8985dda.txt",
              "lab/results/awkward_cpu_attention_seed4063_d6c9e33.txt",
              "lab/results/awkward_h200_attention_bbc84b9.txt")


# (o's rounding kept, dq_shift, one_key)
VARIANTS = {"off": (False, False, False), "residual": (True, False, False), "shift": (True, True, False),
            "on": (True, True, True)}


def attention_with(variant: str):
    """spec.triton_attention as a variant: o's rounding kept or not, and the picked backward config
    with dq_shift and one_key on or off (still a pick: it falls back where the inputs or the device need)."""
    import dataclasses

    import kcollect.kernels.attention as attention

    residual, shift, one_key = VARIANTS[variant]
    accurate = attention.accurate_bwd

    def accurate_bwd(config):
        return dataclasses.replace(config, dq_shift=shift, one_key=one_key)

    def call(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
        attention.accurate_bwd = accurate_bwd  # the autograd function sets the backward's config at the forward
        try:
            return attention.AttentionFunction.apply(q, k, v, causal, window, cu_seqlens_q, cu_seqlens_k,
                                                     max_seqlen_q, max_seqlen_k, None, None, residual)
        finally:
            attention.accurate_bwd = accurate

    return call


@contextlib.contextmanager
def with_tma():
    """attention()'s picks with TMA, inside (each still falls back where the tensors are not aligned)."""
    import dataclasses

    import kcollect.kernels.attention as attention

    fwd_pick, bwd_pick = attention.pick_fwd, attention.pick_bwd
    with mock.patch.object(attention, "pick_fwd", lambda *a, **k: dataclasses.replace(fwd_pick(*a, **k), tma=True)), \
            mock.patch.object(attention, "pick_bwd", lambda *a, **k: dataclasses.replace(bwd_pick(*a, **k), tma=True)):
        yield


def timing_part(names, device, rounds, rep_ms, say) -> None:
    import torch

    from kcollect import timing, verify
    from kcollect.kernels.attention.spec import SPEC

    from .ab import interleaved, ratio_band

    budget = timing.Budget(warmup_ms=rep_ms / 4, rep_ms=rep_ms, min_reps=10)
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device=device) if device == "cuda" else None
    say(f"fwd+bwd bf16, {rounds} interleaved rounds; ms: the median of the rounds' medians; each variant's ratio to "
        f"off: median [min, max] of the rounds'")
    for name in names:
        b, hq, hkv, s, d, causal = SHAPES[name]
        dims = {"B": b, "Hq": hq, "Hkv": hkv, "Sq": s, "Skv": s, "D": d, "causal": causal, "window": 0, "varlen": 0}
        inputs = SPEC.make_inputs(dims, torch.bfloat16, device, 0)
        dy = (torch.randn(b, s, hq, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device),)
        calls = {v: verify.build_call(SPEC, attention_with(v), inputs, "fwd+bwd", dy) for v in VARIANTS}
        for call in calls.values():
            call()  # compile outside the timing
        timed = interleaved(calls, rounds, lambda call: timing.time_cpu(call, budget) if device != "cuda"
                            else timing.time_cuda_graph(call, budget, flush))
        out = {v: [t.median_ms for t in ts] for v, ts in timed.items()}
        line = f"{name:10s} {dims}  off {statistics.median(out['off']):.4f} ms"
        for v in list(VARIANTS)[1:]:
            mid, lo, hi = ratio_band(out["off"], out[v])
            line += f"  {v} {statistics.median(out[v]):.4f} ms ({mid:.4f} [{lo:.4f}, {hi:.4f}])"
        say(line)
        del inputs, calls
        if device == "cuda":
            torch.cuda.empty_cache()


def accuracy_part(device, deadline, say, case_files=CASE_FILES) -> None:
    from kcollect.kernels.attention import spec

    from .awkward import attention as family, sweep

    cases, seen = [], set()
    for f in case_files:
        for c in sweep.worst_cases(Path(f)):
            if c.get("op") == "attention" and c["seed"] not in seen:
                seen.add(c["seed"])
                cases.append(c)
    say(f"{len(cases)} attention cases the sweeps listed; per case: status {' -> '.join(VARIANTS)}, then dq dk dv "
        f"ours/eager")
    original = spec.triton_attention
    try:
        for c in cases:
            if time.monotonic() > deadline:
                say("time is up: the remaining cases not run")
                break
            verdicts = {}
            for v in VARIANTS:
                spec.triton_attention = attention_with(v)
                verdicts[v] = family.check(c, device)
            parts = lambda r: " ".join(f"{p['name']} {p['ours']:.3g}/{p['eager']:.3g}"  # noqa: E731
                                       for p in r.get("parts", []) if p["name"] != "output 0")
            say(" -> ".join(verdicts[v]["status"] for v in VARIANTS) + f": {json.dumps(c)}"
                + "".join(f"\n    {v + ':':9s} {parts(verdicts[v])}" for v in VARIANTS))
    finally:
        spec.triton_attention = original


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.attention_delta_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".", help="folder for attention_delta_ab.txt")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the interpreter (a dry run)")
    ap.add_argument("--shapes", default="s512,s1k_full,causal4k,gqa4k,d64s512",
                    help=f"comma-separated, timed fwd+bwd (empty: none), of {', '.join(SHAPES)}")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the variants")
    ap.add_argument("--rep-ms", type=float, default=25.0, help="timed milliseconds per variant and round")
    ap.add_argument("--minutes", type=float, default=7.5, help="no accuracy case starts after this")
    ap.add_argument("--cases-from", default=",".join(CASE_FILES),
                    help="comma-separated sweep summaries whose listed attention cases are re-checked")
    ap.add_argument("--tma", action="store_true",
                    help="every variant with TMA builds of the picked configs")
    args = ap.parse_args(argv)
    names = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in names if s not in SHAPES]
    if args.tma and args.device == "cpu":
        print("python -m lab.attention_delta_ab: --tma needs a GPU (the interpreter has no TMA)", file=sys.stderr)
        return 2
    if unknown or args.rounds < 1:
        print(f"python -m lab.attention_delta_ab: unknown shapes {unknown} or --rounds < 1; valid shapes: "
              f"{', '.join(SHAPES)}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from kcollect.common import pin_ptxas

    pin_ptxas()
    deadline = time.monotonic() + 60 * args.minutes
    report = Path(args.out) / "attention_delta_ab.txt"
    report.parent.mkdir(parents=True, exist_ok=True)
    with report.open("w") as f:
        def say(line: str) -> None:
            print(line, flush=True)
            f.write(line + "\n")
            f.flush()

        with with_tma() if args.tma else contextlib.nullcontext():
            timing_part(names, args.device, args.rounds, args.rep_ms, say)
            accuracy_part(args.device, deadline, say, [f for f in args.cases_from.split(",") if f])
    return 0


if __name__ == "__main__":
    sys.exit(main())
