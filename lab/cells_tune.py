"""Tune the recurrent cells' configs on a GPU (optional; the defaults need no tuning to run): at the
training and real-time shapes, a few candidate configs of our kernels around the default pick, and
the peers (cudnn, cortex, mlstm_kernels, xlstm, linear), each checked against the float64 reference
by the collector's gate, then timed (the collector's CUDA-graph timing, L2 flushed). Prints one
table per (op, shape, mode) with ms, the error against float64 and the speedup over the default.

    python -m lab.cells_tune                         # all four ops, about 2-4 minutes on an H100
    python -m lab.cells_tune --ops lstm,mlstm --modes fwd
    python -m lab.cells_tune --device cpu --ops axon --limit 2   # a dry run on the interpreter
    python -m lab.cells_tune --ops lstm --modes bwd --shape B=32,T=60,H=512,resets=0 --only default,bk=
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os

from kcollect.common import ALLOC_CONF

from .device import names_in, open_device

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # as `kcollect run` does, before CUDA starts

SHAPES = {  # op -> shapes (the full grid's training and real-time ones)
    "lstm": ("B=64,T=256,H=512,resets=0.1", "B=64,T=256,H=2048,resets=0", "B=32,T=60,H=512,resets=0",
             "B=1,T=60,H=256,resets=0.1"),
    "slstm": ("B=8,NH=8,T=1024,DH=64,resets=0", "B=64,NH=16,T=256,DH=64,resets=0.1", "B=4,NH=4,T=512,DH=128,resets=0"),
    "mlstm": ("B=8,NH=8,T=1024,DH=64,resets=0", "B=64,NH=8,T=1024,DH=64,resets=0.1"),
    "axon": ("B=8,T=512,H=512,resets=0", "B=64,T=256,H=1024,resets=0", "B=32,T=60,H=256,resets=0.1"),
}
PEERS = {"lstm": ("cudnn", "cortex"), "slstm": ("cortex", "xlstm"), "mlstm": ("cortex", "mlstm_kernels", "fla"),
         "axon": ("cortex", "linear")}


def _splits(H: int, bb: int, B: int, sms: int = 132) -> list[tuple[int, int]]:
    """(hb_bwd, split_bwd) pairs of the lstm backward whose programs, over the batch groups, fill 16
    SMs to all of them at one program each; 16 gate columns a share and 4 units a program at least."""
    groups = -(-B // bb)
    gp = max(16, 1 << (4 * H - 1).bit_length())
    return [(u, k) for u in (16, 32, 64, 128) for k in (2, 4, 8, 16) if 4 * k <= u <= max(16, H)
            and gp // k >= 16 and 16 <= -(-H // u) * k * groups <= sms]


def candidates(op: str, default, dims: dict | None = None) -> dict:
    """{name: config}: the default pick and one-field changes of it."""
    r = dataclasses.replace
    if op == "lstm":
        from kcollect.kernels.lstm.config import _units, with_split

        H, B = dims["H"], dims["B"]
        # the weight and h (dG) tiles a step reads at a time: fewer, longer dependent loads a step
        out = {f"bk={k}": r(default, bk=k) for k in (128, 256, 512) if k != default.bk}
        out.update({f"bk={k},warps=8": r(default, bk=k, warps=8) for k in (128, 256)})
        out.update({"bb=32,hb*2": r(default, bb=32, hb=2 * default.hb, hb_bwd=2 * default.hb_bwd)})
        out.update({f"hb={h}": r(default, hb=h) for h in (4, 8, 16, 32) if h != default.hb})
        out.update({f"bb={b}": r(default, bb=b) for b in (16, 32, 64) if b != default.bb})
        out.update({f"split={k},hb_bwd={u}": with_split(default, H, u, k) for u, k in _splits(H, default.bb, B)})
        out["unsplit"] = with_split(default, H, _units(H, -(-B // default.bb), 132, 16), 1)
        out.update({"resident": r(default, resident=not default.resident, resident_bwd=not default.resident_bwd),
                    f"warps={12 - default.warps}": r(default, warps=12 - default.warps),
                    "stepped": r(default, persistent=False)})
    elif op == "slstm":
        out = {f"bb={b}": r(default, bb=b) for b in (16, 32, 64) if b != default.bb}
        out.update({"resident": r(default, resident=not default.resident),
                    f"warps={12 - default.warps}": r(default, warps=12 - default.warps)})
    elif op == "mlstm":
        out = {f"chunk={c}": r(default, chunk=c) for c in (32, 128) if c != default.chunk}
        out.update({f"warps={12 - default.warps}": r(default, warps=12 - default.warps),
                    "bv=32": r(default, bv=32)})
    else:
        out = {f"bh={b}": r(default, bh=b) for b in (8, 32, 64) if b != default.bh}
        out.update({"warps=2": r(default, warps=2), "stages=1": r(default, stages=1)})
    return {"default": default, **out}


def measure(spec, fn, inputs, dtype, mode, bench):
    """(ms or None, error, note) of one provider or forced config: gate first, then time."""
    from kcollect import verify

    try:
        dys, want = verify.reference_answers(spec, inputs, mode, 1)
        call = verify.build_call(spec, fn, verify.clone_inputs(inputs), mode, dys)
        err = verify.error_of(spec, call(), want, mode)
        if not err <= spec.tolerance[dtype]:
            return None, err, "FAILS the gate"
        return bench(call), err, ""
    except Exception as e:  # a peer that refuses the shape, a config that does not compile
        return None, float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}"


def run_shape(op, shape, modes, dtype, device, limit, only=(), peers=None):
    import torch

    from kcollect import timing, verify
    from kcollect.kernels._host.config import forced
    from lab.ab import parse_shape

    spec = importlib.import_module(f"kcollect.kernels.{op}.spec").SPEC
    dims = parse_shape(shape)
    inputs = spec.make_inputs(dims, dtype, device, 0)
    budget = timing.Budget(warmup_ms=10, rep_ms=40, min_reps=5 if device == "cuda" else 1)
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device=device) if device == "cuda" else None

    def bench(call):
        if device != "cuda":
            return timing.time_cpu(call, budget).median_ms
        return timing.time_cuda_graph(call, budget, flush).median_ms

    triton = spec.provider("triton")
    configs = candidates(op, importlib.import_module(f"kcollect.kernels.{op}").pick(*_pick_args(op, dims), device),
                         dims)
    for mode in modes:
        rows = []
        chosen = [(n, c) for n, c in configs.items() if not only or any(n.startswith(o) for o in only)]
        for name, config in chosen[:limit]:
            def fn(config=config, **kw):
                with forced(config):
                    return triton.fn(**kw)
            rows.append((f"triton[{name}]",) + measure(spec, fn, inputs, dtype, mode, bench))
        for peer in PEERS[op] if peers is None else [p for p in PEERS[op] if p in peers]:
            p = spec.provider(peer)
            reason = p.available(device)
            rows.append((peer, None, float("nan"), reason) if reason else
                        (peer,) + measure(verify.gated_spec(spec, p), p.fn, inputs, dtype, mode, bench))
        base = rows[0][1]
        print(f"\n{op} {shape} {mode} ({str(dtype)[6:]}, {device})")
        for name, ms, err, note in rows:
            speed = f"{base / ms:5.2f}x" if ms and base else "     "
            print(f"  {name:24s} {('%9.3f ms' % ms) if ms else '        --'}  {speed}  err {err:.2e}  {note}")


def _pick_args(op: str, d: dict) -> tuple:
    return {"lstm": (d.get("B"), d.get("H")), "slstm": (d.get("B"), d.get("NH"), d.get("DH")),
            "mlstm": (d.get("T"), d.get("DH")), "axon": (d.get("B"), d.get("H"))}[op]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="lstm,slstm,mlstm,axon")
    parser.add_argument("--modes", default="fwd,fwd+bwd")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--limit", type=int, default=None, help="candidate configs per shape (default: all)")
    parser.add_argument("--only", default="", help="comma-separated prefixes of the candidates' names to measure "
                                                   "(e.g. default,bk=); default: all")
    parser.add_argument("--peers", default=None, help="comma-separated peers to measure beside ours (default: all "
                                                      "of the op's; '' for none)")
    parser.add_argument("--shape", action="append", default=[], help="a shape label instead of the op's tuning "
                                                                     "shapes (repeatable)")
    args = parser.parse_args(argv)
    ops = names_in(parser, args.ops, SHAPES, "op")
    torch = open_device(args.device, "cells_tune")
    if torch is None:
        return 2
    for op in ops:
        quick = importlib.import_module(f"kcollect.kernels.{op}.spec").SPEC.grid("quick")[0].label
        shapes = args.shape or (SHAPES[op] if args.device == "cuda" else (quick,))
        only = tuple(o for o in args.only.split(",") if o)
        for shape in shapes:
            run_shape(op, shape, args.modes.split(","), getattr(torch, args.dtype), args.device, args.limit, only,
                      None if args.peers is None else args.peers.split(","))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
