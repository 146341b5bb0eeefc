"""Measuring a plan: in this process (the CPU), or in worker processes (one per GPU, or several on
the CPU), with the rows written to the one store as each case ends.

Workers do not open the store: each sends its run, rows and breakdown to this process, which alone
writes the --db file. DuckDB lets one process write a file at a time, so separate files per worker
would need a merge at the end, and a run killed before the merge would leave its rows scattered;
through the parent every row is in the store the moment its case ends, whichever worker measured it.
The parent also watches each worker: one that dies, or hangs, inside a measurement leaves an `error`
row for it, and a fresh process continues its run (run_workers). Each worker measures its own device's
ceilings and writes its own run, keyed by its device (runs.device_index), so that one GPU's numbers
are never divided by another's copy bandwidth.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .environment import Commit
from .phases import combined, of_lifetime
from .profiling import profiled
from .progress import Progress
from .plan import Case, RunConfig
from .runner import Runner, _now, make_row
from .spawn import start_quietly
from .store import Store, StoreError
from .worker_log import Tail, redirect, written


@dataclass
class Outcome:
    status: str = "unfinished"  # 'finished', 'interrupted' or 'unfinished'
    rows: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, Any] = field(default_factory=dict)  # run_id -> Run
    phases: dict[str, str] = field(default_factory=dict)  # run_id -> phases JSON
    errors: list[str] = field(default_factory=list)
    envs: dict[str, Any] = field(default_factory=dict)  # env_id -> Environment of its runs


def _trap(on_signal: Callable[[int], None]) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: on_signal(signum))


Task = tuple[int, "frozenset[tuple[str, str]] | None"]  # a case's index, and just these (mode, provider)


def _measure(runner: Runner, open_run: Callable[[], Any], cases: list[Case], next_task: Callable[[], Task | None],
             signals: list[int], current: list[int], resuming: bool = False) -> str:
    """Open the run once there is a case for it (a worker left without work writes no run; one
    that continues a run opens it at once, to finish it whatever is left), measure cases until
    there are none (or a signal), finish it; the status. Profiled with --profile."""
    with profiled(runner.config.profile, lambda: runner.run_id):
        return _measure_run(runner, open_run, cases, next_task, signals, current, resuming)


def _measure_run(runner: Runner, open_run: Callable[[], Any], cases: list[Case],
                 next_task: Callable[[], Task | None], signals: list[int], current: list[int], resuming: bool) -> str:
    status, started = "unfinished", False
    try:
        if resuming:
            open_run()
            started = True
        task = next_task()
        if task is None and not started:
            return "finished"
        if not started:
            open_run()
            started = True
        while task is not None:
            current[0] = task[0]
            runner.run_case(cases[task[0]], task[1])
            if signals:  # a library can swallow the KeyboardInterrupt the handler raised
                raise KeyboardInterrupt
            task = next_task()
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
             started: float | None = None, ahead_s: float = 0.0, skips: dict | None = None,
             previous: dict | None = None) -> Outcome:
    """`ahead_s`: seconds the precompile pass took since `started` (its own line in the breakdown);
    `skips`: Runner.skips (a build that crashed the pass would end this process); `previous`:
    Runner.previous."""
    out = Outcome()
    signals: list[int] = []
    _trap(_raise_once(signals))
    runner = Runner(config, _Recording(store, out, progress), device_index, started)
    runner.skips, runner.previous = skips or {}, previous or {}
    if ahead_s:  # not set-up: its own line
        runner.phases.add("setup", -ahead_s)
        runner.phases.add("precompile", ahead_s)
    runner.warn = warn
    runner.progress = progress.event
    todo = iter([(i, None) for i in indices])
    try:
        out.status = _measure(runner, lambda: runner.start(commit), cases, lambda: next(todo, None), signals, [0])
    except StoreError as e:
        out.errors.append(str(e))
    return out


class _Recording:
    """A sink that writes to the store and keeps what the end-of-run report needs."""

    def __init__(self, store: Store, out: Outcome, progress: Progress):
        self.store, self.out, self.progress = store, out, progress

    def add_environment(self, env) -> None:
        self.out.envs[env.env_id] = env
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
    visible: str | None  # CUDA_VISIBLE_DEVICES for the worker; None: this process's own (CPU, one GPU)
    device_index: int | None


class _PipeSink:
    """A worker's records to its parent, each written to the pipe before the call returns: what
    was sent before the process died is in the pipe, not in a queue's buffer that a feeder thread
    (starved by a compiler holding the GIL) never wrote. Ctrl-C waits until a message is whole."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, kind: str, payload=None) -> None:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
        try:
            self.conn.send((kind, payload))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def add_environment(self, env) -> None:
        self.send("env", env)

    def start_run(self, run) -> None:
        self.send("start", run)

    def add_results(self, rows) -> None:
        self.send("rows", rows)

    def finish_run(self, run_id, status, finished_at, phases=None) -> None:
        self.send("finish", (run_id, status, finished_at, phases))


