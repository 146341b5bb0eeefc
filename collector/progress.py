"""Progress of a run, per provider measurement, with an ETA from the plan's estimated costs.

On a terminal one status line is rewritten as each provider starts and ends; elsewhere (CI logs,
a device's captured output) a line every SPARSE_S seconds. Verbose (`kcollect run --verbose`), one
line per finished measurement as well, with its seconds, so that a log shows where the time went
(a full grid is over a thousand of them). The ETA starts from the estimates (schedule.estimator: each
measurement's seconds in the last run on this machine, else the plan's) and is rescaled by the
ratio of observed to estimated time as measurements finish.
"""
from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

from .plan import Case
from .schedule import Cost, unit_cost


OBSERVED_AFTER = 5  # measurements before the observed rate replaces the plan's estimate
SPARSE_S = 30.0  # without a terminal and --verbose: a progress line at most this often


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    def __init__(self, cases: list[Case], device: str, workers: int = 1, out: TextIO | None = None,
                 tty: bool | None = None, cost: Cost | None = None, known: int = 0, verbose: bool = True,
                 overhead: dict[str, tuple[float | None, str]] | None = None):
        """`cost`: each measurement's estimated seconds (default: the plan's); `known`: how many of
        them come from a past run; `verbose`: a line per finished measurement; `overhead`: the
        run's parts outside its measurements (schedule.overhead), for the plan's line."""
        self.device, self.workers, self.verbose = device, max(1, workers), verbose
        self.out = out or sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self.cost = cost or (lambda case, mode, provider: unit_cost(case, mode, provider, device))
        self.known = known
        self.overhead = overhead or {}
        self.total_est = sum(self.cost(c, m, p) for c in cases for m in c.modes for p in c.providers)
        self.units = sum(len(c.modes) * len(c.providers) for c in cases)
        self.done_est = 0.0
        self.done = 0
        self.started = time.perf_counter()
        self.said = self.started  # when the last sparse line was printed
        self.first: float | None = None  # when the first measurement started (set-up done)
        self.began: dict[object, float] = {}  # worker -> when its current measurement started

    def plan_line(self) -> str:
        """The estimated wall time and its parts: measuring, then the overhead's."""
        past = f", {self.known} of them from the last run here" if self.known else ""
        measuring = self.total_est / self.workers
        parts = [f"measuring {_clock(measuring)} ({'one worker' if self.workers == 1 else f'{self.workers} workers'}"
                 f"{past})"]
        parts += [f"{name} {'not estimated' if s is None else _clock(s)} ({what})"
                  for name, (s, what) in self.overhead.items()]
        total = measuring + sum(s or 0.0 for s, _ in self.overhead.values())
        return f"{self.units} measurements; estimated {_clock(total)}: {', '.join(parts)}"

    def eta(self) -> float:
        """The plan's estimate until a few measurements are in, then the estimate scaled by the
        observed rate since the first measurement began: the set-up before it (imports, the
        ceilings, each worker's start) once made a 5-minute run announce 3 hours."""
        remaining = self.total_est - self.done_est
        if self.done < OBSERVED_AFTER or self.first is None or self.done_est <= 0:
            return remaining / self.workers
        return remaining * (time.perf_counter() - self.first) / self.done_est

    def event(self, kind: str, case: Case, mode: str, provider: str, worker: object = None) -> None:
        """kind 'start' or 'end' of one (case, mode, provider) measurement; the runner's other
        events ('case', 'recheck') are for a worker's parent, which watches for hangs."""
        if kind not in ("start", "end"):
            return
        now = time.perf_counter()
        who = f"{worker} " if worker is not None else ""
        what = f"{case.label} {mode} {provider}"
        if kind == "start":
            self.began[worker] = now
            self.first = now if self.first is None else self.first
            if self.tty:
                self._status(f"[{self.done + 1}/{self.units}] {who}{what}")
            return
        self.done += 1
        self.done_est += self.cost(case, mode, provider)
        took = now - self.began.pop(worker, now)
        tail = f"{_clock(now - self.started)} elapsed, ETA {_clock(self.eta())}"
        if self.verbose:
            self.say(f"[{self.done}/{self.units}] {who}{what}  {took:.1f} s | {tail}")
        elif not self.tty and (now - self.said >= SPARSE_S or self.done == self.units):
            self.said = now
            self.say(f"[{self.done}/{self.units}] {100 * self.done // self.units}% | {tail}")
        if self.tty:
            self._status(f"[{self.done}/{self.units}] {who}{what} | {tail}")

    def run_started(self, run, worker: object = None) -> None:
        """The line that says a run began, on which machine, and its measured ceilings."""
        who = f"{worker}: " if worker is not None else ""
        self.say(f"{who}run {run.run_id[:8]} on {run.machine}: copy {run.copy_gbps:.0f} GB/s, "
                 f"matmul {run.matmul_tflops:.1f} TFLOP/s")

    def say(self, text: str) -> None:
        if self.tty:
            self._status("")
            print("\r", end="", file=self.out)
        print(text, file=self.out, flush=True)

    def _status(self, text: str) -> None:
        width = shutil.get_terminal_size((100, 20)).columns - 1
        print("\r" + text[:width].ljust(width), end="", file=self.out, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=self.out, flush=True)
