"""Registers and spills of attention's launches, without a GPU.

One fwd+bwd call of attention() as the collector makes it, on an emulated H100 or H200
(lab/fingerprint.py: its launches recorded and each compiled offline for sm_90, specialised as the
JIT would), with the picked configs, with them built with TMA, and under accurate=True; per
launch the kernel, its blocks, warps and stages, registers and stack (where spills go). What a
timing run measures (the stalls) this does not see; it says where the register file overflows,
and so which configs and code changes are worth a GPU's time:

    python -m lab.attention_regs [--gpu h200] \
        [--shape B=4,Hq=16,Hkv=16,Sq=4096,Skv=4096,D=128,causal=1,window=0,varlen=0]

The GPU machine builds with Triton 3.6 and torch's ptxas, this machine perhaps with others: read
the numbers as differences between variants.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from unittest import mock

from lab import fingerprint as fp  # first: compiles for the GPU, not the interpreter

import torch  # noqa: E402

CAUSAL_4K = "B=4,Hq=16,Hkv=16,Sq=4096,Skv=4096,D=128,causal=1,window=0,varlen=0"


@contextlib.contextmanager
def accurate():
    """The spec's triton provider as attention(accurate=True)."""
    from kcollect.kernels.attention import attention, spec

    with mock.patch.object(spec, "attention", functools.partial(attention, accurate=True)):
        yield


def rows(gpu: str, dims: dict, tma: bool, precise: bool) -> list[str]:
    from lab.attention_delta_ab import with_tma
    from kcollect.kernels.attention.spec import SPEC

    lines = []
    with fp.emulated(gpu), with_tma() if tma else contextlib.nullcontext(), \
            accurate() if precise else contextlib.nullcontext():
        for launch in fp.mode_launches(SPEC, "fwd+bwd", dims, torch.bfloat16):
            r = fp.describe(*launch)
            blocks = ",".join(f"{k}={v}" for k, v in r["constexprs"].items()
                              if k.startswith("BLOCK_") and k != "BLOCK_D")
            lines.append(f"{r['kernel']:<11} {blocks:<22} w{r['num_warps']} s{r['num_stages']}: "
                         f"{r['registers']} registers, stack {r['stack']} B, {r['instructions']} instructions")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.attention_regs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", choices=sorted(fp.GPUS), default="h200")
    ap.add_argument("--shape", default=CAUSAL_4K, help="a shape label of attention's dims")
    args = ap.parse_args(argv)
    from lab.ab import parse_shape

    try:
        dims = parse_shape(args.shape)
    except ValueError as e:
        ap.error(f"--shape: {e}")
    if sorted(dims) != sorted(parse_shape(CAUSAL_4K)):
        ap.error(f"--shape {args.shape}: give every one of attention's dims, as {CAUSAL_4K}")
    for tma in (False, True):
        for precise in (False, True):
            print(f"{args.gpu} {args.shape} tma={tma} accurate={precise}")
            print("\n".join("  " + line for line in rows(args.gpu, dims, tma, precise)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
