"""Tune the scan ops' configs on a GPU (rtu, selective_scan, conv1d): at training shapes, every
candidate config of our forward and backward is checked against the float64 reference (the
collector's gate) and timed (the collector's timing: CUDA graphs, L2 flushed before each call),
beside the peers; prints a table per shape and mode (config, ms, GB/s, % of the copy bandwidth
measured here) and the best config of each, which is what config.pick should return there.

    python -m lab.scans_tune                          # every op and shape, about 3-4 minutes on an H100
    python -m lab.scans_tune --ops rtu,conv1d --quick # fewer candidates
    python -m lab.scans_tune --compile                # also torch.compile's providers (minutes of compiling)
    python -m lab.scans_tune --device cpu --limit 2   # a dry run of the script on the interpreter

The search is staged: tiles and warps first, then (rtu) the split of time into segments on the
best two. A backward candidate is a whole config: its chunk is also the forward's, whose states
the backward reads. Candidates are compiled beforehand in --jobs processes (Triton's disk cache
keeps the binaries for the timing process).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import os
import sys

from kcollect.common import ALLOC_CONF

from . import common
from .device import device_line, open_device

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # as `kcollect run` does, before CUDA starts


def _rtu(b, t, h, r, p):
    return {"B": b, "T": t, "H": h, "R": r, "resets": int(p > 0), "p": p}


def _conv(b, t, f, k, groups, p):
    return {"B": b, "T": t, "F": f, "K": k, "groups": groups, "resets": int(p > 0), "p": p}


SHAPES = {  # op -> name -> dims (the CPU dry run's shape last)
    "rtu": {"long": _rtu(8, 8192, 1024, "diag", 0.01), "wide": _rtu(32, 2048, 2048, "diag", 0.1),
            "cortex": _rtu(8, 1024, 64, 16, 0.1), "tiny": _rtu(1, 20, 8, "diag", 0.2)},
    "selective_scan": {"train": {"B": 8, "T": 2048, "D": 2048, "N": 16}, "wide": {"B": 8, "T": 2048, "D": 4096, "N": 16},
                       "realtime": {"B": 32, "T": 60, "D": 512, "N": 16}, "tiny": {"B": 1, "T": 12, "D": 8, "N": 4}},
    "conv1d": {"depthwise": _conv(8, 2048, 4096, 4, "depthwise", 0.01), "mix": _conv(8, 2048, 1024, 4, "1", 0.01),
               "cortex": _conv(8, 1024, 512, 4, "1", 0.0), "tiny": _conv(1, 20, 16, 3, "depthwise", 0.2)},
}


def _grid(cls, base, **axes) -> list:
    """Every combination of the axes' values on `base` (a config of `cls`)."""
    out = [base]
    for name, values in axes.items():
        out = [dataclasses.replace(c, **{name: v}) for c in out for v in values]
    return list(dict.fromkeys(out))


