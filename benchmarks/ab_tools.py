"""What the GPU scripts that run kernels outside the collector share (lab/fingerprint.py,
benchmarks/power_probe.py, benchmarks/compile_report.py): the collector's ptxas and allocator, and
`recorded`, which records launches instead of running them."""
from __future__ import annotations

import contextlib
import os

import torch
from triton.runtime.jit import KernelInterface

from kcollect.common import ALLOC_CONF, pin_ptxas

# The A/Bs run as `kcollect run` does: its ptxas (kcollect.cli.pin_ptxas) and its CUDA allocator
# (expandable segments, read when the allocator starts: the scripts make no CUDA tensor before
# this import). Until then the allocator was one difference between an A/B and the collector
# (the other: what ran before in the process), and a gain could stay behind: layer_norm's forward
# at 4096x4096 without the x cache hint, 4-6% faster in layer_norm_ab runs 10-11, within 1% in
# collector runs 56a11cd4 and 369a663a.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
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


def add_case_options(ap, deadline: float, example: str) -> None:
    """--only (comma-separated shapes such as `example`: only those cases, without the torch.compile
    peer; parsed to a set of int tuples) and --deadline (seconds after which no new case starts),
    for an A/B script whose full run fits its default deadline and a narrower one may need longer."""
    ap.add_argument("--only", default="", type=_shapes,
                    help=f"comma-separated shapes (e.g. {example}): only those, without the torch.compile peer")
    ap.add_argument("--deadline", type=float, default=deadline,
                    help=f"seconds after which no new case starts (default {deadline})")


def _shapes(text: str) -> set:
    return {tuple(int(v) for v in s.split("x")) for s in text.split(",") if s}
