"""Where the noise of a short launch comes from: one capture timed again, or a fresh capture.

On the committed runs a row under 20 us disagrees with its own recheck (a fresh capture of a fresh
call, minutes later, same process) by 2.9% (median, H100) and 1.8% (H200), as much as it moves
from run to run (2.5%, 1.7%), while the median of its ~190 samples would, were they independent,
err by some 0.4%. So something fixed for one capture and drawn again at the next decides a short
call's time: where its buffers landed (L2 slices, DRAM pages, TLB reach after the flush), or the
flush's own after-effects. This times each case K times as one capture replayed (`same`) and as K
fresh captures of freshly cloned inputs (`fresh`), each with the collector's timing and each of
lab.flush_ab's flush variants, interleaved, and prints per case the spread of the K medians and
the within-timing error of one median.

    python -m lab.capture_spread --k 8 softmax:M=1,N=128256:fwd gelu:M=1,N=3072,approx=tanh:fwd+bwd

A case is OP:SHAPE:MODE (provider --provider, default triton). On the CPU it runs (the pipeline
only: plain clock, no flush).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

from lab.ab import parse_shape
from lab.flush_ab import VARIANTS, _Flush, spread


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.capture_spread", description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="OP:SHAPE:MODE, e.g. softmax:M=1,N=128256:fwd")
    ap.add_argument("--k", type=int, default=8, help="timings of each kind per case and flush variant")
    ap.add_argument("--provider", default="triton")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rep-ms", type=float, default=20.0)
    args = ap.parse_args(argv)
    if args.k < 2:
        ap.error("--k must be at least 2 (a spread needs two medians)")
    if unknown := set(args.variants.split(",")) - set(VARIANTS):
        ap.error(f"unknown variant(s) {sorted(unknown)}; valid: {', '.join(VARIANTS)}")
    cases = []
    for text in args.cases:
        parts = text.split(":")
        if len(parts) != 3:
            ap.error(f"bad case {text!r}: expected OP:SHAPE:MODE, e.g. softmax:M=1,N=128256:fwd")
        cases.append((parts[0], parse_shape(parts[1]), parts[2]))

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from kcollect import timing, verify
    from kcollect.registry import load
    from kcollect.spec import DTYPES

    budget = timing.Budget(warmup_ms=args.rep_ms / 4, rep_ms=args.rep_ms, min_reps=10)
    buffer = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda") if device == "cuda" else None

    def time_call(call, graph, variant):
        if device != "cuda":
            return timing.time_cpu(call, budget)
        return graph.time(budget, _Flush(buffer, variant))

    print(f"{'case':<44} {'flush':<6} {'kind':<6} {'median us':>10} {'spread of K':>12} {'one median':>11}")
    for op, dims, mode in cases:
        spec = load().get(op)
        dtype = DTYPES[args.dtype]
        inputs = spec.make_inputs(dims, dtype, device, seed=0)
        dys, want = verify.reference_answers(spec, inputs, mode, seed=1)
        fn = spec.provider(args.provider).fn

        def fresh():
            call = verify.build_call(spec, fn, verify.clone_inputs(inputs), mode, dys)
            err = verify.error_of(spec, call(), want, mode)
            if not err <= spec.tolerance[dtype]:
                raise SystemExit(f"{op} {dims} {mode}: fails its gate (error {err:.2e})")
            return call, (timing.Graph.capture(call) if device == "cuda" else None)

        kept = fresh()
        results = {(v, kind): [] for v in args.variants.split(",") for kind in ("same", "fresh")}
        for _ in range(args.k):  # interleaved, so that a drift moves every kind alike
            for variant in args.variants.split(","):
                results[(variant, "same")].append(time_call(*kept, variant))
                call, graph = fresh()
                try:
                    results[(variant, "fresh")].append(time_call(call, graph, variant))
                finally:
                    if graph is not None:
                        graph.close()
        label = f"{op} {','.join(f'{k}={v}' for k, v in dims.items())} {mode}"[:44]
        for (variant, kind), ts in results.items():
            medians = [t.median_ms for t in ts]
            # one median's own error, were its samples independent: 1.2533 sigma / sqrt(n), sigma from p20-p80
            own = statistics.median(math.log(t.p80_ms / t.p20_ms) / 1.683 * 1.2533 / math.sqrt(t.reps) for t in ts)
            print(f"{label:<44} {variant:<6} {kind:<6} {1000 * statistics.median(medians):>10.2f} "
                  f"{spread(medians):>11.2%} {own:>10.2%}", flush=True)
        if kept[1] is not None:
            kept[1].close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
