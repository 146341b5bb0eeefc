"""The plan's cost, its split over machines (--shard K/N) and the order workers take cases in.

Costs are estimates in seconds from the plan alone (no clock), so that every machine of a sharded
run computes the same split, and so that the progress has an ETA before anything is measured. The
progress rescales them by what it observes (progress.py).
"""
from __future__ import annotations

from .plan import Case

# Seconds per (mode, provider) measurement. On a GPU it is mostly the fixed timing budget and
# Python, plus torch.compile's first call per shape and mode. On the CPU the Triton interpreter's
# cost grows with the data (about 10 s of CPU per MB moved on the quick grid: each program of a
# launch costs milliseconds of Python), while the other providers are native code; torch.compile
# does not run there by default (run_cmd.CPU_COMPILE).
BASE_S = {"cuda": 0.4, "cpu": 0.1}
COMPILE_S = {"cuda": 2.0, "cpu": 0.0}
PER_GB_S = {"cuda": 0.5, "cpu": 0.0}
INTERPRETED_PER_GB_S = 10000.0


def unit_cost(case: Case, mode: str, provider: str, device: str) -> float:
    gb = case.spec.bytes_moved(case.shape.dims, case.dtype, mode) / 1e9
    per_gb = INTERPRETED_PER_GB_S if device == "cpu" and provider == "triton" else PER_GB_S[device]
    return BASE_S[device] + (COMPILE_S[device] if provider == "compile" else 0.0) + per_gb * gb


def case_cost(case: Case, device: str) -> float:
    return sum(unit_cost(case, m, p, device) for m in case.modes for p in case.providers)


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
