"""Does running the bwd mode's forward on a side stream (collector/verify.py, the capture fix) change
what the collector times? (GPU only, ~30 s on an H200.)

In this session's collector runs our swiglu and geglu backwards at 16384x14336 / 16384x16384
measured ~10% slower than in the previous session's (610 against 549 us), with the same SASS and
launch, while the peers' times did not move. This times the collector's bwd and fwd+bwd calls of
swiglu at that shape with the forward on the side stream (today) and on the default stream (as
before), both as CUDA-graph replays; the first capture of a process is made on a throwaway case.

    python benchmarks/stream_check.py

Run 1 (docs/evidence/stream_check_h200_run1.txt): no difference (swiglu bwd 16384x14336, ours
548.3 us with the forward on the side stream, 547.9 on the default stream; torch.compile 548.2),
yet the collector's run 737d6f99 on the same machine minutes later measured ours at 609.6 us and
compile at 547.6, also with our provider alone in the run (docs/evidence/
swiglu_collector_check_h200.txt). So the slowdown comes from the collector's context, not from the
stream, the kernel (same SASS and launch as the previous session's, whose runs measured 549 us) or
the other providers; what differs from this script is the float64 reference computed first and the
run's random seed. We have not found which of them it is.

Found since (benchmarks/swiglu_context_check.py, docs/evidence/swiglu_context_check_h200_run*.txt):
the reference's allocations, through where the default CUDA allocator then put our tensors
(carving the same five tensors out of one buffer at any spacing, benchmarks/placement_check.py,
always gave 547-551 us). With expandable segments, which `kcollect run` now uses, 548 us in every
order, and the collector's run 251998cb timed ours at 549 us against torch.compile's 548.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import get  # noqa: E402


def main():
    spec = get("swiglu")
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    budget = timing.Budget(5, 25)
    side_stream_forward = verify._forward_off_the_legacy_stream

    def default_stream_forward(fn, inputs):
        return verify.as_tuple(fn(**inputs))

    for m, n in ((2, 4096), (16384, 14336), (8192, 14336)):
        inputs = spec.make_inputs({"M": m, "N": n}, torch.bfloat16, "cuda", 0)
        for provider in ("triton", "compile"):
            for mode in ("bwd", "fwd+bwd"):
                dys, _ = verify.reference_answers(spec, inputs, mode, 1) if m * n < 1 << 26 else (None, None)
                if dys is None:  # the float64 reference of the big shape is not needed for timing
                    dys = tuple(torch.randn(m, n, device="cuda", dtype=torch.float64) for _ in range(1))
                for label, forward in (("side stream", side_stream_forward), ("default stream", default_stream_forward)):
                    verify._forward_off_the_legacy_stream = forward
                    try:
                        call = verify.build_call(spec, spec.provider(provider).fn, verify.clone_inputs(inputs), mode, dys)
                        call()
                        t = timing.time_cuda_graph(call, budget, flush)
                        print(f"swiglu {mode:7s} {m}x{n} {provider:8s} forward on the {label:14s} {t.median_ms * 1000:8.1f} us",
                              flush=True)
                    except Exception as e:
                        print(f"swiglu {mode:7s} {m}x{n} {provider:8s} forward on the {label:14s} ERROR {str(e)[:100]}",
                              flush=True)
                    finally:
                        verify._forward_off_the_legacy_stream = side_stream_forward
                        call = None
                        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
