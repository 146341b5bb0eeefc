"""The RTU's bf16 error inherent in a case: the gradients of the PyTorch path (log_depth: fp32
state, the maps applied in bf16 as every provider does) against the float64 reference, over fresh
seeds, per low-rank shape of the full grid; one set of seeds to set a tolerance on, another to
report its rate on.

    PYTHONPATH=. python -m lab.rtu_bf16_gate --seeds 200
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from kcollect import verify
from kcollect.kernels.rtu import providers
from kcollect.kernels.rtu.spec import SPEC


def errors(dims: dict, seeds: range) -> np.ndarray:
    out = []
    for seed in seeds:
        inputs = SPEC.make_inputs(dims, torch.bfloat16, "cpu", seed)
        dys, want = verify.reference_modes(SPEC, inputs, ("bwd",), seed + 1)["bwd"]
        call = verify.build_call(SPEC, providers.log_depth, verify.clone_inputs(inputs), "bwd", dys)
        out.append(verify.error_of(SPEC, call(), want, "bwd"))
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200, help="seeds in each of the two sets")
    ap.add_argument("--max-t", type=int, default=1024, help="shapes up to this many steps")
    args = ap.parse_args()
    tol = SPEC.tolerance[torch.bfloat16]
    print(f"tolerance now {tol:g}; calibration seeds 0..{args.seeds - 1}, held out {args.seeds}..{2 * args.seeds - 1}")
    print("shape | calibration: median p99 max | held out: median p99 max, over the tolerance")
    for shape in SPEC.grids["full"]:
        d = shape.dims
        if d["R"] == "diag" or d["T"] > args.max_t:
            continue
        cal, held = errors(d, range(args.seeds)), errors(d, range(args.seeds, 2 * args.seeds))
        q = lambda e: f"{np.median(e):.4f} {np.quantile(e, 0.99):.4f} {e.max():.4f}"  # noqa: E731
        print(f"{shape.label} | {q(cal)} | {q(held)}, {int((held > tol).sum())} of {len(held)}", flush=True)


if __name__ == "__main__":
    main()
