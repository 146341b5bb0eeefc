"""What the staged config searches (attention_tune, scans_tune) share: a bench that gates a call on the
float64 reference and times it as the collector does, candidates compiled beforehand in worker
processes, one stage of the search, the device released between shapes, and the tables printed."""
from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from multiprocessing import get_context
from typing import Callable

from kcollect.common import pin_ptxas

FAILS = "fails the gate"


class Bench:
    """An op's inputs at one shape and dtype with their float64 answers (fwd and bwd), on `device`.
    A subclass says how a row of its table reads (`row`)."""

    def __init__(self, spec, dims, dtype, rep_ms: float, device: str):
        import torch

        from kcollect import timing, verify

        self.spec, self.verify, self.timing, self.dims, self.dtype = spec, verify, timing, dims, dtype
        self.rep_ms, self.device = rep_ms, device
        self.inputs = spec.make_inputs(dims, dtype, device, 0)
        self.answers = {m: verify.reference_answers(spec, self.inputs, m, 1) for m in ("fwd", "bwd")}
        self.budget = timing.Budget(warmup_ms=rep_ms / 2, rep_ms=rep_ms, min_reps=5 if device == "cuda" else 1)
        self.flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device=device) if device == "cuda" else None

    def time(self, call) -> float:
        """Median ms of `call`: a CUDA-graph replay with L2 flushed on the GPU, plain calls on the CPU."""
        if self.device != "cuda":
            return self.timing.time_cpu(call, self.budget).median_ms
        return self.timing.time_cuda_graph(call, self.budget, self.flush).median_ms

    def measure(self, fn, mode: str, config=None) -> tuple[float | None, float, str]:
        """(median ms or None, error, note) of fn(**inputs) in `mode`, gated first, with `config`
        forced (lab.ab.checked_call: the backward included; a config no pick took is not timed); the note
        is empty where it was timed."""
        from kcollect.spec import Unavailable
        from lab.ab import checked_call

        dys, want = self.answers[mode]
        try:
            call, err = checked_call(self.spec, fn, self.inputs, mode, dys, want, config)
        except Unavailable as e:
            return None, float("nan"), f"unavailable: {e}"
        except Exception as e:
            return None, float("nan"), f"error: {type(e).__name__}: {str(e)[:120]}"
        if not err <= self.spec.tolerance[self.dtype]:
            return None, err, FAILS
        try:
            return self.time(call), err, ""
        except Exception as e:
            return None, err, f"timing: {type(e).__name__}: {str(e)[:120]}"

    def row(self, label: str, mode: str, ms: float | None, err: float = float("nan"), note: str = "") -> tuple:
        raise NotImplementedError


def precompile(pool, warm: Callable, key: tuple, configs: list) -> dict:
    """{config: error} of the candidates that cannot run, each launched once by warm((*key, config))
    in the pool (none known without a pool: on the CPU)."""
    if pool is None:
        return {}
    errors = pool.map(warm, [(*key, c) for c in configs])
    return {c: e for c, e in zip(configs, errors) if e}


def run_stage(bench: Bench, pool, warm: Callable, key: tuple, mode: str, configs: list, table: list,
              limit: int | None, short: Callable) -> list:
    """Check and time the candidates (the first `limit`), a row of `table` each (labelled short(config));
    their (ms, config) sorted, best first. `warm` and `key`: see precompile."""
    configs = configs[:limit] if limit else configs
    triton_fn = bench.spec.provider("triton").fn
    broken = precompile(pool, warm, key, configs)
    timed = []
    for c in configs:
        if c in broken:
            table.append(bench.row(short(c), mode, None, note=broken[c]))
            continue
        ms, err, note = bench.measure(triton_fn, mode, c)
        table.append(bench.row(short(c), mode, ms, err, note))
        if ms is not None:
            timed.append((ms, c))
    return sorted(timed, key=lambda t: t[0])


def compile_pool(stack: ExitStack, device: str, jobs: int):
    """Processes that compile candidates into Triton's disk cache (spawned: CUDA does not survive a
    fork), closed with `stack`; None on the CPU or without jobs."""
    if device != "cuda" or jobs <= 0:
        return None
    return stack.enter_context(ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=pin_ptxas))


def release(device: str) -> None:
    """Give the cached blocks of a finished shape back before the next one allocates."""
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def search_options(ap: argparse.ArgumentParser, rep_ms: float, quick: str) -> None:
    """The options every search takes: compile processes, time budget, --quick, --limit, --device."""
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="compile processes")
    ap.add_argument("--rep-ms", type=float, default=rep_ms, help="timed budget per candidate")
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--limit", type=int, default=None, help="at most this many candidates a stage")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run on the interpreter")


def print_table(title: str, table: list, label_width: int, figures: tuple) -> None:
    """A stage's rows (label, ms, figure..., note), fastest first and the untimed last; `figures` the
    (heading, width, decimals) of each figure after ms."""
    nan = float("nan")
    print(f"\n== {title}")
    print(f"  {'config':<{label_width}} {'ms':>9} " + " ".join(f"{h:>{w}}" for h, w, _ in figures) + "  note")
    for label, ms, *values, note in sorted(table, key=lambda r: (r[1] is None, r[1] or 0)):
        cells = " ".join(f"{v or nan:{w}.{d}f}" for v, (_, w, d) in zip(values, figures))
        print(f"  {label:<{label_width}} {ms if ms is not None else nan:9.4f} {cells}  {note}")


def print_best(title: str, summary: list) -> None:
    """The best config of each shape and mode: (what and how fast, config, {peer: ms or None}) each."""
    print(f"\n== {title}")
    for head, config, peers in summary:
        others = "  ".join(f"{p} {v:.4f}" if v else f"{p} -" for p, v in peers.items())
        print(f"  {head}  [{others}]")
        print(f"      {config!r}")
