"""Where attention's accuracy measures (attention(accurate=True), kernels/attention/bwd.py) spend
their time: each kernel's GPU time per fwd+bwd call, by variant (lab.attention_delta_ab's off,
residual, shift, on), from torch.profiler's CUDA activity. lab.attention_delta_ab times the whole
call; this says which launch the difference is in.

    python -m lab.attention_kernel_times --out DIR [--shapes s512,b4h16s1k] [--iters 20]
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from lab.attention_delta_ab import SHAPES, VARIANTS, attention_with


def kernel_times(call, iters: int) -> dict[str, float]:
    """Microseconds of GPU time per call, summed by kernel name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        if e.self_device_time_total > 0:
            out[e.key[:40]] += e.self_device_time_total / iters
    return dict(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.attention_kernel_times", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".", help="folder for attention_kernel_times.txt")
    ap.add_argument("--shapes", default="s512,b4h16s1k", help="comma-separated, of lab.attention_delta_ab's shapes")
    ap.add_argument("--iters", type=int, default=20, help="profiled calls per variant (after 3 untimed)")
    args = ap.parse_args(argv)
    names = [s for s in args.shapes.split(",") if s]
    if any(s not in SHAPES for s in names) or args.iters < 1:
        print(f"python -m lab.attention_kernel_times: shapes from {', '.join(SHAPES)}; --iters >= 1", file=sys.stderr)
        return 2
    import torch

    from kcollect import verify
    from kcollect.common import pin_ptxas
    from kcollect.kernels.attention.spec import SPEC

    pin_ptxas()
    report = Path(args.out) / "attention_kernel_times.txt"
    report.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"GPU time per bf16 fwd+bwd call by kernel (us, torch.profiler, {args.iters} calls), "
             f"{torch.cuda.get_device_name()}"]
    for name in names:
        b, hq, hkv, s, d, causal = SHAPES[name]
        dims = {"B": b, "Hq": hq, "Hkv": hkv, "Sq": s, "Skv": s, "D": d, "causal": causal, "window": 0, "varlen": 0}
        inputs = SPEC.make_inputs(dims, torch.bfloat16, "cuda", 0)
        dy = (torch.randn(b, s, hq, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64).cuda(),)
        times = {v: kernel_times(verify.build_call(SPEC, attention_with(v), inputs, "fwd+bwd", dy), args.iters)
                 for v in VARIANTS}
        kernels = sorted({k for t in times.values() for k in t}, key=lambda k: -times["off"].get(k, 0.0))
        lines.append(f"\n{name} {dims}")
        lines.append(f"{'kernel':42s}" + "".join(f"{v:>12s}" for v in VARIANTS))
        for k in kernels + ["total"]:
            row = [sum(t.values()) if k == "total" else t.get(k, 0.0) for t in times.values()]
            lines.append(f"{k:42s}" + "".join(f"{x:12.1f}" for x in row))
        print("\n".join(lines[-len(kernels) - 3:]), flush=True)
        del inputs
    report.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
