"""Does running the bwd mode's forward on a side stream (collector/verify.py, the capture fix) change
what the collector times? (GPU only, ~30 s on an H200.)

The question it answers: whether the collector's time of a backward depends on the stream its
forward ran on. It did not; what moved the time was where the default CUDA allocator put the
tensors after the float64 reference, which is why `kcollect run` uses expandable segments
(collector/common.py, ALLOC_CONF).

    python benchmarks/stream_check.py
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
