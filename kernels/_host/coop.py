"""The launch plan of a coop kernel: a wide row split over co-resident programs that wait for each
other (the device side, publish / wait_total, is kernels/_jit/coop.py)."""
from __future__ import annotations

import triton

from .device import resident_programs


def coop_plan(kernel, tensors: tuple, M: int, N: int, seg: int | None, default_seg: int, warps: int, partials: int,
              maxnreg: int | None = None, **constexprs):
    """Launch plan of a coop kernel (see publish / wait_total in kernels/_jit/coop.py) whose
    arguments are `tensors` (stand-ins will do for buffers sized by the answer), then slots, M, N, S,
    iters: a row of N in S segments of `seg` (None: `default_seg`) elements, one program each, as many
    groups of S programs as the GPU holds at once (they wait for each other), the fewest for the same
    sweeps over the M rows. Returns (groups, rows per group, S, slots, launch keywords: the
    constexprs, and `maxnreg` where given), `slots` zeroed for `partials` values a segment, or None
    when not even one group fits. On the CPU the segment is the whole row, one program a row: the
    interpreter runs programs one after the other, and one waiting for another not yet started would
    wait for ever."""
    import torch

    x = tensors[0]
    if x.device.type != "cuda":
        if seg is not None and seg < N:
            raise ValueError(f"coop segments of {seg} < {N} elements need a GPU: their programs wait for each other")
        seg = triton.next_power_of_2(N)
    seg = seg or default_seg
    S = triton.cdiv(N, seg)
    meta = dict(SEG=seg, S_BLOCK=triton.next_power_of_2(S), **constexprs)
    if maxnreg:
        meta["maxnreg"] = maxnreg
    stand_in = torch.zeros(partials, dtype=torch.int64, device=x.device)
    groups = min(M, resident_programs(kernel, (*tensors, stand_in, M, N, S, 1), meta, warps, x.device,
                                      strict=True) // S)
    if groups == 0:
        return None
    iters = triton.cdiv(M, groups)
    groups = triton.cdiv(M, iters)
    # iters + 1 rows a group: the step past the last row publishes too
    slots = torch.zeros(groups * (iters + 1) * S * partials, dtype=torch.int64, device=x.device)
    return groups, iters, S, slots, meta
