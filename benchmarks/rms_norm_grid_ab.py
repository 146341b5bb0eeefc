"""A/B of rms_norm's forward grid on a GPU: persistent (strided tiles with prefetch) against one
tile per program, timed like the collector (graph replays, L2 flushed). Prints GB/s per shape."""
import torch

from kcollect import timing
from kcollect.kernels import rms_norm

flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
budget = timing.Budget(10, 60)
for m, n in [(1024, 2048), (8192, 4096), (32768, 4096), (16384, 5120), (4096, 8192), (2048, 16384), (3000, 3584), (999, 5003)]:
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    out = []
    for res in (None, r):
        for need in (False, True):
            for persistent in (True, False):
                t = timing.time_cuda_graph(lambda: rms_norm.rms_norm_forward(x, w, residual=res, need_rstd=need,
                                                                             persistent=persistent), budget, flush)
                nbytes = (2 + 2 * (res is not None)) * m * n * 2
                out.append(f"{'res' if res is not None else 'x'}/{'rstd' if need else 'inf'}/{'P' if persistent else 'NP'} {nbytes / t.median_ms / 1e6:6.0f}")
    print(f"{m}x{n}: " + " | ".join(out), flush=True)
