"""What the gated activations (swiglu, geglu: c = act(a) * b) share outside their specs: the launch
of their flat forward and backward kernels, their autograd and the check of their inputs."""
from __future__ import annotations

from typing import Callable

import torch

from .launch import ElementwiseConfig, launch_elementwise


def gated_forward(kernel, a: torch.Tensor, b: torch.Tensor, config: ElementwiseConfig | None) -> torch.Tensor:
    """c from kernel(a, b, c, n, ...) over the flat elements (see launch_elementwise)."""
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty_like(a)
    launch_elementwise(kernel, a.numel(), a, b, c, config=config)
    return c


def gated_backward(kernel, dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   config: ElementwiseConfig | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) from kernel(dc, a, b, da, db, n, ...); a and b as the forward left them (contiguous)."""
    dc = dc.contiguous()
    da, db = torch.empty_like(a), torch.empty_like(b)
    launch_elementwise(kernel, a.numel(), dc, a, b, da, db, config=config)
    return da, db


def gated_function(name: str, forward: Callable, backward: Callable) -> type[torch.autograd.Function]:
    """The autograd Function `name` over forward(a, b) -> c and backward(dc, a, b) -> (da, db): it
    saves a and b only, the backward recomputes act(a) (cheaper than storing it)."""

    def fwd(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return forward(a, b)

    def bwd(ctx, dc):
        a, b = ctx.saved_tensors
        return backward(dc, a, b)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd),
                                                   "__module__": forward.__module__, "__qualname__": name})


def check_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    """a and b must have one shape and one dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a and b must match: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