def candidates(op: str, mode: str, dims: dict, quick: bool, device) -> list[list]:
    """The stages of the search: lists of configs (a stage may depend on the best of the one before,
    so stages after the first are functions of the best configs)."""
    mod = importlib.import_module(f"kcollect.kernels.{op}")
    if op == "rtu":
        base = mod.config.tiles(dims["B"], dims["T"], dims["H"], device)  # this search is the tiles path's
        if mode == "fwd":
            first = _grid(mod.RTUConfig, base, chunk=(32, 64) if quick else (32, 64, 128), block_h=(16, 32),
                          warps=(4,) if quick else (2, 4, 8))
            return [first, lambda best: _grid(mod.RTUConfig, best[0], segments=(1, 2, 4, 8)) +
                    _grid(mod.RTUConfig, best[-1], segments=(1, 2, 4, 8))]
        first = _grid(mod.RTUConfig, base, chunk=(32, 64), bwd_block_h=(8, 16) if quick else (8, 16, 32),
                      bwd_warps=(4, 8))
        return [first, lambda best: _grid(mod.RTUConfig, best[0], bwd_segments=(1, 2, 4, 8))]
    if op == "selective_scan":
        base = mod.config.tiles(dims["B"], dims["D"], device)
        if mode == "fwd":
            return [_grid(mod.SelectiveScanConfig, base, chunk=(16, 32, 64), block_d=(8, 16) if quick else (8, 16, 32),
                          warps=(4, 8))]
        return [_grid(mod.SelectiveScanConfig, base, chunk=(16, 32), bwd_block_d=(8, 16), bwd_warps=(4, 8))]
    if dims["groups"] == "depthwise":
        base = mod.pick_depthwise(dims["B"], dims["T"], dims["F"], dims["K"], device)
        if mode == "fwd":
            return [_grid(mod.DepthwiseConfig, base, block_t=(16, 32, 64), block_f=(128, 256, 512), warps=(4, 8))]
        return [_grid(mod.DepthwiseConfig, base, bwd_block_t=(16, 32), bwd_block_f=(64, 128, 256),
                      bwd_span=(256, 1024), bwd_warps=(4,) if quick else (4, 8))]
    base = mod.pick_mix(dims["B"], dims["T"], dims["F"], dims["K"], device)
    tiles = [(128, 128, 64), (128, 256, 64), (64, 128, 64), (128, 128, 32)]
    if mode == "fwd":
        return [[dataclasses.replace(base, block_t=t, block_o=o, block_i=i, warps=w, stages=s)
                 for t, o, i in tiles for w in (4, 8) for s in ((3,) if quick else (3, 4))]]
    return [[dataclasses.replace(base, block_t=t, block_o=o, block_i=i, dw_block_o=do, dw_block_i=di, dw_warps=w)
             for t, o, i in tiles[:2] for do, di in ((128, 128), (64, 128), (128, 64)) for w in (4, 8)]]


# -- compiling in parallel ----------------------------------------------------------------------

_INPUTS: dict = {}


def _warm(job) -> str | None:
    """One call of a candidate in a worker process (compiles it into Triton's disk cache); the error
    text if it cannot run."""
    op, dims, dtype_name, mode, config = job
    import torch

    from kcollect import verify
    from kcollect.kernels._host.config import forced

    spec = importlib.import_module(f"kcollect.kernels.{op}.spec").SPEC
    key = (op, tuple(dims.items()), dtype_name)
    if key not in _INPUTS:
        _INPUTS.clear()
        _INPUTS[key] = spec.make_inputs(dims, getattr(torch, dtype_name), "cuda", 0)
    fn = spec.provider("triton").fn
    try:
        with forced(config):
            dys = _unit_grads(fn, _INPUTS[key]) if mode == "bwd" else ()
            verify.build_call(spec, fn, verify.clone_inputs(_INPUTS[key]), mode, dys)()
        torch.cuda.synchronize()
        return None
    except Exception as e:  # out of resources, a compile error: the candidate is dropped
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:  # each of the --jobs processes kept ~6 GB cached on the H100: the timing process ran out
        torch.cuda.empty_cache()


def _unit_grads(fn, inputs) -> tuple:
    import torch

    from kcollect import verify

    with torch.no_grad():
        return tuple(torch.ones_like(o, dtype=torch.float64) for o in verify.as_tuple(fn(**inputs)))


# -- checking and timing ----------------------------------------------------------------------------


class Bench(common.Bench):
    def __init__(self, op, dims, dtype, rep_ms: float, device: str, copy_gbps: float | None):
        super().__init__(importlib.import_module(f"kcollect.kernels.{op}.spec").SPEC, dims, dtype, rep_ms, device)
        self.op, self.copy_gbps = op, copy_gbps

    def time(self, call) -> float:
        try:
            return super().time(call)
        except Exception:  # not capturable (a host sync in a peer): events
            import torch

            torch.cuda.synchronize()
            return self.timing.time_cuda(call, self.budget, self.flush).median_ms

    def without_resets(self) -> "Bench":
        return Bench(self.op, dict(self.dims, resets=0, p=0), self.dtype, self.rep_ms, self.device, self.copy_gbps)

    def row(self, label: str, mode: str, ms: float | None, err: float = float("nan"), note: str = "") -> tuple:
        gbps = self.spec.bytes_moved(self.dims, self.dtype, mode) / (ms * 1e6) if ms else None
        pct = 100 * gbps / self.copy_gbps if gbps and self.copy_gbps else None
        if note == common.FAILS:
            note = f"{common.FAILS}: error {err:.2e}"
        return label, ms, gbps, pct, note or f"err {err:.1e}"


def short(c) -> str:
    return " ".join(f"{k}={v}" for k, v in dataclasses.asdict(c).items())


