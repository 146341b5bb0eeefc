"""Bounds checking for Triton's CPU interpreter (`python -m lab.awkward --device cpu --bounds`).

The interpreter reads and writes raw host memory: a kernel lane that addresses past its tensors
reads a neighbour's bytes or nothing that fails, so an out-of-bounds access that corrupts results
or crashes on the GPU ("an illegal memory access") passes on the CPU unseen. install() makes every
active lane of every load and store prove that it lies inside the storage of one of the launch's
tensor arguments, and raises naming the kernel's source lines otherwise."""
from __future__ import annotations

import traceback

import numpy as np
import torch

_RANGES: list[tuple[int, int]] = []  # [start, end) of the running launch's tensors' storages
_INSTALLED = False


class OutOfBounds(RuntimeError):
    pass


def check(ptrs, mask, element_bytes: int, what: str) -> None:
    """Raise OutOfBounds when an active lane of `ptrs` (an address array) leaves every range."""
    p = np.asarray(ptrs).astype(np.uint64)
    active = np.broadcast_to(np.asarray(mask).astype(bool), p.shape)
    p = p[active]
    if p.size == 0:
        return
    inside = np.zeros(p.shape, bool)
    for lo, hi in _RANGES:
        inside |= (p >= lo) & (p + element_bytes <= hi)
    if not inside.all():
        where = [f"{f.filename.rsplit('/kernels/', 1)[-1]}:{f.lineno} {f.line}" for f in traceback.extract_stack()
                 if "/kernels/" in f.filename]
        raise OutOfBounds(f"out-of-bounds {what}: {int((~inside).sum())} of {p.size} active lanes, at "
                          + " <- ".join(reversed(where[-3:])))


def install() -> None:
    """Patch the interpreter (idempotent): launches record their tensors' storages, loads and
    stores check their active lanes against them."""
    global _INSTALLED
    if _INSTALLED:
        return
    from triton.runtime import interpreter as interp

    init_args = interp.GridExecutor._init_args_hst

    def recording(self, args_dev, kwargs):
        args, kw = init_args(self, args_dev, kwargs)
        _RANGES.clear()
        for x in (*args, *kw.values()):
            if isinstance(x, torch.Tensor):
                storage = x.untyped_storage()
                _RANGES.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        return args, kw

    load, store = interp.InterpreterBuilder.create_masked_load, interp.InterpreterBuilder.create_masked_store

    def size(ptrs) -> int:
        return np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize

    def checked_load(self, ptrs, mask, other, *rest):
        check(ptrs.data, mask.data, size(ptrs), "load")
        return load(self, ptrs, mask, other, *rest)

    def checked_store(self, ptrs, value, mask, *rest):
        check(ptrs.data, mask.data, size(ptrs), "store")
        return store(self, ptrs, value, mask, *rest)

    interp.GridExecutor._init_args_hst = recording
    interp.InterpreterBuilder.create_masked_load = checked_load
    interp.InterpreterBuilder.create_masked_store = checked_store
    _INSTALLED = True
