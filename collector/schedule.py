"""The plan's cost, its split over machines (--shard K/N) and the order workers take cases in.

Costs are estimates in seconds from the plan and the committed cost model (cost.py) alone (no
clock), so that every machine of a sharded run computes the same split, and so that the progress has
an ETA before anything is measured. The progress rescales them by what it observes (progress.py).
"""
from __future__ import annotations

import socket
from collections import Counter
from typing import Callable

from . import cost
from .plan import Case

# Seconds per (mode, provider) measurement where the fitted model (cost.py) has no term for it
# (a new kernel, a plugin's). On a GPU it is mostly the fixed timing budget and Python, plus
# torch.compile's first call per shape and mode. On the CPU the Triton interpreter's cost grows with
# the data (each program of a launch costs milliseconds of Python), while the other providers are
# native code; torch.compile does not run there by default (run_cmd.CPU_COMPILE).
BASE_S = {"cuda": 0.4, "cpu": 0.1}
COMPILE_S = {"cuda": 2.0, "cpu": 0.0}
PER_GB_S = {"cuda": 0.5, "cpu": 0.0}
INTERPRETED_PER_GB_S = 10000.0


def unit_cost(case: Case, mode: str, provider: str, device: str) -> float:
    gb = case.spec.bytes_moved(case.shape.dims, case.dtype, mode) / 1e9
    # the case's share (inputs, references, release) spread over its measurements, as the runner does
    fitted = cost.committed().row(device, case.spec.name, provider, mode, gb, len(case.modes) * len(case.providers))
    return constant_cost(device, provider, gb) if fitted is None else fitted


def constant_cost(device: str, provider: str, gb: float) -> float:
    """The plan's constants, for a measurement no fitted term covers."""
    per_gb = INTERPRETED_PER_GB_S if device == "cpu" and provider == "triton" else PER_GB_S[device]
    return BASE_S[device] + (COMPILE_S[device] if provider == "compile" else 0.0) + per_gb * gb


def case_cost(case: Case, device: str) -> float:
    return sum(unit_cost(case, m, p, device) for m in case.modes for p in case.providers)


Cost = Callable[[Case, str, str], float]  # (case, mode, provider) -> estimated seconds


def past_seconds(store, device: str, machine: str | None) -> dict[tuple, float]:
    """{(kernel, mode, provider, shape, dtype): seconds} of each measurement in the latest run on
    this machine that made it (results.seconds): `machine` as given to --machine, else this host's
    runs on `device` (a machine's default name is its host name and its GPU's, or CPU)."""
    where, args = machine_filter(device, machine)
    rows = store.query("SELECT r.kernel, r.mode, r.provider, r.shape, r.dtype, r.seconds FROM results r "
                       f"JOIN runs u ON r.run_id = u.run_id WHERE r.seconds IS NOT NULL AND {where} "
                       "ORDER BY u.started_at", args)
    return {(r["kernel"], r["mode"], r["provider"], r["shape"], r["dtype"]): r["seconds"] for r in rows}


def machine_filter(device: str, machine: str | None) -> tuple[str, list[str]]:
    """SQL condition (on runs as `u`) and its arguments for the runs of this machine: `machine` as
    given to --machine, else this host's runs on `device` (a machine's default name is its host name
    and its GPU's, or CPU)."""
    if machine:
        return "u.machine = ?", [machine]
    host = socket.gethostname()
    return "u.machine LIKE ? AND u.machine " + ("=" if device == "cpu" else "<>") + " ?", [f"{host} %", f"{host} CPU"]


def estimator(cases: list[Case], device: str, past: dict[tuple, float]) -> tuple[Cost, int]:
    """The cost of each measurement: its seconds in the last run here where there is one, else the
    plan's estimate scaled by how the measured ones compared with theirs (the plan's constants are
    one guess for every machine: on the CPU a kernel took 0.08x to 6x of it). Also how many of the
    plan's measurements have a past."""
    from .spec import DTYPE_NAMES

    def key(case: Case, mode: str, provider: str) -> tuple:
        return case.spec.name, mode, provider, case.shape.label, DTYPE_NAMES[case.dtype]

    known = [(past[key(c, m, p)], unit_cost(c, m, p, device)) for c in cases for m in c.modes for p in c.providers
             if key(c, m, p) in past]
    scale = sum(s for s, _ in known) / sum(e for _, e in known) if known else 1.0

    def cost(case: Case, mode: str, provider: str) -> float:
        seen = past.get(key(case, mode, provider))
        return seen if seen is not None else scale * unit_cost(case, mode, provider, device)

    return cost, len(known)


