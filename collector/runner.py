"""The runner: every selected kernel x shape x dtype x mode x provider, gated on correctness,
timed, written to the store as each (kernel, shape, dtype) finishes."""
from __future__ import annotations

import gc
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import torch

from . import timing, verify
from .environment import fingerprint, git_info
from .spec import DTYPE_NAMES, DTYPES, KernelSpec, Shape, Unavailable
from .store import Run, Store, config_json


@dataclass(frozen=True)
class RunConfig:
    """Everything a run depends on, built once by the CLI and passed down explicitly."""

    kernels: tuple[str, ...]
    grid: str  # 'quick' or 'full'
    device: str  # 'cuda' or 'cpu'
    modes: tuple[str, ...] | None = None  # None: each kernel's own modes
    providers: tuple[str, ...] | None = None  # None: all of each kernel's providers
    dtypes: tuple[str, ...] | None = None  # None: each kernel's bench dtypes
    warmup_ms: float = 10.0
    rep_ms: float = 40.0
    min_reps: int = 10
    cuda_graph: bool = True  # time graph replays (device work only); events where capture fails
    seed: int = 0
    commit: str | None = None  # overrides git (for a copy of the tree without .git)
    commit_time: str | None = None
    alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF the run was made with (common.ALLOC_CONF)
    ptxas: str | None = None  # TRITON_PTXAS_PATH the run's Triton kernels were built with (common.pin_ptxas)


@dataclass(frozen=True)
class Case:
    spec: KernelSpec
    shape: Shape
    dtype: torch.dtype
    modes: tuple[str, ...]
    providers: tuple[str, ...]


def plan(specs: list[KernelSpec], config: RunConfig) -> list[Case]:
    """The (kernel, shape, dtype) cases of a run, with the modes and providers each one gets."""
    cases = []
    for spec in specs:
        modes = tuple(m for m in spec.modes if config.modes is None or m in config.modes)
        providers = tuple(p for p in spec.provider_names if config.providers is None or p in config.providers)
        if config.dtypes is None:
            dtypes = spec.bench_dtypes
        else:
            dtypes = tuple(DTYPES[d] for d in config.dtypes if DTYPES[d] in spec.dtypes)
        if not (modes and providers and dtypes):
            continue
        for shape in spec.grid(config.grid):
            for dtype in dtypes:
                cases.append(Case(spec, shape, dtype, modes, providers))
    return cases


