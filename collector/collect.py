"""Measuring a plan: in this process, or spread over worker processes (one per GPU, or several on
the CPU for testing), with the rows written to the one store as each case ends.

Workers do not open the store: each sends its run, rows and breakdown to this process, which alone
writes the --db file. DuckDB lets one process write a file at a time, so separate files per worker
would need a merge at the end, and a run killed before the merge would leave its rows scattered;
through the parent every row is in the store the moment its case ends, whichever worker measured it,
and a worker that dies loses only the case it was in. Each worker measures its own device's
ceilings and writes its own run, keyed by its device (runs.device_index), so that one GPU's numbers
are never divided by another's copy bandwidth.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .environment import Commit
from .progress import Progress
from .plan import Case, RunConfig
from .runner import Runner
from .store import Store, StoreError


@dataclass
class Outcome:
    status: str = "unfinished"  # 'finished', 'interrupted' or 'unfinished'
    rows: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, Any] = field(default_factory=dict)  # run_id -> Run
    phases: dict[str, str] = field(default_factory=dict)  # run_id -> phases JSON
    errors: list[str] = field(default_factory=list)


def _trap(on_signal: Callable[[int], None]) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: on_signal(signum))


def _measure(runner: Runner, commit: Commit, cases: list[Case], next_index: Callable[[], int | None],
             signals: list[int], current: list[int]) -> str:
    """Start the run once there is a case for it (a worker left without work writes no run),
    measure cases until there are none (or a signal), finish it; the status."""
    status, started = "unfinished", False
    try:
        i = next_index()
        if i is None:
            return "finished"
        runner.start(commit)
        started = True
        while i is not None:
            current[0] = i
            runner.run_case(cases[i])
            if signals:  # a library can swallow the KeyboardInterrupt the handler raised
                raise KeyboardInterrupt
            i = next_index()
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
    except Exception:
        if not signals:
            raise
        status = "interrupted"  # the signal surfaced as a library's own exception
    finally:
        if started:
            runner.finish(status)
    return status


def _raise_once(signals: list[int]) -> Callable[[int], None]:
    """Ctrl-C and SIGTERM (a scheduler's time limit) end the run, rows kept, run marked. Raised
    once: a second signal while the run is being marked must not interrupt the marking."""
    def on_signal(signum: int) -> None:
        signals.append(signum)
        if len(signals) == 1:
            raise KeyboardInterrupt
    return on_signal


def run_here(config: RunConfig, commit: Commit, cases: list[Case], indices: list[int], store: Store,
             progress: Progress, warn: Callable[[str], None], device_index: int | None,
             started: float | None = None) -> Outcome:
    out = Outcome()
    signals: list[int] = []
    _trap(_raise_once(signals))
    runner = Runner(config, _Recording(store, out, progress), device_index, started)
    runner.warn = warn
    runner.progress = progress.event
    todo = iter(indices)
    try:
        out.status = _measure(runner, commit, cases, lambda: next(todo, None), signals, [0])
    except StoreError as e:
        out.errors.append(str(e))
    return out


class _Recording:
    """A sink that writes to the store and keeps what the end-of-run report needs."""

    def __init__(self, store: Store, out: Outcome, progress: Progress):
        self.store, self.out, self.progress = store, out, progress

    def add_environment(self, env) -> None:
        self.store.add_environment(env)

    def start_run(self, run) -> None:
        self.out.runs[run.run_id] = run
        self.store.start_run(run)
        self.progress.run_started(run)

    def add_results(self, rows) -> None:
        self.out.rows.extend(rows)
        self.store.add_results(rows)

    def finish_run(self, run_id, status, finished_at, phases=None) -> None:
        self.out.phases[run_id] = phases
        try:
            self.store.finish_run(run_id, status, finished_at, phases)
        except StoreError:
            pass  # the store already failed; the rows written before are kept


# -- worker processes ---------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerSpec:
    name: str  # 'gpu0', 'cpu1': the progress prefix
    visible: str | None  # CUDA_VISIBLE_DEVICES for the worker, None on the CPU
    device_index: int | None


class _QueueSink:
    def __init__(self, q, name: str):
        self.q, self.name = q, name

    def add_environment(self, env) -> None:
        self.q.put(("env", self.name, env))

    def start_run(self, run) -> None:
        self.q.put(("start", self.name, run))

    def add_results(self, rows) -> None:
        self.q.put(("rows", self.name, rows))

    def finish_run(self, run_id, status, finished_at, phases=None) -> None:
        self.q.put(("finish", self.name, (run_id, status, finished_at, phases)))


def _worker(spec: WorkerSpec, config: RunConfig, commit: Commit, kernel_modules, tasks, results) -> None:
    started = time.perf_counter()
    if spec.visible is not None:  # before anything touches CUDA in this process
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.visible
    signals: list[int] = []
    _trap(_raise_once(signals))
    status = "unfinished"
    try:
        import torch

        from .common import load_registry
        from .plan import plan

        if spec.visible is None:  # CPU workers share the cores: a thread each, not a pool each
            torch.set_num_threads(1)

        registry = load_registry(config.device, kernel_modules)
        cases = plan([registry.get(n) for n in config.kernels], config)
        current = [0]
        runner = Runner(config, _QueueSink(results, spec.name), spec.device_index, started)
        runner.warn = lambda message: results.put(("warn", spec.name, message))
        runner.progress = lambda kind, case, mode, prov: results.put(
            ("progress", spec.name, (kind, current[0], mode, prov)))
        pending: list[int] = []

        def next_index() -> int | None:  # one kernel's cases at a time (schedule.groups)
            if not pending:
                pending.extend(tasks.get() or ())
            return pending.pop(0) if pending else None

        status = _measure(runner, commit, cases, next_index, signals, current)
    except KeyboardInterrupt:
        status = "interrupted"
    except BaseException as e:  # one line to the parent, which prints it; the run stays unfinished
        results.put(("warn", spec.name, f"worker failed: {type(e).__name__}: {e}"))
    finally:
        results.put(("exit", spec.name, status))


def run_workers(config: RunConfig, commit: Commit, cases: list[Case], tasks_: list[list[int]], store: Store,
                progress: Progress, warn: Callable[[str], None], workers: list[WorkerSpec], kernel_modules,
                grace_s: float = 60.0) -> Outcome:
    """Workers pull one kernel's case indices at a time from one queue (largest kernel first, see
    schedule.groups) until it is empty. Ctrl-C or SIGTERM here is forwarded to every worker, which
    marks its run interrupted; what they send meanwhile is still written; a worker that has not
    ended `grace_s` after (or at a second signal) is killed, its rows so far kept."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    tasks, results = ctx.Queue(), ctx.Queue()
    for task in [*tasks_, *(None for _ in workers)]:
        tasks.put(task)
    parent = _Parent(store, progress, cases, warn)
    signals: list[int] = []
    _trap(signals.append)  # the parent never raises: it forwards, then keeps writing what arrives
    procs = {w.name: ctx.Process(target=_worker, args=(w, config, commit, kernel_modules, tasks, results),
                                 name=f"kcollect-{w.name}") for w in workers}
    for p in procs.values():
        p.start()
    forwarded_at = None
    while len(parent.statuses) < len(procs):
        if signals and forwarded_at is None:
            forwarded_at = time.monotonic()
            _signal_all(procs, parent.statuses, signal.SIGTERM)
        if forwarded_at is not None and (len(signals) > 1 or time.monotonic() - forwarded_at > grace_s):
            _signal_all(procs, parent.statuses, signal.SIGKILL)
        try:
            message = results.get(timeout=0.5)
        except queue.Empty:
            for name, p in procs.items():
                if name not in parent.statuses and not p.is_alive():
                    warn(f"{name} ended without a word (exit code {p.exitcode}); its rows so far are kept")
                    parent.statuses[name] = "unfinished"
            continue
        try:
            parent.dispatch(*message)
        except StoreError as e:
            parent.out.errors.append(str(e))
            signals.append(signal.SIGTERM)
    for p in procs.values():
        p.join(timeout=5)
    out = parent.out
    out.status = ("interrupted" if signals and not out.errors else
                  "finished" if all(s == "finished" for s in parent.statuses.values()) else "unfinished")
    return out


