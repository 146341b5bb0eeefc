"""A bf16 mLSTM case over the gate (the H200 cells sweep at bbc84b9; it looked GPU-only while the
sweep drew upstream gradients on each device's generator: lab/results/mlstm_bf16_conditioning_cpu.txt):
the case under variants of the kernels' arithmetic, and neighbours of it under other seeds.

    python -m lab.mlstm_bf16_diag [--seeds N] [--out FILE]

Variants: the default launch; DOT_F32 IEEE (fp32 products of the bf16 operands); chunks of 32 and
16; value blocks of 32; 4 warps. For each, every part's error against float64 (ours / eager), and for the
default the steps where dq and df err most. Then --seeds draws of the same dims and options:
how many are over the gate under the default and under IEEE."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random

import torch

from lab.awkward import cells, common

DEVICE = "cuda"
CASE = {"op": "mlstm", "dtype": "bfloat16", "dims": {"B": 1, "NH": 1, "DH": 64, "T": 129},
        "options": {"resets": "last", "gates": "weak_forget", "x_scale": 10.0, "layout": "contiguous",
                    "grad_layout": "strided"}, "refusal": None, "seed": 2076437750}


@contextlib.contextmanager
def variant(name: str):
    """Patches of the mLSTM host code for one variant (undone on exit)."""
    from kcollect.kernels import mlstm as pkg
    from kcollect.kernels.mlstm import config as cfg

    saved = (pkg.dot_mode, pkg.pick)
    if "ieee" in name:
        pkg.dot_mode = lambda dtype, device, DH: 1
    forced = {"chunk32": dict(chunk=32), "chunk16": dict(chunk=16), "bv32": dict(bv=32), "warps4": dict(warps=4)}
    if name in forced:
        pkg.pick = lambda T, DH, device, *_: cfg.MLSTMConfig(**{**dict(chunk=64, bv=64, warps=8), **forced[name]})
    pkg.fitted.cache_clear()
    try:
        yield
    finally:
        pkg.dot_mode, pkg.pick = saved
        pkg.fitted.cache_clear()


def parts_line(verdict: dict) -> str:
    return " ".join(f"{p['name']} {p['ours']:.3g}/{p['eager']:.3g}" for p in verdict.get("parts", []))


def worst_steps(case: dict, k: int = 6) -> str:
    """The steps t where dq's rows and df err most (relative to the part's norm)."""
    subject = cells.subject(case, DEVICE)
    outs, grads, dys = common._reference(subject)
    run = common._run(subject.ours, subject, dys)
    names = subject.grad_inputs
    lines = []
    for name in ("q", "f", "i"):
        got, want = run.grads[names.index(name)].double(), grads[names.index(name)]
        err = (got - want).reshape(want.shape[2], -1) if want.dim() == 4 else (got - want).reshape(-1, 1)
        per = err.norm(dim=1) / want.norm()
        top = torch.topk(per, k).indices.tolist()
        lines.append(f"d{name}: " + ", ".join(f"t{t} {per[t]:.3g}" for t in top))
    return "\n    ".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.mlstm_bf16_diag", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cpu":  # Triton's interpreter, set before the kernels are imported
        os.environ["TRITON_INTERPRET"] = "1"
    lines = [f"case: {json.dumps(CASE)}"]
    for name in ("default", "ieee", "chunk32", "chunk16", "bv32", "warps4"):
        with variant(name):
            v = cells.check(CASE, DEVICE)
            lines.append(f"{name}: {v['status']}\n    {parts_line(v)}")
            if name in ("default", "ieee"):
                lines.append("    " + worst_steps(CASE))
    rng = random.Random(7)
    cases = [dict(CASE, seed=rng.randrange(2 ** 31)) for _ in range(args.seeds)]
    for opts in ({}, {"resets": "none"}, {"x_scale": 1.0}):
        for name in ("default", "ieee"):
            over = []
            with variant(name):
                for c in cases:
                    c = dict(c, options=dict(c["options"], **opts))
                    v = cells.check(c, DEVICE)
                    if v["status"] != "ok":
                        over.append(f"{v['status']} {v.get('worst')} {c['seed']}")
            lines.append(f"seeds {args.seeds} {opts or 'as the case'} {name}: {len(over)} not ok  {over[:6]}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