def overhead(config, todo: dict[int, list], cases: list[Case]) -> dict[str, tuple[float | None, str]]:
    """A run's estimated seconds outside its measurements' warm seconds, {part: (seconds or None
    where no run fitted it, what)}: the precompile pass over `todo` (precompile.pending: case index
    in `cases` -> the (mode, provider) builds the caches lack), the measuring pass's first calls of
    what the pass has just built, and the start-up, from the committed run terms (cost.py)."""
    from . import precompile

    model = cost.committed()
    procs = precompile.processes(todo, config.precompile)
    kernels: Counter = Counter()
    providers: Counter = Counter()
    for i, pairs in todo.items() if procs else ():
        kernels[cases[i].spec.name] += len(pairs)
        providers.update(p for _, p in pairs)
    builds = sum(len(v) for v in todo.values())
    if config.precompile <= 0:
        what = "no pass"
    elif procs:
        what = f"{builds} builds the caches lack, in {procs} processes"
    elif builds:
        what = f"no pass: {builds} builds, made as the run meets them"
    else:
        what = "the caches hold every build"
    first = model.cold(config.device, providers)
    return {"precompile": (model.precompile(config.device, kernels, procs), what),
            "first calls": (None if first is None else first / max(1, config.workers),
                            f"{builds} builds just made by the pass" if procs else "no pass"),
            "start-up": (model.startup(config.device), "imports, the device's ceilings")}


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' with 1 <= K <= N; ValueError otherwise."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r} is not K/N (e.g. 1/4)") from None
    if not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K must be between 1 and N")
    return k, n


def groups(indices: list[int], cases: list[Case], device: str) -> list[list[int]]:
    """The indices grouped by kernel, largest estimated cost first (ties: plan order)."""
    by: dict[str, list[int]] = {}
    for i in indices:
        by.setdefault(cases[i].spec.name, []).append(i)
    cost = {k: sum(case_cost(cases[i], device) for i in v) for k, v in by.items()}
    return [by[k] for k in sorted(by, key=lambda k: (-cost[k], by[k][0]))]


def tasks(indices: list[int], cases: list[Case], device: str, workers: int) -> list[list[int]]:
    """What the workers of one host take: on several GPUs, one case at a time, kernel by kernel
    (the parent keeps each worker on its kernel while it has cases: collect._Parent._next_for), so
    that they all end within a case of each other (handing out whole kernels left one
    of two H200s idle for a third of a 3-kernel run; a kernel measured by two GPUs is two runs, and
    the site shows each case from the latest run that measured it). Otherwise whole kernels
    (groups): CPU workers are many kernels' worth of cases apart in speed anyway, and one kernel
    stays one run, measured in this process when it is all there is."""
    by_kernel = groups(indices, cases, device)
    return [[i] for g in by_kernel for i in g] if workers > 1 and device == "cuda" else by_kernel


def shard(cases: list[Case], k: int, n: int, device: str) -> list[int]:
    """Indices (into cases) of shard k of n, in plan order: whole kernels, each (largest first)
    to the lightest shard so far (ties: the lower shard). Deterministic from the plan alone, and
    balanced to within one kernel's cost."""
    loads = [0.0] * n
    mine: list[int] = []
    for group in groups(list(range(len(cases))), cases, device):
        s = min(range(n), key=lambda j: (loads[j], j))
        loads[s] += sum(case_cost(cases[i], device) for i in group)
        if s == k - 1:
            mine += group
    return sorted(mine)


def parse_gpus(text: str, count: int) -> list[int]:
    """'all' or a comma-separated list of device indices below count; ValueError otherwise."""
    if text == "all":
        if count == 0:
            raise ValueError("--gpus all: no CUDA device is visible here")
        return list(range(count))
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--gpus {text!r} is not 'all' or a list of device indices such as 0,1") from None
    bad = [i for i in ids if not 0 <= i < count]
    if not ids or bad or len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {text!r}: valid device indices here are 0..{count - 1}, each once")
    return ids