def _worker(spec: WorkerSpec, config: RunConfig, commit: Commit, kernel_modules, conn, resume,
            stderr_path: str, skips: dict, previous: dict) -> None:
    """Measures the tasks its parent hands it, one at a time, asking for more ("want")
    until it gets None. `resume`: (run, seq) of the run a dead predecessor opened, to continue, or
    None. `stderr_path`: the file its standard error goes to (worker_log.py). `skips`, `previous`: Runner's."""
    started = time.perf_counter()
    redirect(stderr_path)  # the parent forwards it, and quotes its end if this process dies
    if spec.visible is not None:  # before anything touches CUDA in this process
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.visible
    out = _PipeSink(conn)
    signals: list[int] = []
    _trap(_raise_once(signals))
    status = "unfinished"
    try:
        import torch

        from .common import load_registry
        from .plan import plan

        if config.device == "cpu" and config.workers > 1:  # workers share the cores: a thread each
            torch.set_num_threads(1)

        registry = load_registry(config.device, kernel_modules)
        cases = plan([registry.get(n) for n in config.kernels], config)
        current = [0]
        runner = Runner(config, out, spec.device_index, started)
        runner.skips, runner.previous = skips, previous
        runner.warn = lambda message: out.send("warn", message)

        def progress(kind, case, mode, prov):
            if kind == "case":  # where its output about this case begins
                out.send("mark", written())
            out.send("progress", (kind, current[0], mode, prov))

        runner.progress = progress
        runner.on_row = lambda row: out.send("row", row)
        pending: list[Task] = []

        def next_task() -> Task | None:
            out.send("phases", runner.phases.to_json())  # the breakdown so far, should this process die
            if not pending:
                out.send("want")
                pending.extend(conn.recv() or ())
            return pending.pop(0) if pending else None

        open_run = (lambda: runner.resume(*resume)) if resume else (lambda: runner.start(commit))
        status = _measure(runner, open_run, cases, next_task, signals, current, resuming=resume is not None)
    except KeyboardInterrupt:
        status = "interrupted"
    except BaseException as e:  # one line to the parent, which prints it; the run stays unfinished
        out.send("warn", f"worker failed: {type(e).__name__}: {e}")
    finally:
        out.send("exit", status)


