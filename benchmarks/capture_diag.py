"""Why does the first backward captured in a process fail? (GPU only, ~1 min on an H200.)

In every collector run the first backward case (rms_norm bwd 1x4096, or layer_norm's) fails its
CUDA-graph capture with "operation failed due to a previous error during capture" and is timed with
events; later backward cases capture fine. Each scenario below runs in a fresh process, replays the
collector's sequence for one case (float64 reference, correctness call, then timing.time_cuda_graph)
and prints whether the capture succeeded and with what error:

    python benchmarks/capture_diag.py
"""
from __future__ import annotations

import subprocess
import sys
import time
import warnings

SCENARIOS = {
    "collector order (fwd: triton, torch, compile; then bwd triton)": "fwd_compile",
    "no torch.compile before": "plain",
    "compile before, then 15 s idle": "fwd_compile sleep",
    "compile before, thread_local capture mode": "fwd_compile thread_local",
    "compile before, sync debug warnings": "fwd_compile syncdebug",
}


def scenario(flags: list[str]) -> None:
    import torch

    from kcollect import timing, verify
    from kcollect.kernels import get

    if "thread_local" in flags or "relaxed" in flags:
        mode = "thread_local" if "thread_local" in flags else "relaxed"
        original = torch.cuda.graph.__init__

        def init(self, *args, **kwargs):
            kwargs["capture_error_mode"] = mode
            original(self, *args, **kwargs)

        torch.cuda.graph.__init__ = init
    if "syncdebug" in flags:
        torch.cuda.set_sync_debug_mode("warn")
        warnings.simplefilter("always")
    spec = get("rms_norm")
    shape = next(s for s in spec.grid("full") if s.label == "1x4096")
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    budget = timing.Budget(2, 5)
    inputs = spec.make_inputs(shape.dims, torch.bfloat16, "cuda", 0)
    if "fwd_compile" in flags:
        dys, _ = verify.reference_answers(spec, inputs, "fwd", 1)
        for name in ("triton", "torch", "compile"):
            call = verify.build_call(spec, spec.provider(name).fn, verify.clone_inputs(inputs), "fwd", dys)
            call()
            timing.time_cuda_graph(call, budget, flush)
    if "sleep" in flags:
        time.sleep(15)
    dys, _ = verify.reference_answers(spec, inputs, "bwd", 1)
    call = verify.build_call(spec, spec.provider("triton").fn, verify.clone_inputs(inputs), "bwd", dys)
    call()
    for attempt in (1, 2):
        try:
            t = timing.time_cuda_graph(call, budget, flush)
            print(f"  attempt {attempt}: captured, {t.median_ms * 1000:.1f} us", flush=True)
        except Exception as e:
            print(f"  attempt {attempt}: FAILED {str(e).splitlines()[0][:200]}", flush=True)
            torch.cuda.synchronize()


def main() -> None:
    if len(sys.argv) > 1:
        scenario(sys.argv[1:])
        return
    for label, flags in SCENARIOS.items():
        print(label, flush=True)
        out = subprocess.run([sys.executable, __file__, *flags.split()], capture_output=True, text=True, timeout=120)
        lines = (out.stdout + out.stderr).splitlines()
        keep = [ln for ln in lines if ln.startswith("  attempt") or "Warning" in ln or "Error" in ln]
        print("\n".join(keep[-12:]) or f"  (rc {out.returncode}) " + " | ".join(lines[-3:]), flush=True)


if __name__ == "__main__":
    main()
