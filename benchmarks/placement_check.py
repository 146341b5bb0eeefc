"""Does where the five tensors of swiglu's backward lie in memory change its time? (GPU only, ~20 s.)

benchmarks/swiglu_context_check.py timed our swiglu backward at 16384x14336 at 547 us and at 610 us
in one process, the only difference being the allocations made before (the float64 reference).
Here the kernel's three inputs and two outputs are carved out of one buffer at chosen spacings
(each tensor is 448 MiB; a spacing adds a gap of G MiB between consecutive tensors, and 'order'
permutes which tensor sits where), and the kernel itself (swiglu._swiglu_bwd through
_utils.launch_elementwise, exactly the collector's launch) is timed as the collector times it:
CUDA-graph replays, L2 flushed before each, timing.Budget(5, 25). The same for the forward (two
inputs, one output) and for a plain copy (torch's copy_ of one tensor into another).

    python benchmarks/placement_check.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kcollect import timing  # noqa: E402
from kcollect.kernels import swiglu as S  # noqa: E402
from kcollect.kernels._utils import launch_elementwise  # noqa: E402

M, N = 16384, 14336
MIB = 1 << 20


def carve(buf: torch.Tensor, count: int, gap_mib: int, order) -> list[torch.Tensor]:
    """`count` [M, N] bf16 tensors from buf, tensor i at slot order[i], slots gap_mib apart."""
    n = M * N
    step = n + gap_mib * MIB // 2  # bf16 elements
    return [buf[order[i] * step: order[i] * step + n].view(M, N) for i in range(count)]


def main():
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    budget = timing.Budget(5, 25)
    buf = torch.empty(5 * M * N + 5 * 64 * MIB // 2, dtype=torch.bfloat16, device="cuda")
    buf.normal_()
    nbytes = 5 * M * N * 2
    print(f"{torch.cuda.get_device_name()} swiglu bwd {M}x{N} bf16 ({nbytes / 1e6:.0f} MB moved), "
          f"tensors of {M * N * 2 / MIB:.0f} MiB; buffer at {buf.data_ptr() % (1 << 30) // MIB} MiB into its GiB",
          flush=True)
    cases = [(g, (0, 1, 2, 3, 4)) for g in (0, 2, 4, 6, 8, 16, 32, 64)]
    cases += [(0, (4, 3, 2, 1, 0)), (0, (0, 2, 4, 1, 3)), (2, (3, 0, 4, 2, 1)), (32, (1, 4, 0, 3, 2))]
    for gap, order in cases:
        dc, a, b, da, db = carve(buf, 5, gap, order)

        def bwd():
            launch_elementwise(S._swiglu_bwd, a.numel(), dc, a, b, da, db)

        def fwd():
            launch_elementwise(S._swiglu_fwd, a.numel(), a, b, da)

        def copy():
            da.copy_(a)

        out = []
        for name, fn, moved in (("bwd", bwd, 5), ("fwd", fwd, 3), ("copy", copy, 2)):
            t = timing.time_cuda_graph(fn, budget, flush)
            out.append(f"{name} {t.median_ms * 1000:6.1f} us {moved * M * N * 2 / t.median_ms / 1e6:5.0f} GB/s")
        print(f"gap {gap:2d} MiB order {order}: " + " | ".join(out), flush=True)


if __name__ == "__main__":
    main()