def run_workers(config: RunConfig, commit: Commit, cases: list[Case], tasks_: list[list[int]], store: Store,
                progress: Progress, warn: Callable[[str], None], workers: list[WorkerSpec], kernel_modules,
                grace_s: float = 60.0, ahead_s: float = 0.0, skips: dict | None = None,
                previous: dict | None = None) -> Outcome:
    """Each worker is handed the next task (a case on several GPUs, otherwise a whole kernel: see
    schedule.tasks) until none is left. A worker that dies inside a case, or that says nothing
    for config.measure_timeout seconds there (then it is killed), leaves an `error` row for the
    measurement it was in; its rows so far are kept, and a fresh process continues its run with
    the rest. Ctrl-C or SIGTERM here is forwarded to every worker, which marks its run
    interrupted; what they send meanwhile is still written; a worker that has not ended `grace_s`
    after (or at a second signal) is killed, its rows so far kept. `ahead_s`: the seconds the
    precompile pass took before the workers started, added to each run's breakdown and wall time.
    `skips`: the builds that hung or crashed that pass's process, which the workers record as
    errors without calling them (Runner.skips); `previous`: Runner.previous."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    parent = _Parent(store, progress, cases, warn, [[(i, None) for i in g] for g in tasks_], len(workers) > 1)
    parent.ahead_s = ahead_s
    signals: list[float] = []  # when each came
    # the parent never raises: it forwards, then keeps writing what arrives
    _trap(lambda signum: signals.append(time.monotonic()))

    logs = tempfile.mkdtemp(prefix="kcollect-workers-")

    def start(slot: _Slot) -> None:
        if slot.proc is not None:  # a fresh process in the place of one that died
            slot.proc.join()
            slot.conn.close()
        mine, theirs = ctx.Pipe()
        resume = (slot.run, slot.seq) if slot.run is not None else None
        slot.tail = slot.tail or Tail(os.path.join(logs, f"{slot.spec.name}.stderr"))
        slot.proc = ctx.Process(target=_worker, name=f"kcollect-{slot.spec.name}",
                                args=(slot.spec, config, commit, kernel_modules, theirs, resume, slot.tail.path,
                                      skips or {}, previous or {}))
        start_quietly(slot.proc)  # no traceback from its start-up on a Ctrl-C (spawn.py)
        theirs.close()  # so that the worker's death reads as the end of the pipe
        slot.conn, slot.killed, slot.born, slot.phases = mine, None, time.monotonic(), None

    slots = parent.slots = [_Slot(w) for w in workers]
    for slot in slots:
        start(slot)
    forwarded_at = None
    while live := [s for s in slots if s.status is None]:
        if signals and forwarded_at is None:
            forwarded_at = time.monotonic()
            _signal_all(live, signal.SIGTERM)
        if forwarded_at is not None and (_repeated(signals) or time.monotonic() - forwarded_at > grace_s):
            _signal_all(live, signal.SIGKILL)
        for slot in live if not signals else ():
            slot.overdue(config.measure_timeout, time.monotonic())
        wait([s.conn for s in live] + [s.proc.sentinel for s in live], timeout=0.5)
        for slot in live:
            slot.tail.forward()
            alive = slot.proc.is_alive()  # before reading: what it sent before it ended is read now
            try:
                parent.drain(slot)
                if slot.status is None and not alive and parent.died(slot, bool(signals)):
                    start(slot)
            except StoreError as e:
                parent.out.errors.append(str(e))
                signals.append(time.monotonic())
    for slot in slots:
        slot.proc.join(timeout=5)
        slot.tail.forward()
    shutil.rmtree(logs, ignore_errors=True)
    out = parent.out
    out.status = ("interrupted" if signals and not out.errors else
                  "finished" if all(s.status == "finished" for s in slots) else "unfinished")
    return out


# Signals this close to the first are one signal sent twice: `timeout` (and a job scheduler) signals
# the whole process group, and a wrapper script that forwards it to its child adds a second copy
# within milliseconds. Counted as a second signal, it killed the workers of a run on four H100s
# before they could mark their runs interrupted with their breakdowns.
REPEAT_S = 0.25


def _repeated(signals: list[float]) -> bool:
    """Whether a second signal came (REPEAT_S or more after the first): kill what has not stopped."""
    return any(t - signals[0] >= REPEAT_S for t in signals[1:])


def _signal_all(slots: list[_Slot], sig) -> None:
    for slot in slots:
        if slot.proc.pid is not None and slot.proc.is_alive():
            os.kill(slot.proc.pid, sig)


@dataclass
class _Slot:
    """One worker's place: its process now, the run it writes, and what it holds."""
    spec: WorkerSpec
    proc: Any = None
    conn: Any = None
    run: Any = None  # its run once opened: a fresh process in its place continues it
    seq: int = 0  # the last row number of the run
    held: list[Task] = field(default_factory=list)  # handed to the process, not yet begun
    case: Task | None = None  # the task in progress
    kernel: str | None = None  # the kernel of the task it was handed last
    rows: list[dict[str, Any]] = field(default_factory=list)  # that case's rows so far
    doing: tuple[str, str, str] | None = None  # ('start' or 'recheck', mode, provider) in progress
    since: float = 0.0  # when it last said what it is doing
    tail: Tail | None = None  # its standard error (worker_log.py)
    born: float = 0.0  # when its process started
    phases: str | None = None  # the breakdown its process last reported
    dead: list[dict[str, float]] = field(default_factory=list)  # the breakdowns of its dead processes
    killed: str | None = None  # why the parent killed it
    status: str | None = None  # how it ended

    def overdue(self, limit: float | None, now: float) -> None:
        """Kills the process if it has said nothing for `limit` seconds at `now` (time.monotonic's)."""
        if limit and self.case is not None and self.killed is None and now - self.since > limit:
            self.killed = f"no result within {limit:g} s"
            os.kill(self.proc.pid, signal.SIGKILL)


