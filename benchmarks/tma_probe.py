"""Probe: softmax's forward over very wide rows with TMA loads (tensor descriptors) software-pipelined
by Triton, against the default path. Question: do bulk asynchronous copies into shared memory (many
bytes in flight per SM without registers) lift the wide rows past the 75-82% of copy that the
register-bound paths reach (softmax.py's comments)?

The row is viewed as [N / W, W] lines of W elements (W the largest power of two <= 256 dividing N),
x as a 3-D descriptor [M, N / W, W] with boxes of [1, R, W]: a chunk of R lines, zero-filled past the
row's end on load and clipped there on store. Pass 1: per-line online max / sum of exp
(_utils.lse_update) over the chunks, pass 2: the chunks again (newest first, for L2) and
y = exp(x - max) / sum stored through a descriptor. One program a row.

    python benchmarks/tma_probe.py                      # GPU
    TRITON_INTERPRET=1 python benchmarks/tma_probe.py --dry-run
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from benchmarks import ab_tools  # noqa: E402,F401  (the collector's allocator and ptxas)
from kcollect import timing  # noqa: E402
from kcollect.kernels import softmax  # noqa: E402
from kcollect.kernels._utils import LOG2E, lse_update  # noqa: E402

COPY_GBPS = 4250.0


@triton.jit
def _fwd_tma(x_desc, y_desc, M, NL, NC: tl.constexpr, R: tl.constexpr, W: tl.constexpr, EVEN: tl.constexpr,
             STAGES: tl.constexpr):
    lines = tl.arange(0, R)
    row = tl.program_id(0)
    while row < M:  # rows strided over the grid (one a program where the grid is M)
        m = tl.full([R], -float("inf"), tl.float32)
        d = tl.zeros([R], dtype=tl.float32)
        for c in tl.range(0, NC, num_stages=STAGES):
            x = tl.reshape(x_desc.load([row, c * R, 0]), [R, W]).to(tl.float32)
            if not EVEN:
                x = tl.where((c * R + lines < NL)[:, None], x, -float("inf"))
            m, d = lse_update(x, m, d, True)
        m_row = tl.max(m, 0)
        r = 1.0 / tl.sum(d * tl.exp2((m - m_row) * LOG2E), 0)
        for i in tl.range(0, NC, num_stages=STAGES):
            c = NC - 1 - i
            x = tl.reshape(x_desc.load([row, c * R, 0]), [R, W]).to(tl.float32)
            y = tl.exp2((x - m_row) * LOG2E) * r
            y_desc.store([row, c * R, 0], tl.reshape(y.to(y_desc.dtype), [1, R, W]))
        row += tl.num_programs(0)


def line_width(n: int) -> int:
    return min(256, n & -n)


def softmax_tma(x: torch.Tensor, R: int = 32, stages: int = 3, warps: int = 8, per_sm: float = 0) -> torch.Tensor:
    """per_sm: a persistent grid of that many programs per SM (rows strided over it); 0: one a row."""
    M, N = x.shape
    W = line_width(N)
    if W * x.element_size() < 16:
        raise ValueError(f"rows of {N} elements: lines under 16 bytes")
    NL = N // W
    y = torch.empty_like(x)
    block = [1, R, W]
    xd = TensorDescriptor(x, [M, NL, W], [N, W, 1], block)
    yd = TensorDescriptor(y, [M, NL, W], [N, W, 1], block)
    grid = M if not per_sm else max(1, min(M, int(per_sm * (132 if x.device.type == "cpu" else
                                                            torch.cuda.get_device_properties(x.device).multi_processor_count))))
    _fwd_tma[(grid,)](xd, yd, M, NL, NC=triton.cdiv(NL, R), R=R, W=W, EVEN=NL % R == 0, STAGES=stages,
                   num_warps=warps)
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="small shapes, correctness only (CPU interpreter)")
    ap.add_argument("--shapes", default="2048x65536,4096x65536,2048x128256,1024x262144")
    ap.add_argument("--variants", default="32:3:8:0,32:4:8:0,16:4:4:0,64:2:8:0,32:3:8:1,32:3:8:2,32:4:8:1,64:2:8:1,16:4:4:2",
                    help="R:stages:warps:programs per SM (0: one a row), comma-separated")
    args = ap.parse_args()
    dev = "cpu" if args.dry_run else "cuda"
    shapes = ["3x4000", "2x8192", "5x12416"] if args.dry_run else args.shapes.split(",")
    variants = [tuple(float(v) if i == 3 else int(v) for i, v in enumerate(s.split(":"))) for s in args.variants.split(",")]
    if args.dry_run:
        variants = [(4, 2, 4, 0), (8, 3, 4, 0.01)]
    g = torch.Generator(device="cpu").manual_seed(0)
    flush = None if args.dry_run else torch.empty(timing.L2_FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
    for s in shapes:
        M, N = (int(v) for v in s.split("x"))
        x = (torch.randn((M, N), generator=g) * 3).to(device=dev, dtype=torch.bfloat16)
        ref = torch.softmax(x.double(), -1)
        nbytes = 2 * M * N * x.element_size()
        cases = [("default", lambda: softmax.softmax_forward(x))]
        cases += [(f"tma R{r} st{st} w{w} p{p:g}", (lambda r=r, st=st, w=w, p=p: softmax_tma(x, r, st, w, p)))
                  for r, st, w, p in variants]
        for name, fn in cases:
            try:
                err = ((fn().double() - ref).abs().max() / ref.abs().max()).item()
            except Exception as e:  # a variant that does not compile is reported, not fatal
                print(f"{s:14} {name:26} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            if err > 1e-2:
                print(f"{s:14} {name:26} FAIL error {err:.1e}", flush=True)
                continue
            if args.dry_run:
                print(f"{s:14} {name:26} ok error {err:.1e}", flush=True)
                continue
            t = timing.time_cuda_graph(fn, timing.Budget(5, 25), flush).median_ms
            gbps = nbytes / t / 1e6
            print(f"{s:14} {name:26} {t * 1e3:9.1f} us {gbps:7.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}% of copy "
                  f"(error {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
