"""Where the L2 prefetch (kernels/_jit/prefetch.py: PTX, Hopper only) may run, and the L2_AHEAD
constexpr of a launch that uses it."""
from __future__ import annotations

from .device import on_sm90


def l2_prefetch_ok(t) -> bool:
    """Whether prefetch_l2 may run for the rows of 2-D tensor t: a Hopper GPU, rows that start on a
    16-byte boundary and are whole 16-byte vectors (so that every segment, chunk and tile is)."""
    e = t.element_size()
    return (on_sm90(t.device) and t.shape[-1] * e % 16 == 0 and t.stride(0) * e % 16 == 0
            and t.data_ptr() % 16 == 0)


def prefetch_ahead(asked: int | None, default: int, *tensors) -> int:
    """The L2_AHEAD constexpr of a launch that prefetches rows of `tensors`: `asked` (None: `default`)
    where prefetch_l2 may run for all of them, else 0."""
    return (default if asked is None else asked) if all(l2_prefetch_ok(t) for t in tensors) else 0
