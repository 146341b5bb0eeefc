"""Tiny kernels for the collector's tests (`--kernel-module tests/planted_kernels.py`): plain torch
providers on a few small shapes, so that a run's scheduling, workers and signals are tested in
seconds, without the Triton interpreter. `scaled` has a provider that is 3% off (fails the gate).
Every call sleeps KCOLLECT_TEST_SLEEP seconds (default 0), so that a run can be hit midway."""
import os
import time

import torch

from kcollect.spec import KernelSpec, Provider, Shape


def _inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return {"x": (torch.randn((dims["M"], dims["N"]), generator=g) + 0.5).to(device=device, dtype=dtype)}


def _spec(name, providers, shapes):
    return KernelSpec(
        name=name, description=f"planted {name} for the collector's tests", modes=("fwd", "bwd"),
        providers=providers, baseline="torch", reference=lambda x: x * 2.0, make_inputs=_inputs,
        grad_inputs=("x",), grids={"quick": shapes, "full": shapes},
        bytes_moved=lambda dims, dtype, mode: 2 * dims["M"] * dims["N"] * dtype.itemsize,
        flops=lambda dims, mode: float(dims["M"] * dims["N"]), bound="memory",
        tolerance={torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5},
        dtypes=(torch.bfloat16, torch.float32))


def _p(name, fn):
    def call(x):
        time.sleep(float(os.environ.get("KCOLLECT_TEST_SLEEP", "0")))
        return fn(x)

    return Provider(name, call)


_SHAPES = tuple(Shape.rows(m, n, "small") for m, n in ((4, 8), (3, 5), (2, 7)))
SPECS = (
    _spec("doubled", (_p("torch", lambda x: x * 2.0), _p("add", lambda x: x + x)), _SHAPES),
    _spec("scaled", (_p("torch", lambda x: x * 2.0), _p("wrong", lambda x: x * 2.06)), _SHAPES[:2]),
)
