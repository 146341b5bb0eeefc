"""Tune attention's configs on a GPU: for a handful of key shapes, every candidate config of our
forward and backward is checked against the float64 reference (the collector's gate) and timed
(the collector's CUDA-graph timing, L2 flushed before each call), beside sdpa_flash, sdpa_cudnn and
flex; prints a table per shape and mode (config, ms, TFLOP/s) and the best config of each, which
is what config.pick should return there.

    python -m lab.attention_tune                      # every shape, about 3-5 minutes on an H100
    python -m lab.attention_tune --quick               # fewer stage counts: about half the time
    python -m lab.attention_tune --shapes causal4k,gqa --dtype float16 --jobs 8
    python -m lab.attention_tune --device cpu --limit 2   # a dry run of the script on the interpreter

The search is staged, to stay within minutes: the forward's block shapes, warps and stages first;
then the Hopper switches (TMA, a persistent grid) on the best three. The
backward tunes its dk/dv kernel (with the default dq blocks), then its dq kernel (with the best
dk/dv), then TMA. Candidates are compiled beforehand in --jobs processes (Triton's disk cache
keeps the binaries for the timing process).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys

from kcollect.common import ALLOC_CONF

from . import common
from .device import device_line, names_in, open_device

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # as `kcollect run` does, before CUDA starts


def _d(b, hq, hkv, s, d, causal, window=0, sk=None):
    return {"B": b, "Hq": hq, "Hkv": hkv, "Sq": s, "Skv": sk or s, "D": d, "causal": causal, "window": window,
            "varlen": 0}


SHAPES = {
    "causal4k": _d(4, 16, 16, 4096, 128, 1),
    "full4k": _d(4, 16, 16, 4096, 128, 0),
    "d64": _d(16, 16, 16, 1024, 64, 0),
    "causal16k": _d(1, 16, 16, 16384, 128, 1),
    "gqa": _d(4, 32, 8, 4096, 128, 1),
    "window": _d(2, 16, 16, 8192, 128, 1, window=1024),
    # short spans of keys a query block visits, where the H200's deeper backward picks lost
    "s512": _d(32, 16, 16, 512, 128, 1),
    "s1k": _d(16, 16, 16, 1024, 128, 1),
    "d64s512": _d(32, 32, 32, 512, 64, 1),
    "d64long": _d(2, 32, 32, 8192, 64, 1),
    "realtime": _d(32, 8, 8, 60, 64, 1),
    "tiny": _d(1, 2, 1, 24, 64, 1),  # the CPU dry run's
}
BASELINES = ("sdpa_flash", "sdpa_cudnn", "flex")
SMEM = 227 * 1024  # shared memory a block may use on sm_90


def fwd_blocks(d: int, stage_counts=(2, 3, 4)) -> list:
    """Stage 1 of the forward: block shapes, warps, stages (8 warps only with 128-row blocks, and
    only what fits in shared memory: K and V tiles per stage plus the Q tile)."""
    from kcollect.kernels.attention import FwdConfig

    bd = max(16, 1 << (d - 1).bit_length())
    out = []
    for bm in (64, 128):
        for bn in (32, 64, 128):
            for warps in ((4, 8) if bm == 128 else (4,)):
                for stages in stage_counts:
                    if stages * bn * bd * 4 + bm * bd * 2 <= SMEM:
                        out.append(FwdConfig(bm, bn, warps, stages))
    return out


def fwd_hopper(best: list) -> list:
    """Stage 2: TMA and persistent grids on the best configs."""
    out = []
    for c in best:
        out += [dataclasses.replace(c, tma=True), dataclasses.replace(c, persistent=1), dataclasses.replace(c, persistent=2)]
    return out


def bwd_kv(base, stage_counts=(2, 3)) -> list:
    return [dataclasses.replace(base, kv_n=n, kv_m=m, kv_warps=w, kv_stages=s)
            for n, m in ((128, 64), (128, 32), (64, 64), (64, 32)) for w in (4, 8) for s in stage_counts]


def bwd_q(base, stage_counts=(2, 3)) -> list:
    return [dataclasses.replace(base, q_m=m, q_n=n, q_warps=w, q_stages=s)
            for m, n in ((128, 64), (128, 32), (64, 64), (64, 32)) for w in (4, 8) for s in stage_counts]


# -- compiling in parallel ----------------------------------------------------------------------

_INPUTS: dict = {}


def _warm(job) -> str | None:
    """One launch of a candidate in a worker process (compiles it into Triton's disk cache); the
    error text if it cannot run."""
    dims, dtype_name, mode, config = job
    import torch

    from kcollect.kernels.attention import attention_backward, attention_forward
    from kcollect.kernels.attention.spec import SPEC

    key = (tuple(dims.items()), dtype_name)
    if key not in _INPUTS:
        _INPUTS.clear()
        _INPUTS[key] = SPEC.make_inputs(dims, getattr(torch, dtype_name), "cuda", 0)
    x = _INPUTS[key]
    args = (x["q"], x["k"], x["v"], x["causal"], x["window"])
    try:
        if mode == "fwd":
            attention_forward(*args, config=config)
        else:
            o, lse = attention_forward(*args)
            attention_backward(torch.randn_like(o), x["q"], x["k"], x["v"], o, lse, x["causal"], x["window"],
                               config=config)
        torch.cuda.synchronize()
        return None
    except Exception as e:  # out of resources, a compile error: the candidate is dropped
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


# -- checking and timing ----------------------------------------------------------------------------


class Bench(common.Bench):
    def __init__(self, dims, dtype, rep_ms: float, device: str):
        from kcollect.kernels.attention.spec import SPEC

        super().__init__(SPEC, dims, dtype, rep_ms, device)

    def tflops(self, ms: float, mode: str) -> float:
        return self.spec.flops(self.dims, mode) / (ms * 1e9)

    def row(self, label: str, mode: str, ms: float | None, err: float = float("nan"), note: str = "") -> tuple:
        return label, ms, self.tflops(ms, mode) if ms else None, note or f"err {err:.1e}"


def short(c) -> str:
    """Blocks, warps and stages always; the switches (tma, persistent) where on."""
    shown = {k: v for k, v in dataclasses.asdict(c).items() if type(v) is int and k != "persistent" or v}
    return " ".join(f"{k}={v}" for k, v in shown.items())


def run_stage(bench, pool, dtype_name, mode, configs, table, limit: int | None) -> list:
    """Check and time the candidates (the first `limit`); their (ms, config) sorted, best first."""
    return common.run_stage(bench, pool, _warm, (bench.dims, dtype_name, mode), mode, configs, table, limit, short)


def tune_shape(name, dims, dtype, dtype_name, pool, args) -> list:
    from kcollect.kernels.attention import pick

    bench = Bench(dims, dtype, args.rep_ms, args.device)
    quick, limit = args.quick, args.limit
    summary = []
    for mode in args.modes.split(","):
        table: list = []
        if mode == "fwd":
            blocks = fwd_blocks(dims["D"], (3,) if quick else (2, 3, 4))
            ranked = run_stage(bench, pool, dtype_name, mode, blocks, table, limit)
            best = [c for _, c in ranked[:2 if quick else 3]]
            ranked += run_stage(bench, pool, dtype_name, mode, fwd_hopper(best), table, limit)
        else:
            base = pick(dims["D"], bool(dims["causal"]), dims["Sq"], args.device).bwd
            stages = (2,) if quick else (2, 3)
            ranked = run_stage(bench, pool, dtype_name, mode, bwd_kv(base, stages), table, limit)
            best_kv = ranked[0][1] if ranked else base
            ranked += run_stage(bench, pool, dtype_name, mode, bwd_q(best_kv, stages), table, limit)
            ranked.sort(key=lambda t: t[0])
            best = ranked[0][1] if ranked else base
            ranked += run_stage(bench, pool, dtype_name, mode, [dataclasses.replace(best, tma=True)], table, limit)
        ranked.sort(key=lambda t: t[0])
        for p in BASELINES:
            provider = bench.spec.provider(p)
            reason = provider.available(args.device)
            if reason:
                table.append((p, None, None, f"unavailable: {reason}"))
                continue
            table.append(bench.row(p, mode, *bench.measure(provider.fn, mode)))
        print_table(f"{name} {mode} {dtype_name} {dims}", table)
        best = ranked[0] if ranked else (None, None)
        base_ms = {row[0]: row[1] for row in table if row[0] in BASELINES}
        ms, tf = best[0] or float("nan"), bench.tflops(best[0], mode) if best[0] else float("nan")
        summary.append((f"{name:<10} {mode}  {ms:8.4f} ms {tf:6.1f} TF/s", best[1], base_ms))
    del bench
    common.release(args.device)
    return summary


def print_table(title: str, table: list) -> None:
    common.print_table(title, table, 64, (("TFLOP/s", 8, 1),))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.attention_tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None, help=f"comma-separated, of: {', '.join(SHAPES)} (default: all "
                    "but tiny on the GPU, tiny on the CPU)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--modes", default="fwd,bwd", choices=("fwd,bwd", "fwd", "bwd"), help="what to tune")
    common.search_options(ap, rep_ms=15.0, quick="fewer stage counts and Hopper variants (half the time)")
    args = ap.parse_args(argv)
    default = "tiny" if args.device == "cpu" else ",".join(n for n in SHAPES if n != "tiny")
    names = names_in(ap, args.shapes or default, SHAPES, "shape")
    torch = open_device(args.device, "attention_tune")
    if torch is None:
        return 2
    dtype = getattr(torch, args.dtype)
    print(f"{device_line(torch, args.device)}  dtype {args.dtype}")
    summary = []
    with contextlib.ExitStack() as stack:
        pool = common.compile_pool(stack, args.device, args.jobs)
        for name in names:
            summary += tune_shape(name, SHAPES[name], dtype, args.dtype, pool, args)
    common.print_best("best per shape (TFLOP/s; baselines in ms)", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
