"""fp32 accuracy against eager: for each op, shape and mode, ours ("triton") and eager ("torch") on the
same fresh random inputs, their relative errors against float64 output by output, and the worst
ratio ours / eager over seeds (issue 27's goal: at most 2). Shapes the tests do not use: width 1,
primes, one row, wide rows.

    python -m lab.fp32_accuracy [--seeds 6] [--ops rms_norm,layer_norm]   (on the GPU: TRITON_INTERPRET unset)
"""
from __future__ import annotations

import argparse

NORM_SHAPES = [{"M": 64, "N": 1}, {"M": 257, "N": 1}, {"M": 64, "N": 3}, {"M": 1000, "N": 7}, {"M": 1, "N": 4099},
               {"M": 4097, "N": 4096}, {"M": 33, "N": 65536}]
SHAPES = {
    "rms_norm": NORM_SHAPES,
    "layer_norm": NORM_SHAPES,
    "softmax": [{"M": 64, "N": 1}, {"M": 1, "N": 4099}, {"M": 1000, "N": 7}, {"M": 37, "N": 131071}],
}


def ratios(spec, dims, mode, seeds: int, device: str) -> tuple[list[float], list[float], list[float]]:
    """(worst ours/eager ratio, our largest error, eager's largest error), output by output."""
    import torch

    from kcollect import verify

    per_seed = []
    for seed in range(seeds):
        inputs = spec.make_inputs(dims, torch.float32, device, seed)
        dys, want = verify.reference_answers(spec, inputs, mode, seed + 1)
        ours, eager = (verify.part_errors(spec, verify.build_call(spec, spec.provider(name).fn,
                                                                  verify.clone_inputs(inputs), mode, dys)(), want, mode)
                       for name in ("triton", "torch"))
        ratio = [o / e if e else (float("inf") if o else 1.0) for o, e in zip(ours, eager)]
        per_seed.append((ratio, ours, eager))
    return tuple([max(col) for col in zip(*parts)] for parts in zip(*per_seed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--ops", default=",".join(SHAPES))
    args = ap.parse_args()
    import torch

    from kcollect.registry import load

    device = "cuda" if torch.cuda.is_available() else "cpu"
    registry = load()
    print(f"{'op':<11} {'shape':<18} {'mode':<4} worst ours/eager per output (ours max err | eager max err)")
    for op in args.ops.split(","):
        spec = registry.get(op)
        for dims in SHAPES[op]:
            for mode in ("fwd", "bwd"):
                worst, ours, eager = ratios(spec, dims, mode, args.seeds, device)
                shape = "x".join(str(v) for v in dims.values())
                print(f"{op:<11} {shape:<18} {mode:<4} " + " ".join(f"{w:6.2f}" for w in worst) + "   ("
                      + " ".join(f"{o:.1e}" for o in ours) + " | " + " ".join(f"{e:.1e}" for e in eager) + ")", flush=True)


if __name__ == "__main__":
    main()
