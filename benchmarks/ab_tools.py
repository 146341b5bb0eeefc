"""Helpers shared by the GPU A/B scripts (benchmarks/*_ab.py) and their offline compile reports."""
from __future__ import annotations

import contextlib

import torch
from triton.runtime.jit import KernelInterface

from kcollect.cli import pin_ptxas

# the A/Bs build their Triton kernels with the collector's ptxas (see kcollect.cli.pin_ptxas)
pin_ptxas()


@contextlib.contextmanager
def recorded(calls: list):
    """Triton launches (fn[grid](...)) record what would run instead of running."""
    saved = KernelInterface.__getitem__

    def record(self, grid):
        return lambda *args, **kwargs: calls.append((self, tuple(grid), args, kwargs))

    KernelInterface.__getitem__ = record
    try:
        yield
    finally:
        KernelInterface.__getitem__ = saved


def launches(fn) -> tuple:
    """What fn would launch: (kernel, grid, scalar arguments, keywords) per launch; two variants
    with equal launches need not be timed twice."""
    calls = []
    with recorded(calls):
        fn()
    return tuple((k.fn.__name__, grid, tuple(a for a in args if not torch.is_tensor(a)), tuple(sorted(kw.items())))
                 for k, grid, args, kw in calls)


def lazy(make):
    """A call of make()'s callable, built on first use (inside the case's try: a peer's forward)."""
    built = []

    def call():
        if not built:
            built.append(make())
        return built[0]()
    return call
