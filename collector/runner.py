"""The runner: every selected kernel x shape x dtype x mode x provider, gated on correctness,
timed, checked for steady conditions, and handed to a sink (the store, or a worker's queue to the
parent that writes the store) as each (kernel, shape, dtype) finishes."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from . import memory, stability, timing, verify
from .environment import Commit, fingerprint, host_identity, resolve_commit
from .names import plain
from .phases import Phases
from .seeds import case_seed
from .plan import Case, RunConfig, plan  # noqa: F401  (plan: imported from here by benchmarks)
from .spec import DTYPE_NAMES, Unavailable
from .store import Environment, Run, config_json


class Sink(Protocol):
    """Where a run's records go: a Store, or a worker's queue to the parent process."""

    def add_environment(self, env: Environment) -> None: ...
    def start_run(self, run: Run) -> None: ...
    def add_results(self, rows: list[dict[str, Any]]) -> None: ...
    def finish_run(self, run_id: str, status: str, finished_at: Any, phases: str | None = None) -> None: ...


def _error_text(e: BaseException) -> str:
    first = (plain(str(e)).strip().splitlines() or [""])[0]
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "out of memory: " + first[:300]
    return f"{type(e).__name__}: {first[:300]}"


def _share_case_seconds(rows: list[dict[str, Any]], case_s: float) -> None:
    """Spread what a case spent outside its measurements (inputs, float64 references, releasing its
    memory) evenly over its rows' seconds, so that a run's rows add up to its measuring time: the
    seconds are what the next run's estimate is fitted on (cost.py), and the references alone can
    be most of a recurrent case's cost."""
    timed = [r for r in rows if r.get("seconds") is not None]
    extra = case_s - sum(r["seconds"] for r in timed)
    for r in timed:
        r["seconds"] += max(0.0, extra) / len(timed)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Runner:
    def __init__(self, config: RunConfig, sink: Sink, device_index: int | None = None, started: float | None = None):
        """`started`: when the process began its work (perf_counter), so that imports and the
        registry count as "setup" in the breakdown; default now."""
        self.config = config
        self.sink = sink
        self.device_index = device_index
        self.budget = timing.Budget(config.warmup_ms, config.rep_ms, config.min_reps, ci_rel=config.ci_rel)
        # the recheck: a quarter of the budget and of the warm-up (it follows the case's other
        # measurements on a busy device), half the repeats (steady rows stop early anyway)
        self.short = replace(self.budget, warmup_ms=config.warmup_ms / 4, rep_ms=config.rep_ms / 4,
                             min_reps=max(1, config.min_reps // 2))
        self.flush = None
        self.seq = 0
        self.run_id = str(uuid.uuid4())
        self.phases = Phases(started)
        if started is not None:
            self.phases.add("setup", time.perf_counter() - started)
        if config.recheck:  # present, so that 0 says every row's recheck replayed its measured call
            self.phases.add("recheck_fresh", 0.0)
        self.no_capture: set[tuple[str, str, str]] = set()  # (kernel, mode, provider) that failed capture
        self.warn: Callable[[str], None] = lambda message: None  # the CLI prints these
        # (event, case, mode, provider): 'case' as a case begins (mode and provider ''), 'start'
        # before each provider is measured, 'end' after, 'recheck' before a row is measured again
        self.progress: Callable[[str, Case, str, str], None] = lambda *a: None
        # each row as it is made, before its case ends: a worker's parent keeps them should it die
        self.on_row: Callable[[dict[str, Any]], None] = lambda row: None
        # {(kernel, shape label, dtype, mode, provider): the error row's text}: builds that hung or
        # crashed the precompile pass's process (precompile.Report.skips), recorded, not called again
        self.skips: dict[tuple[str, str, str, str, str], str] = {}
        # each series' last stored time per GPU model (previous.previous_times): where it vouches for
        # a row's first measurement (stability.vouched), the row is not measured again
        self.previous: dict[tuple, tuple] = {}
        self.gpu: str | None = None  # this device's name, as runs' environments record it

    # -- a whole run --------------------------------------------------------------------------

    def start(self, commit: Commit | str | os.PathLike | None = None) -> Run:
        """Opens the run: environment, ceilings, the run record. `commit`: resolved by the CLI, or
        the folder of a git checkout to read it from (default: the working directory)."""
        cfg = self.config
        if not isinstance(commit, Commit):
            commit = resolve_commit(Path(commit or os.getcwd()))
        with self.phases("setup"):
            self._prepare()
            env = fingerprint(cfg.device)
            copy_gbps, matmul_tflops = timing.measure_ceilings(cfg.device)
            memory.freeze_imports()
        machine = cfg.machine or f"{socket.gethostname()} {env.gpu_name or 'CPU'}"
        run = Run(run_id=self.run_id, env_id=env.env_id, started_at=_now(), finished_at=None, status="unfinished",
                  git_commit=commit.sha, commit_time=commit.time, git_dirty=commit.dirty, grid=cfg.grid,
                  copy_gbps=copy_gbps, matmul_tflops=matmul_tflops,
                  config=config_json({**asdict(cfg), "host": host_identity(cfg.device)}), machine=machine,
                  commit_subject=commit.subject, commit_author=commit.author, commit_url=commit.url,
                  shard=cfg.shard, device_index=self.device_index, invocation=commit.invocation,
                  kcollect_version=commit.kcollect_version, kcollect_commit=commit.kcollect_commit)
        with self.phases("store"):
            self.sink.add_environment(env)
            self.sink.start_run(run)
        return run

    def resume(self, run: Run, seq: int) -> None:
        """Continues `run`, opened by a process that died (collect.py): its record and ceilings
        stand, and its rows so far are numbered up to `seq`."""
        with self.phases("setup"):
            self._prepare()
            memory.freeze_imports()
        self.run_id, self.seq = run.run_id, seq

    def _prepare(self) -> None:
        if self.config.device == "cuda":
            self.gpu = torch.cuda.get_device_properties(0).name  # as environment.fingerprint names it
            self.flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
            _warm_compile_workers()
        # importing dynamo costs 1.6 s of CPU per process: skipped where compile is not measured
        # (the CLI's default on the CPU)
        if "compile" not in dict(self.config.unavailable):
            _raise_recompile_limit()

    def finish(self, status: str) -> None:
        self.sink.finish_run(self.run_id, status, _now(), self.phases.to_json())

    def run_case(self, case: Case, only: frozenset[tuple[str, str]] | None = None) -> list[dict[str, Any]]:
        """The case's rows, stored; `only`: just these (mode, provider) pairs (default all)."""
        rows = self._measure(case, only)
        with self.phases("store"):
            self.sink.add_results(rows)
        return rows

    # -- one (kernel, shape, dtype) -----------------------------------------------------------

    def _measure(self, case: Case, only: frozenset[tuple[str, str]] | None) -> list[dict[str, Any]]:
        """The case's rows; then its memory goes back to the device. The release runs after
        _measure_case has returned, when its frame (inputs, float64 answers, the last provider's
        upstream gradients and call) is gone: released inside it, that memory stayed cached until
        the next case (on the H200, up to 2.5 GB more reserved after a case than before it)."""
        level, t0 = memory.allocated(self.config.device), time.perf_counter()
        rows: list[dict[str, Any]] = []
        try:
            rows = self._measure_case(case, only)
            return rows
        finally:
            with self.phases("release"):
                memory.release(self.config.device, compiled="compile" in case.providers, case_end=True,
                               level=level)
            _share_case_seconds(rows, time.perf_counter() - t0)

    def _measure_case(self, case: Case, only: frozenset[tuple[str, str]] | None) -> list[dict[str, Any]]:
        device, seed = self.config.device, case_seed(self.config.seed, case)  # not its place in the plan
        rows: list[dict[str, Any]] = []
        # (row, a fresh call's maker, the measurement, the call kept for the recheck or None)
        done: list[tuple[dict, Callable[[], Callable], stability.Measured, _Timer | None]] = []
        pairs = [(m, n) for m in case.modes for n in case.providers if only is None or (m, n) in only]
        self.progress("case", case, "", "")
        with self.phases("inputs"):
            try:
                inputs = case.spec.make_inputs(case.shape.dims, case.dtype, device, seed)
            except Exception as e:  # a plugin's inputs, or a shape it cannot take: this case's rows say so
                rows = [self._row(case, m, n, status="error", error="inputs failed: " + _error_text(e)) for m, n in pairs]
                for row in rows:
                    self.on_row(row)
                return rows
        answers = self._answers(case.spec, case, inputs, seed)
        # a provider that computes another function (Provider.reference) has its own answers
        gated = {n: verify.gated_spec(case.spec, case.spec.provider(n)) for n in dict.fromkeys(n for _, n in pairs)}
        own = {n: self._answers(g, case, inputs, seed) for n, g in gated.items() if g is not case.spec}
        try:
            for mode, name in pairs:
                spec, answer = gated[name], own.get(name, answers)
                if isinstance(answer, str):  # the reference itself failed: the row says so
                    rows.append(self._row(case, mode, name, status="error", error=answer))
                    self.on_row(rows[-1])
                    continue
                skip = self.skips.get((case.spec.name, case.shape.label, DTYPE_NAMES[case.dtype], mode, name))
                if skip is not None:  # as a measurement that hangs or kills its process is recorded (collect._death)
                    rows.append(self._row(case, mode, name, status="error", error=skip))
                    self.on_row(rows[-1])
                    self.progress("end", case, mode, name)
                    continue
                dys, want = answer[mode]
                self.progress("start", case, mode, name)
                t0 = time.perf_counter()
                held = sum(kept.held for *_, kept in done if kept is not None)
                row, measured, kept = self._provider(case, mode, spec.provider(name), inputs, dys, want, spec, held)
                row["seconds"] = time.perf_counter() - t0
                rows.append(row)
                self.on_row(row)
                if measured is not None:
                    done.append((row, _maker(spec, spec.provider(name).fn, inputs, mode, dys), measured, kept))
                self.progress("end", case, mode, name)
            for row, make, measured, kept in done if self.config.recheck else ():
                # a row not of ours that its last time vouches for: stored as measured, without a
                # recheck (ours always are: the gate's lines keep their rechecks, see stability.py)
                if not (self.config.recheck_all or row["ours"]) and stability.vouched(measured, self.previous.get(
                        (self.gpu, row["kernel"], row["mode"], row["provider"], row["shape"], row["dtype"]))):
                    continue
                self.progress("recheck", case, row["mode"], row["provider"])
                t0 = time.perf_counter()
                self._settle(row, kept, make, measured)
                row["seconds"] += time.perf_counter() - t0
        finally:  # the kept calls a recheck did not get to (an exception, Ctrl-C)
            for *_, kept in done:
                if kept is not None:
                    kept.close()
        return rows

    def _answers(self, spec, case: Case, inputs, seed: int):
        """{mode: (upstream gradients, reference answers)} from one float64 forward and backward,
        or the error text when the reference cannot run. Out of memory, the allocator's cached
        blocks are returned to the device and it is tried once more: on the GPU the reference is
        the largest allocation of a case (8 bytes per element)."""
        with self.phases("reference"):
            for attempt in (0, 1):
                try:
                    return verify.reference_modes(spec, inputs, case.modes, seed + 1)
                except torch.cuda.OutOfMemoryError as e:
                    if attempt:
                        return "reference failed: " + _error_text(e)
                except Exception as e:
                    return "reference failed: " + _error_text(e)
                memory.release(self.config.device)

    def _provider(self, case, mode, provider, inputs, dys, want, spec, held: int = 0):
        """(row, the measurement, the measured call kept for the recheck) of one provider, gated
        with `spec`; the measurement is None for any row but ok, the call None where it is not
        kept (`held`: the bytes the calls its case keeps already hold; memory.may_keep)."""
        dtype, name = case.dtype, provider.name
        tol = spec.tolerance[dtype]
        reason = dict(self.config.unavailable).get(name) or provider.available(self.config.device)
        if reason:
            return self._row(case, mode, name, status="unavailable", error=reason), None, None
        call = timer = kept = None
        level = memory.allocated(self.config.device)
        try:
            with self.phases("first_call"):
                call = verify.build_call(spec, provider.fn, verify.clone_inputs(inputs), mode, dys)
                t0 = time.perf_counter()
                got = call()
                first_ms = (time.perf_counter() - t0) * 1e3
            with self.phases("check"):
                errors = verify.part_errors(spec, got, want, mode)
                err = verify.largest(errors)
                got = None
            if not err <= tol:
                worst = verify.worst_part(spec, errors, mode)
                where = f" (worst: {worst})" if worst else ""
                return self._row(case, mode, name, status="failed", rel_err=err, tolerance=tol,
                                 error=f"relative error {err:.3g} over the tolerance {tol:.3g}{where}"), None, None
            before = memory.snapshot(self.config.device)
            key = (spec.name, mode, name)
            with self.phases("capture") if self.config.device == "cuda" else contextlib.nullcontext():
                timer = self._timer(call, key)
            measured = self._time(timer, key, self.budget, estimate_ms=first_ms, since=before)
            config = json.dumps(provider.config(inputs), sort_keys=True) if provider.config else None
            row = self._row(case, mode, name, status="ok", rel_err=err, tolerance=tol, config=config)
            row.update(free_mem_bytes=before.free, alloc_mem_bytes=before.allocated,
                       reserved_mem_bytes=before.reserved)
            _put_timing(row, measured.timing)
            kept, timer = self._keep(timer, level, inputs, held), None
            return row, measured, kept
        except (KeyboardInterrupt, SystemExit):
            raise
        except Unavailable as e:  # the provider refused these inputs (a backend's shape limits)
            return self._row(case, mode, name, status="unavailable", error=str(e)), None, None
        except Exception as e:  # CUDA errors, out of memory, compile failures: a row, the run goes on
            return self._row(case, mode, name, status="error", error=_error_text(e), tolerance=tol), None, None
        finally:
            if timer is not None:
                timer.close()
            call = got = timer = None
            if self.config.device == "cuda":  # the next provider finds the device as this one did
                with self.phases("release"):  # (what a kept call holds stays: no collection for it)
                    memory.release("cuda", level=level if kept is None else memory.allocated("cuda"))

    def _keep(self, timer: "_Timer", level: int | None, inputs, held: int) -> "_Timer | None":
        """`timer`, kept for its row's recheck where the case's memory allows (memory.may_keep; on
        a GPU only with memory.KEEP_ON_GPU), else closed (None). The bytes it holds: on a GPU, what
        was allocated since the provider began (its copy of the inputs, a bwd mode's forward graph)
        and its graph's pool; on the CPU, which counts no allocations, its copy of the inputs."""
        device = self.config.device
        if self.config.recheck and (device != "cuda" or memory.KEEP_ON_GPU):
            if device == "cuda":
                timer.held = max(0, memory.allocated(device) - level) + (timer.graph.pool_bytes if timer.graph else 0)
            else:
                timer.held = memory.tensor_bytes(inputs.values())
            if memory.may_keep(held, timer.held, memory.free_bytes(device)):
                return timer
        timer.close()
        return None

    def _settle(self, row: dict, kept: "_Timer | None", make: Callable[[], Callable], t1: stability.Measured) -> None:
        """The stability rule (stability.py) on one ok row: recheck, and re-measure if need be.
        `kept`: the measured call (and its CUDA graph), replayed again; None: a fresh call from
        `make` on fresh copies of the inputs, captured anew (and released after)."""
        key = (row["kernel"], row["mode"], row["provider"])
        level = memory.allocated(self.config.device)
        timer, since = kept, None
        try:
            if timer is None:
                since = memory.snapshot(self.config.device)
                with self.phases("recheck"), self.phases("recheck_fresh"):
                    timer = self._timer(make(), key)
            est = t1.timing.median_ms
            r = self._time(timer, key, self.short, "recheck", est, since)
            verdict = stability.first_verdict(t1, r, self.config.device)
            if verdict is None:
                t2 = self._time(timer, key, self.budget, "recheck", est)
                verdict = stability.second_verdict(t1, r, t2, self.config.device)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # the recheck itself failed: the row cannot vouch for itself
            row.update(status="unstable", error="recheck failed: " + _error_text(e))
            return
        finally:
            if timer is not None:
                timer.close()
            timer = None
            # a kept call's memory goes back with the case's (its pool and copies are the
            # allocator's cache now, nothing new was allocated): no release per row
            if self.config.device == "cuda" and kept is None:
                with self.phases("release"):
                    memory.release("cuda", level=level)
        row.update(status=verdict.status, error=verdict.error, recheck_ms=verdict.recheck_ms)
        _put_timing(row, verdict.timing)

    def _timer(self, call: Callable[[], object], key: tuple[str, str, str]) -> "_Timer":
        """What times `call`: on a GPU its CUDA graph, captured now (unless --no-cuda-graph, or its
        (kernel, mode, provider) failed capture before); else the call itself."""
        if self.config.device == "cuda" and self.config.cuda_graph and key not in self.no_capture:
            failure = None
            try:
                return _Timer(call, timing.Graph.capture(call))
            except Exception as e:  # not capturable (a host sync, say): events, and the row says so
                failure = _error_text(e)
            # outside the except block, so that no traceback keeps the failed capture's memory;
            # never again for this (kernel, mode, provider): a failed capture may leak its pool
            self.no_capture.add(key)
            memory.release("cuda")
            self.warn(f"CUDA-graph capture of {' '.join(key)} failed ({failure}); timed with events")
        return _Timer(call)

    def _time(self, timer: "_Timer", key: tuple[str, str, str], budget: timing.Budget, phase: str = "timing",
              estimate_ms: float | None = None, since: memory.Snapshot | None = None) -> stability.Measured:
        """One measurement of `timer`'s call (its graph's replays where it has one), its seconds
        added to `phase`, with the allocator retries it saw since `since` (taken before the graph
        was captured, whose eager calls are where a measurement allocates; default: now).
        `estimate_ms`: how long a call took before, which spares the interpreter an estimating call,
        and a GPU's recheck its estimating calls."""
        device = self.config.device
        before = since or memory.snapshot(device)
        with self.phases(phase):
            t = self._timing(timer, budget, phase == "timing", estimate_ms)
        self.phases.add("timed_work", t.reps * t.median_ms / 1e3)
        return stability.Measured(t, memory.snapshot(device).retries - before.retries)

    def _timing(self, timer: "_Timer", budget, first: bool, estimate_ms: float | None) -> timing.Timing:
        if self.config.device != "cuda":
            return timing.time_cpu(timer.call, budget, estimate_ms)
        # a recheck's estimate is the first measurement's median: it spares the estimating calls
        # (the first measurement's own is its first call, compile and all: not an estimate there)
        estimate_ms = None if first else estimate_ms
        clock = lambda: memory.clock_mhz("cuda")  # noqa: E731
        if timer.graph is not None:
            return timer.graph.time(budget, self.flush, clock=clock, estimate_ms=estimate_ms)
        return timing.time_cuda(timer.call, budget, self.flush, clock=clock, estimate_ms=estimate_ms)

    def _row(self, case: Case, mode: str, provider: str, **fields) -> dict[str, Any]:
        self.seq += 1
        return make_row(self.run_id, self.seq, case, mode, provider, **fields)


def make_row(run_id: str, seq: int, case: Case, mode: str, provider: str, *, status: str, error: str | None = None,
             rel_err: float | None = None, tolerance: float | None = None, config: str | None = None) -> dict[str, Any]:
    """A result row without timings (those are added when it is timed)."""
    spec, dims = case.spec, case.shape.dims
    declared = spec.provider(provider)
    return dict(run_id=run_id, kernel=spec.name, mode=mode, provider=provider, shape=case.shape.label,
                ours=declared.ours, package=declared.package,
                dims=json.dumps(dict(dims)), dtype=DTYPE_NAMES[case.dtype], baseline=spec.baseline,
                bound=spec.bound, status=status, error=error, rel_err=_finite(rel_err), tolerance=tolerance,
                bytes=int(spec.bytes_moved(dims, case.dtype, mode)), flops=float(spec.flops(dims, mode)),
                config=config, seq=seq, tokens=int(spec.tokens(dims)) if spec.tokens else None)


@dataclass
class _Timer:
    """How one call is timed, as often as asked: its CUDA graph's replays, or the call itself
    (CUDA events where it cannot be captured, the CPU's clock). Kept from a row's measurement to its
    recheck where the case's memory allows (Runner._keep), so that the recheck only replays."""
    call: Callable[[], object] | None  # holds its copy of the inputs (and a bwd mode's forward graph)
    graph: timing.Graph | None = None
    held: int = 0  # the bytes it holds while kept

    def close(self) -> None:
        """Its graph's pool and its call's tensors back to the allocator (each close after the first: nothing)."""
        if self.graph is not None:
            self.graph.close()
        self.call = self.graph = None


def _maker(spec, fn, inputs, mode, dys) -> Callable[[], Callable]:
    """A fresh call on fresh copies of the inputs, for the recheck at the end of the case of a row
    whose measured call was not kept (Runner._keep: its memory would have been too much)."""
    return lambda: verify.build_call(spec, fn, verify.clone_inputs(inputs), mode, dys)


def _put_timing(row: dict, t: timing.Timing) -> None:
    row.update(timing=t.method, median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, mean_ms=t.mean_ms,
               std_ms=t.std_ms, min_ms=t.min_ms, reps=t.reps, peak_mem_bytes=t.peak_bytes, clock_mhz=t.clock_mhz,
               p99_ms=t.p99_ms, max_ms=t.max_ms)


def _finite(x: float | None) -> float | None:
    # DuckDB stores inf, but JSON and the site do not like it: an infinite error is NaN/Inf output,
    # and the status and error text already say so.
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else x


def _warm_compile_workers() -> None:
    """Start inductor's pool of compile processes now, while the ceilings are measured: it builds
    torch.compile's Triton kernels in parallel, and would otherwise start at the first compile."""
    try:
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.warm_pool()
    except Exception:  # an optimisation only: compile starts the pool itself when it must
        pass


def _raise_recompile_limit() -> None:
    """compile specialises on every shape (dynamic=False); dynamo's default limit of 8 graphs per
    function would otherwise fall back to eager silently after the eighth shape. Also: no donated
    buffers in compiled backwards, as a bwd row replays one graph's backward (retain_graph): with
    them, AOTAutograd refuses that replay, and compile's bwd rows of the RTU and the selective scan
    were errors at some shapes in 8 H200 runs and 1 H100 run."""
    import torch._dynamo
    import torch._functorch.config

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)
    if hasattr(torch._functorch.config, "donated_buffer"):
        torch._functorch.config.donated_buffer = False