def _death(slot: _Slot) -> str:
    code = slot.proc.exitcode
    if slot.killed:
        return slot.killed
    if code is not None and code < 0:
        try:
            reason = f"the measuring process died: signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            reason = f"the measuring process died: signal {-code}"
    else:
        reason = f"the measuring process died: exit code {code}"
    said = slot.tail.last_line() if slot.tail is not None else None
    return f"{reason}; its last words: {said}" if said else reason


class _Parent:
    """Writes what the workers send, as it arrives, and hands out the tasks."""

    def __init__(self, store: Store, progress: Progress, cases: list[Case], warn: Callable[[str], None],
                 todo: list[list[Task]], named: bool):
        self.store, self.progress, self.cases, self.warn = store, progress, cases, warn
        self.todo = todo
        self.slots: list[_Slot] = []  # every worker's place (run_workers fills it)
        self.named = named  # progress lines name the worker (several of them)
        self.out = Outcome()
        self.store_s: dict[str, float] = {}  # worker -> seconds spent writing its rows here
        self.ahead_s = 0.0  # the precompile pass's seconds, before any worker started

    def _with_mine(self, phases: str | None, worker: str) -> str | None:
        return _with_parent_seconds(phases, self.store_s.get(worker, 0.0), self.ahead_s)

    def _next_for(self, slot: _Slot) -> int:
        """Which task of the to-do list a worker takes: the next case of the kernel it is on; else
        the first of a kernel no worker is on; else the first left (the workers then share the last
        kernels and end within a case of each other). Each worker that takes up a kernel pays its
        first calls (loading its builds, torch.compile's first trace), so the kernels are shared
        only at the end: on two H100s with warm caches, cases dealt out in plan order had both
        workers pay them for every kernel (first calls 24 s each, 34 s for one worker alone)."""
        kernels = [self.cases[task[0][0]].spec.name for task in self.todo]
        if slot.kernel in kernels:
            return kernels.index(slot.kernel)
        busy = {s.kernel for s in self.slots if s is not slot}
        return next((k for k, name in enumerate(kernels) if name not in busy), 0)

    def drain(self, slot: _Slot) -> None:
        while slot.status is None:
            try:
                if not slot.conn.poll():
                    return
                kind, payload = slot.conn.recv()
            except (EOFError, OSError):  # the worker is gone, mid-message perhaps
                return
            self.dispatch(slot, kind, payload)

    def dispatch(self, slot: _Slot, kind: str, payload) -> None:
        name = slot.spec.name
        who = name if self.named else None
        if kind == "progress":
            event, index, mode, provider = payload
            slot.since = time.monotonic()
            if event == "case":
                slot.case, slot.rows, slot.doing = slot.held.pop(0), [], None
                return
            slot.doing = None if event == "end" else (event, mode, provider)
            self.progress.event(event, self.cases[index], mode, provider, worker=who)
        elif kind == "row":
            slot.rows.append(payload)
        elif kind == "phases":
            slot.phases = payload
        elif kind == "mark":
            slot.tail.mark(payload)
        elif kind == "want":
            if not slot.held and self.todo:
                slot.held = self.todo.pop(self._next_for(slot))
                slot.kernel = self.cases[slot.held[0][0]].spec.name
            slot.conn.send(list(slot.held) or None)
        elif kind == "env":
            self.out.envs[payload.env_id] = payload
            self.store.add_environment(payload)
        elif kind == "start":
            slot.run = self.out.runs[payload.run_id] = payload
            self.store.start_run(payload)
            self.progress.run_started(payload, who)
        elif kind == "rows":
            slot.case, slot.rows, slot.doing = None, [], None
            self._keep(slot, payload)
        elif kind == "finish":
            run_id, status, finished_at, phases = payload
            phases = self._with_mine(combined(phases, slot.dead), name)
            self.out.phases[run_id] = phases
            self.store.finish_run(run_id, status, finished_at, phases)
        elif kind == "warn":
            self.warn(f"{name}: {payload}")
        elif kind == "exit":
            slot.status = payload
            self._keep(slot, slot.rows)  # an interrupted case's rows so far

    def _keep(self, slot: _Slot, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        t0 = time.perf_counter()
        self.store.add_results(rows)
        name = slot.spec.name
        self.store_s[name] = self.store_s.get(name, 0.0) + time.perf_counter() - t0
        self.out.rows.extend(rows)
        slot.seq = max(slot.seq, *(r["seq"] for r in rows))

    def died(self, slot: _Slot, stopping: bool) -> bool:
        """Rows for a worker that ended without a word; whether a fresh process takes its place
        (it died inside a case, and the run is not being stopped)."""
        reason, rows, slot.rows = _death(slot), slot.rows, []
        if slot.run is not None:  # what it did counts in the run's breakdown, which others continue
            slot.dead.append(of_lifetime(slot.phases, time.monotonic() - slot.born))
        if slot.case is None or stopping:
            if not (stopping and slot.run is None):  # stopped before it began: nothing to say
                self.warn(f"{slot.spec.name} ended without a word ({reason}); its rows so far are kept")
            self._keep(slot, rows)
            if slot.held:
                self.todo.insert(0, slot.held)  # for another worker, if one is left
            if stopping and slot.run is not None:  # killed when it did not stop in time: its run was stopped
                phases = self._with_mine(combined(None, slot.dead), slot.spec.name)
                self.store.finish_run(slot.run.run_id, "interrupted", _now(), phases)
            slot.status = "unfinished"
            return False
        (index, only), case = slot.case, self.cases[slot.case[0]]
        pairs = [(m, p) for m in case.modes for p in case.providers if only is None or (m, p) in only]
        done = {(r["mode"], r["provider"]) for r in rows}
        event, mode, provider = slot.doing or ("", "", "")
        if event == "recheck":  # as Runner._settle does when a recheck raises
            failed = []
            for r in rows:
                if (r["mode"], r["provider"]) == (mode, provider):
                    r.update(status="unstable", error=f"recheck failed: {reason}")
        else:  # the measurement it was in, or the whole case if it died between measurements
            failed = [p for p in ([(mode, provider)] if event == "start" else pairs) if p not in done]
        seq = max([slot.seq, *(r["seq"] for r in rows)])
        for i, (m, p) in enumerate(failed, 1):
            rows.append(make_row(slot.run.run_id, seq + i, case, m, p, status="error", error=reason))
            self.progress.event("end", case, m, p, worker=slot.spec.name if self.named else None)
        what = f"{case.label} {mode} {provider}" if event else case.label
        self.warn(f"{slot.spec.name}: {what}: {reason}; the rest goes on in a fresh process")
        self._keep(slot, rows)
        left = [p for p in pairs if p not in done and p not in failed]
        slot.held = ([(index, frozenset(left))] if left else []) + slot.held
        slot.case, slot.doing = None, None
        return True


def _with_parent_seconds(phases: str | None, store_s: float, ahead_s: float) -> str | None:
    """A worker's breakdown plus the parent's seconds writing its rows (spent while it measured)
    and building ahead (before it started: added to its wall time too)."""
    if not phases:
        return phases
    data = json.loads(phases)
    data["store"] = round(data.get("store", 0.0) + store_s, 3)
    if ahead_s:
        data["precompile"] = round(ahead_s, 3)
        data["wall"] = round(data.get("wall", 0.0) + ahead_s, 3)
    return json.dumps(data, sort_keys=True)
