"""What a run measures: its configuration, frozen once by the CLI, and its plan of cases."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .spec import DTYPE_NAMES, DTYPES, KernelSpec, Shape


@dataclass(frozen=True)
class RunConfig:
    """Everything a run depends on, built once by the CLI and passed down explicitly."""

    kernels: tuple[str, ...]
    grid: str  # 'quick' or 'full'
    device: str  # 'cuda' or 'cpu'
    modes: tuple[str, ...] | None = None  # None: each kernel's own modes
    providers: tuple[str, ...] | None = None  # None: all of each kernel's providers
    dtypes: tuple[str, ...] | None = None  # None: each kernel's bench dtypes
    where: tuple[tuple[str, str], ...] = ()  # (dim, value): only the grid's shapes with these dims
    shapes: tuple[str, ...] = ()  # labels (run --shape): just these shapes, the grid's or new (shapes.restrict)
    # (kernel, labels): those kernels at just those shapes of their grids (run --changed's sentinels)
    kernel_shapes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    warmup_ms: float = 10.0
    rep_ms: float = 40.0
    min_reps: int = 10
    ci_rel: float = 0.005  # stop timing once the median's 95% interval is within ±0.5% (timing.Budget)
    cuda_graph: bool = True  # time graph replays (device work only); events where capture fails
    recheck: bool = True  # re-measure each row at the end of its case (stability.py); the CLI: GPUs only
    recheck_all: bool = False  # also the rows their series' last time vouches for (stability.vouched)
    seed: int = 0
    alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF the run was made with (common.ALLOC_CONF)
    ptxas: str | None = None  # TRITON_PTXAS_PATH the run's Triton kernels were built with (common.pin_ptxas)
    machine: str | None = None  # None: host name + GPU name
    shard: str | None = None  # 'K/N' when the plan is split over machines
    workers: int = 1  # processes measuring the plan (one per GPU on CUDA)
    caches: str | None = None  # folder of the persistent Triton and inductor caches (caches.py)
    measure_timeout: float | None = None  # seconds a worker may spend on one measurement (collect.py)
    unavailable: tuple[tuple[str, str], ...] = ()  # (provider, why) this run does not measure here
    profile: str | None = None  # folder for a cProfile of each measuring process (collect.profiled)
    precompile: int = 0  # processes that build the plan's kernels before it is measured (precompile.py)
    precompile_limit: float | None = None  # seconds that pass may take in all (None: no limit)


@dataclass(frozen=True)
class Case:
    spec: KernelSpec
    shape: Shape
    dtype: torch.dtype
    modes: tuple[str, ...]
    providers: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.spec.name} {self.shape.label} {DTYPE_NAMES[self.dtype]}"


def plan(specs: list[KernelSpec], config: RunConfig) -> list[Case]:
    """The (kernel, shape, dtype) cases of a run, with the modes and providers each one gets."""
    from .shapes import restrict

    cases = []
    only = dict(config.kernel_shapes)
    for spec in specs:
        if config.shapes:  # the CLI has checked that each kernel can take them
            spec = restrict(spec, config.shapes)
        if spec.name in only:
            spec = restrict(spec, only[spec.name])
        modes = tuple(m for m in spec.modes if config.modes is None or m in config.modes)
        providers = tuple(p for p in spec.provider_names if config.providers is None or p in config.providers)
        if config.dtypes is None:
            dtypes = spec.bench_dtypes
        else:
            dtypes = tuple(DTYPES[d] for d in config.dtypes if DTYPES[d] in spec.dtypes)
        if not (modes and providers and dtypes):
            continue
        for shape in spec.grid(config.grid):
            if not matches(shape.dims, config.where):
                continue
            for dtype in dtypes:
                if config.dtypes is None and shape.dtypes is not None and DTYPE_NAMES[dtype] not in shape.dtypes:
                    continue  # a point the grid measures in fewer of the kernel's bench dtypes
                cases.append(Case(spec, shape, dtype, modes, providers))
    return cases


def matches(dims, where: tuple[tuple[str, str], ...]) -> bool:
    """Whether a shape's dims pass --where: every named dim equal to one of the values given for
    it (values compared as text, so 'stream=1' matches the integer 1)."""
    wanted: dict[str, set[str]] = {}
    for name, value in where:
        wanted.setdefault(name, set()).add(value)
    return all(name in dims and str(dims[name]) in values for name, values in wanted.items())