def run_stage(bench, pool, op, dtype_name, mode, configs, table, limit: int | None) -> list:
    """Check and time the candidates (the first `limit`); their (ms, config) sorted, best first."""
    return common.run_stage(bench, pool, _warm, (op, bench.dims, dtype_name, mode), mode, configs, table, limit,
                            short)


def peers(bench, mode: str, table: list, with_compile: bool) -> dict:
    """Time the other providers (compile only if asked); cuDNN, which has no resets, at the same dims
    without them."""
    out = {}
    for p in bench.spec.providers:
        if p.name == "triton" or (p.name == "compile" and not with_compile):
            continue
        reason = p.available(bench.device)
        if reason:
            table.append(bench.row(p.name, mode, None, note=f"unavailable: {reason}"))
            continue
        b = bench.without_resets() if p.name == "cudnn" and int(bench.dims.get("resets", 0)) else bench
        ms, err, note = b.measure(p.fn, mode)
        table.append(bench.row(p.name if b is bench else f"{p.name} (resets=0)", mode, ms, err, note))
        out[p.name] = ms
    return out


def tune_shape(op, name, dims, dtype, dtype_name, pool, args, copy_gbps) -> list:
    bench = Bench(op, dims, dtype, args.rep_ms, args.device, copy_gbps)
    summary = []
    for mode in ("fwd", "bwd"):
        table: list = []
        stages = candidates(op, mode, dims, args.quick, args.device)
        ranked = run_stage(bench, pool, op, dtype_name, mode, stages[0], table, args.limit)
        for stage in stages[1:]:
            best = [c for _, c in ranked[:2]]
            if best:
                seen = {c for _, c in ranked}
                ranked += run_stage(bench, pool, op, dtype_name, mode, [c for c in stage(best) if c not in seen],
                                    table, args.limit)
                ranked.sort(key=lambda t: t[0])
        base = peers(bench, mode, table, args.compile)
        print_table(f"{op} {name} {mode} {dtype_name} {dims}", table)
        best = ranked[0] if ranked else (None, None)
        ms, pct = best[0] or float("nan"), bench.row("", mode, best[0])[3] or float("nan")
        summary.append((f"{op:<15} {name:<10} {mode}  {ms:8.4f} ms {pct:5.1f}%", best[1], base))
    del bench
    common.release(args.device)
    return summary


def print_table(title: str, table: list) -> None:
    common.print_table(title, table, 110, (("GB/s", 7, 0), ("%copy", 6, 1)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.scans_tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(SHAPES), help=f"comma-separated, of: {', '.join(SHAPES)}")
    ap.add_argument("--shapes", default=None, help="comma-separated shape names (default: all but tiny on the "
                    "GPU, tiny on the CPU); the names: " + "; ".join(f"{op}: {', '.join(s)}" for op, s in SHAPES.items()))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    common.search_options(ap, rep_ms=10.0, quick="fewer candidates")
    ap.add_argument("--compile", action="store_true", help="also time the torch.compile providers")
    args = ap.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in SHAPES]
    if unknown:
        ap.error(f"unknown op {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    known = {n for op in ops for n in SHAPES[op]}
    wanted = {s.strip() for s in args.shapes.split(",")} if args.shapes else None
    if wanted and wanted - known:
        ap.error(f"unknown shape {', '.join(sorted(wanted - known))}; known for {', '.join(ops)}: {', '.join(sorted(known))}")
    torch = open_device(args.device, "scans_tune")
    if torch is None:
        return 2
    from kcollect import timing

    dtype = getattr(torch, args.dtype)
    copy_gbps = timing.measure_ceilings(args.device)[0] if args.device == "cuda" else None
    print(f"{device_line(torch, args.device)}  dtype {args.dtype}  copy {copy_gbps or float('nan'):.0f} GB/s")
    summary = []
    with contextlib.ExitStack() as stack:
        pool = common.compile_pool(stack, args.device, args.jobs)
        for op in ops:
            for name, dims in SHAPES[op].items():
                if (wanted and name not in wanted) or (not wanted and (name == "tiny") != (args.device == "cpu")):
                    continue
                summary += tune_shape(op, name, dims, dtype, args.dtype, pool, args, copy_gbps)
    common.print_best("best per shape (% of copy; peers in ms)", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