def _signal_all(procs, statuses, sig) -> None:
    for name, p in procs.items():
        if name not in statuses and p.pid is not None and p.is_alive():
            os.kill(p.pid, sig)


class _Parent:
    """Writes what the workers send, as it arrives."""

    def __init__(self, store: Store, progress: Progress, cases: list[Case], warn: Callable[[str], None]):
        self.store, self.progress, self.cases, self.warn = store, progress, cases, warn
        self.out = Outcome()
        self.statuses: dict[str, str] = {}  # worker -> its final status
        self.store_s: dict[str, float] = {}  # worker -> seconds spent writing its rows here

    def dispatch(self, kind: str, name: str, payload) -> None:
        if kind == "progress":
            event, index, mode, provider = payload
            self.progress.event(event, self.cases[index], mode, provider, worker=name)
        elif kind == "env":
            self.store.add_environment(payload)
        elif kind == "start":
            self.out.runs[payload.run_id] = payload
            self.store.start_run(payload)
            self.progress.run_started(payload, name)
        elif kind == "rows":
            t0 = time.perf_counter()
            self.store.add_results(payload)
            self.store_s[name] = self.store_s.get(name, 0.0) + time.perf_counter() - t0
            self.out.rows.extend(payload)
        elif kind == "finish":
            run_id, status, finished_at, phases = payload
            phases = _with_store_seconds(phases, self.store_s.get(name, 0.0))
            self.out.phases[run_id] = phases
            self.store.finish_run(run_id, status, finished_at, phases)
        elif kind == "warn":
            self.warn(f"{name}: {payload}")
        elif kind == "exit":
            self.statuses[name] = payload


def _with_store_seconds(phases: str | None, seconds: float) -> str | None:
    """A worker's breakdown plus the parent's seconds writing its rows (spent while it measured)."""
    if not phases:
        return phases
    data = json.loads(phases)
    data["store"] = round(data.get("store", 0.0) + seconds, 3)
    return json.dumps(data, sort_keys=True)
