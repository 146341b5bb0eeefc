"""Where an op's time goes, kernel by kernel, on the GPU: the spec's own inputs at grid shapes, the
`triton` provider's call (fwd or bwd) run under torch.profiler, each CUDA kernel's time per call.
With --tree, the op as another checkout has it (a worktree of an older commit), imported through the
same shim `compare --confirm` uses; with --config, forced configs of the op's config module.

    python -m lab.kernel_profile mlstm --mode bwd --shape B=8,NH=8,T=1024,DH=64,resets=0 \\
        [--tree /tmp/old] [--config 'bv32=MLSTMConfig(bv=32)']

Prints, per shape and variant, the kernels sorted by time (µs per call) and their sum."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections import defaultdict
from pathlib import Path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.kernel_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("op")
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--mode", default="bwd", choices=("fwd", "bwd"))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tree", help="another checkout whose op to profile")
    ap.add_argument("--config", action="append", default=[], help="NAME=EXPR in the op's config module")
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args(argv)
    if args.tree:
        from kcollect.confirm_worker import shim

        sys.path.insert(0, str(shim(Path(args.tree))))
        for name in [m for m in sys.modules if m == "kcollect" or m.startswith("kcollect.")]:
            del sys.modules[name]
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # a dry run on the interpreter: no CUDA kernels to list, the CPU's ops instead
        os.environ["TRITON_INTERPRET"] = "1"
    from kcollect import verify
    from kcollect.registry import load
    from kcollect.spec import DTYPES
    from lab.ab import Forcing, parse_shape, variants

    spec = load().get(args.op)
    chosen = variants(args.op, args.config)
    dtype = DTYPES[args.dtype]
    fn = spec.provider("triton").fn
    where = importlib.import_module(f"kcollect.kernels.{args.op}").__file__
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"# {args.op} {args.mode} {args.dtype}, from {where}; {gpu}")
    for text in args.shape:
        dims = parse_shape(text)
        inputs = spec.make_inputs(dims, dtype, device, seed=0)
        dys, want = verify.reference_answers(spec, inputs, args.mode, seed=1)
        for name, config in chosen.items():
            force = Forcing(config)
            try:
                call = force.wrap(verify.build_call(spec, force.wrap(fn), verify.clone_inputs(inputs), args.mode, dys))
                error = verify.error_of(spec, call(), want, args.mode)
            except Exception as e:  # a forced config that does not fit: the next variant
                print(f"{text} [{name}]: {type(e).__name__}: {str(e)[:200]}")
                continue
            for _ in range(3):
                call()
            kind = torch.profiler.ProfilerActivity.CUDA if device == "cuda" else torch.profiler.ProfilerActivity.CPU
            with torch.profiler.profile(activities=[kind]) as prof:
                for _ in range(args.calls):
                    call()
                if device == "cuda":
                    torch.cuda.synchronize()
            us = defaultdict(float)
            for ev in prof.events():
                if device == "cpu" or ev.device_type == torch.autograd.DeviceType.CUDA:
                    us[ev.name[:60]] += (ev.device_time if device == "cuda" else ev.cpu_time) / args.calls
            print(f"{text} [{name}]: {sum(us.values()):.1f} us a call, error {error:.2e}")
            for k, v in sorted(us.items(), key=lambda kv: -kv[1])[:8]:
                print(f"    {v:9.1f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
