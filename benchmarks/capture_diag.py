"""Why does the first backward captured in a process fail? (GPU only, ~1 min on an H200.)

In every collector run the first backward case (rms_norm bwd 1x4096, or layer_norm's) fails its
CUDA-graph capture with "operation failed due to a previous error during capture" and is timed with
events; later backward cases capture fine. Each scenario below runs in a fresh process, replays the
collector's sequence for one case (float64 reference, correctness call, then timing.time_cuda_graph)
and prints whether the capture succeeded and with what error. The cause it found: autograd runs a backward op on the stream its forward ran
on, and the bwd mode's forward ran on the default (legacy) stream ("operation would make the legacy
stream depend on a capturing blocking stream"); with the forward on a side stream both captures
succeed. verify.build_call now does that.

    python benchmarks/capture_diag.py
"""
from __future__ import annotations

import contextlib
import subprocess
import sys

SCENARIOS = {
    "baseline (run 1: fails whether or not torch.compile ran before, also in thread_local mode)": "",
    "relaxed capture mode": "relaxed",
    "sync debug mode 'error' during the capture": "syncerror",
    "a fresh call (new forward) after the failure": "fresh",
    "the call's forward run on a side stream": "sidefwd",
    "torch's backward captured first": "torchfirst",
}


def capture(call, mode: str | None, syncerror: bool):
    """timing.time_cuda_graph's warm-up and capture, with the error mode and sync checks asked for."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    kwargs = {"capture_error_mode": mode} if mode else {}
    if syncerror:
        torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph, **kwargs):
            call()
    except Exception:
        with contextlib.suppress(Exception):
            graph.reset()  # as timing.time_cuda_graph does: a graph left half-captured hung the process
        raise
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph.replay()
    torch.cuda.synchronize()
    return "captured and replayed"


def scenario(flags: list[str]) -> None:
    import traceback

    import torch

    from kcollect import verify
    from kcollect.kernels import get

    spec = get("rms_norm")
    shape = next(s for s in spec.grid("full") if s.label == "1x4096")
    inputs = spec.make_inputs(shape.dims, torch.bfloat16, "cuda", 0)
    dys, _ = verify.reference_answers(spec, inputs, "bwd", 1)

    def build(provider="triton"):
        if "sidefwd" in flags:
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                call = verify.build_call(spec, spec.provider(provider).fn, verify.clone_inputs(inputs), "bwd", dys)
            torch.cuda.current_stream().wait_stream(side)
        else:
            call = verify.build_call(spec, spec.provider(provider).fn, verify.clone_inputs(inputs), "bwd", dys)
        call()
        return call

    if "torchfirst" in flags:
        print(f"  torch first: {capture(build('torch'), None, False)}", flush=True)
    mode = "relaxed" if "relaxed" in flags else None
    for attempt in (1, 2):
        call = build() if attempt == 1 or "fresh" in flags else call
        try:
            print(f"  attempt {attempt}: {capture(call, mode, 'syncerror' in flags)}", flush=True)
        except Exception as e:
            tb = traceback.format_exc().strip().splitlines()
            print(f"  attempt {attempt}: FAILED {str(e).splitlines()[0][:200]}", flush=True)
            print("    " + "\n    ".join(tb[-14:-1]), flush=True)



def main() -> None:
    if len(sys.argv) > 1:
        scenario(sys.argv[1:])
        return
    for label, flags in SCENARIOS.items():
        print(label, flush=True)
        try:
            out = subprocess.run([sys.executable, __file__, *flags.split()], capture_output=True, text=True, timeout=50)
        except subprocess.TimeoutExpired as e:
            print(f"  TIMEOUT after 50 s; output so far: {(e.stdout or b'')[-2000:]!r}", flush=True)
            continue
        lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "Deprecat" not in ln]
        print("\n".join(lines[-40:]) + f"\n  (rc {out.returncode})", flush=True)


if __name__ == "__main__":
    main()