def _error_text(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "out of memory: " + first[:300]
    return f"{type(e).__name__}: {first[:300]}"


class Runner:
    def __init__(self, config: RunConfig, store: Store):
        self.config = config
        self.store = store
        self.budget = timing.Budget(config.warmup_ms, config.rep_ms, config.min_reps)
        self.flush = None
        self.seq = 0
        self.run_id = str(uuid.uuid4())
        self.warn: Callable[[str], None] = lambda message: None  # the CLI prints these

    # -- a whole run --------------------------------------------------------------------------

    def start(self, root) -> Run:
        cfg = self.config
        if cfg.device == "cuda":
            self.flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        _raise_recompile_limit()
        env = fingerprint(cfg.device)
        self.store.add_environment(env)
        copy_gbps, matmul_tflops = timing.measure_ceilings(cfg.device)
        commit, commit_time, dirty = git_info(root)
        if cfg.commit:
            commit, dirty = cfg.commit, None
            commit_time = datetime.fromisoformat(cfg.commit_time) if cfg.commit_time else commit_time
        run = Run(run_id=self.run_id, env_id=env.env_id, started_at=_now(), finished_at=None, status="unfinished",
                  git_commit=commit, commit_time=commit_time, git_dirty=dirty, grid=cfg.grid, copy_gbps=copy_gbps,
                  matmul_tflops=matmul_tflops, config=config_json(cfg))
        self.store.start_run(run)
        self.env = env
        return run

    def finish(self, status: str) -> None:
        self.store.finish_run(self.run_id, status, _now())

    def run_case(self, case: Case) -> list[dict[str, Any]]:
        rows = list(self._measure(case))
        self.store.add_results(rows)
        return rows

    # -- one (kernel, shape, dtype) -----------------------------------------------------------

    def _measure(self, case: Case) -> Iterator[dict[str, Any]]:
        spec, dims, device = case.spec, case.shape.dims, self.config.device
        seed = self.config.seed + self.seq
        inputs = spec.make_inputs(dims, case.dtype, device, seed)
        try:
            for mode in case.modes:
                yield from self._measure_mode(case, mode, inputs, seed)
        finally:
            del inputs
            _release(device)

    def _measure_mode(self, case: Case, mode: str, inputs, seed: int) -> Iterator[dict[str, Any]]:
        spec, device = case.spec, self.config.device
        want = None
        try:
            dys, want = self._expected(spec, inputs, mode, seed)
        except Exception as e:  # the float64 reference itself could not run (memory, most likely)
            reason = "reference failed: " + _error_text(e)
            for name in case.providers:
                yield self._row(case, mode, name, status="error", error=reason)
            return
        for name in case.providers:
            provider = spec.provider(name)
            reason = provider.available(device)
            if reason:
                yield self._row(case, mode, name, status="unavailable", error=reason)
                continue
            gated = verify.gated_spec(spec, provider)
            if gated is spec:
                yield self._measure_provider(case, mode, provider, inputs, dys, want)
            else:  # a provider computing another function: its own reference answers
                yield self._measure_provider(case, mode, provider, inputs, *self._expected(gated, inputs, mode, seed),
                                             spec=gated)
            _release(device)

    def _expected(self, spec, inputs, mode: str, seed: int):
        """Upstream gradients and the float64 reference's answers. Out of memory, the cached blocks
        that earlier providers left behind are returned to the device and the reference is tried
        once more: on the GPU it is the largest allocation of a case (8 bytes per element)."""
        for attempt in (0, 1):
            try:
                return verify.reference_answers(spec, inputs, mode, seed + 1)
            except torch.cuda.OutOfMemoryError:
                if attempt:
                    raise
                _release(self.config.device)

    def _measure_provider(self, case, mode, provider, inputs, dys, want, spec=None) -> dict[str, Any]:
        spec, dtype, fn, name = spec or case.spec, case.dtype, provider.fn, provider.name
        tol = spec.tolerance[dtype]
        call: Callable[[], tuple] | None = None
        try:
            mine = verify.clone_inputs(inputs)
            call = verify.build_call(spec, fn, mine, mode, dys)
            err = verify.error_of(spec, call(), want, mode)
            if not err <= tol:
                return self._row(case, mode, name, status="failed", rel_err=err, tolerance=tol,
                                 error=f"relative error {err:.3g} over the tolerance {tol:.3g}")
            t = self._time(call)
            peak = timing.peak_memory(call, self.config.device)
            config = json.dumps(provider.config(inputs), sort_keys=True) if provider.config else None
            return self._row(case, mode, name, status="ok", rel_err=err, tolerance=tol, timing=t, peak=peak,
                             config=config)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Unavailable as e:  # the provider refused these inputs (a backend's shape limits)
            return self._row(case, mode, name, status="unavailable", error=str(e))
        except Exception as e:  # CUDA errors, out of memory, compile failures: a row, the run goes on
            return self._row(case, mode, name, status="error", error=_error_text(e), tolerance=tol)
        finally:
            call = mine = None

    def _time(self, call) -> timing.Timing:
        if self.config.device != "cuda":
            return timing.time_cpu(call, self.budget)
        if self.config.cuda_graph:
            failure = None
            try:
                return timing.time_cuda_graph(call, self.budget, self.flush)
            except Exception as e:  # not capturable (a host sync, say): events, and the row says so
                failure = _error_text(e)
            # outside the except block, so that no traceback keeps the failed capture's memory
            torch.cuda.synchronize()
            _release("cuda")
            self.warn(f"CUDA-graph capture failed ({failure}); timed with events")
        return timing.time_cuda(call, self.budget, self.flush)

    def _row(self, case: Case, mode: str, provider: str, *, status: str, error: str | None = None,
             rel_err: float | None = None, tolerance: float | None = None,
             timing: timing.Timing | None = None, peak: int | None = None,
             config: str | None = None) -> dict[str, Any]:
        spec, dims = case.spec, case.shape.dims
        self.seq += 1
        row = dict(run_id=self.run_id, kernel=spec.name, mode=mode, provider=provider, shape=case.shape.label,
                   dims=json.dumps(dict(dims)), dtype=DTYPE_NAMES[case.dtype], baseline=spec.baseline,
                   bound=spec.bound, status=status, error=error, rel_err=_finite(rel_err), tolerance=tolerance,
                   bytes=int(spec.bytes_moved(dims, case.dtype, mode)), flops=float(spec.flops(dims, mode)),
                   peak_mem_bytes=peak, config=config, seq=self.seq)
        if timing is not None:
            row.update(timing=timing.method, median_ms=timing.median_ms, p20_ms=timing.p20_ms, p80_ms=timing.p80_ms,
                       mean_ms=timing.mean_ms, std_ms=timing.std_ms, min_ms=timing.min_ms, reps=timing.reps)
        return row


def _finite(x: float | None) -> float | None:
    # DuckDB stores inf, but JSON and the site do not like it: an infinite error is NaN/Inf output,
    # and the status and error text already say so.
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else x


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _raise_recompile_limit() -> None:
    """compile specialises on every shape (dynamic=False); dynamo's default limit of 8 graphs per
    function would otherwise fall back to eager silently after the eighth shape."""
    import torch._dynamo

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)
