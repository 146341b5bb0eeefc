"""What the scan ops' specs share (rtu, selective_scan, conv1d): the seeded reset mask of their inputs,
and the log-depth scan in plain PyTorch that their torch.compile baselines run."""
from __future__ import annotations

import torch


def reset_mask(batch: int, steps: int, p: float, generator: torch.Generator) -> torch.Tensor:
    """[batch, steps] bool: each step a reset with probability p, from `generator` (seeded by the
    caller, so that every provider of a case sees the same episodes). Always drawn, also at p = 0
    (an all-False mask): the scan specs pass a mask or None by their own dim `resets`."""
    return torch.rand(batch, steps, generator=generator) < p


def log_scan(combine, elems: tuple, dim: int) -> tuple:
    """Inclusive scan of the tensors `elems` along `dim` in plain PyTorch, by doubling (Hillis and
    Steele): ceil(log2 T) levels of pointwise ops, differentiable by ordinary autograd, which keeps
    every level for the backward. `combine(*earlier, *later)` as the Triton combines above, whose
    Python bodies (`first_order.fn`) serve unchanged on tensors."""
    steps = elems[0].shape[dim]
    d = 1
    while d < steps:
        earlier = [e.narrow(dim, 0, steps - d) for e in elems]
        later = [e.narrow(dim, d, steps - d) for e in elems]
        elems = tuple(torch.cat([e.narrow(dim, 0, d), c], dim) for e, c in zip(elems, combine(*earlier, *later)))
        d *= 2
    return elems
