"""Registers and spills of the attention kernels per config, without a GPU.

Each kernel is built by the installed Triton for sm_90 (triton.compile on an ASTSource, bf16, D 128,
causal, pointers 16-byte aligned) and its PTX handed to Triton's own ptxas with -v, which reports
the registers a thread uses and the bytes spilled to local memory. What a tuning run times (the
stalls) this does not see; it says where the register file overflows, and so which configs and
which code changes are worth a GPU's time:

    python -m lab.attention_regs                 # the forward, the dk/dv and the dq kernel, TMA or not
    python -m lab.attention_regs --kernel dkdv --config 64,32,4,3 --tma --flag ONE_KEY=1

--config is BLOCK_A,BLOCK_B,warps,stages (fwd: BLOCK_M,BLOCK_N; dkdv: BLOCK_N,BLOCK_M; dq:
BLOCK_M,BLOCK_N); --flag sets one of the kernel's other constexprs (RESIDUAL, SHIFT, ONE_KEY).
The ptxas of Triton's wheel may differ from the one the collector builds with (the torch wheel's),
and the GPU machine's Triton from this machine's: read the numbers as differences between configs.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

KERNELS = ("fwd", "dkdv", "dq")
POINTERS = {"Q", "K", "V", "O", "R", "LSE", "CU_Q", "CU_K", "DO", "DELTA", "DK", "DV", "DQ"}
DEFAULTS = {  # the H200's picks for causal MHA at S 4096 (kernels/attention/config.py)
    "fwd": [(64, 64, 4, 3)], "dkdv": [(64, 64, 4, 2), (64, 32, 4, 3)], "dq": [(128, 64, 8, 3), (64, 64, 4, 3)]}


def _signature(fn, consts: dict) -> tuple[dict, dict]:
    """Every non-constexpr argument: pointers bf16 (R int8, LSE/DELTA fp32, CU_* int32) with
    16-byte divisibility, the scales fp32, the rest int32."""
    special = {"R": "*i8", "LSE": "*fp32", "DELTA": "*fp32", "CU_Q": "*i32", "CU_K": "*i32"}
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in POINTERS:
            sig[name] = special.get(name, "*bf16")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32" if name in ("qk_scale", "scale") else "i32"
    return sig, attrs


def usage(kernel: str, config: tuple[int, int, int, int], tma: bool, flags: dict) -> str:
    """ptxas -v's registers and spills of one build."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kcollect.kernels.attention import bwd, fwd

    a, b, warps, stages = config
    base = dict(D=128, BLOCK_D=128, CAUSAL=True, HAS_WINDOW=False, VARLEN=False, TMA=tma, PIPELINE=True)
    fn, consts = {
        "fwd": (fwd._attn_fwd, dict(base, BLOCK_M=a, BLOCK_N=b, PERSISTENT=False, RESIDUAL=False, R_SCALE=32512.0)),
        "dkdv": (bwd._bwd_dkdv, dict(base, BLOCK_N=a, BLOCK_M=b, ONE_KEY=False)),
        "dq": (bwd._bwd_dq, dict(base, BLOCK_M=a, BLOCK_N=b, SHIFT=False, ONE_KEY=False)),
    }[kernel]
    consts.update(flags)
    sig, attrs = _signature(fn, consts)
    built = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(built.asm["ptx"])
        out = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", path, "-o", os.devnull], capture_output=True,
                             text=True)
    text = " ".join(out.stdout.splitlines() + out.stderr.splitlines())
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if not regs:
        return f"ptxas said: {text[:300]}"
    return f"{regs.group(1)} registers, spill stores {spills.group(1) if spills else 0} B, loads " \
           f"{spills.group(2) if spills else 0} B"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.attention_regs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", choices=KERNELS, action="append")
    ap.add_argument("--config", action="append", help="BLOCK_A,BLOCK_B,warps,stages (repeatable)")
    ap.add_argument("--tma", action="store_true", help="only the TMA builds (default: both)")
    ap.add_argument("--flag", action="append", default=[], help="NAME=0|1, a constexpr of the kernel")
    args = ap.parse_args(argv)
    flags = {}
    for item in args.flag:
        name, _, value = item.partition("=")
        if not name.isupper() or value not in ("0", "1"):
            ap.error(f"--flag {item}: give NAME=0 or NAME=1 (e.g. ONE_KEY=1)")
        flags[name] = value == "1"
    try:
        configs = [tuple(int(x) for x in c.split(",")) for c in args.config or []]
    except ValueError:
        ap.error("--config: four integers, BLOCK_A,BLOCK_B,warps,stages")
    if any(len(c) != 4 for c in configs):
        ap.error("--config: four integers, BLOCK_A,BLOCK_B,warps,stages")
    for kernel in args.kernel or KERNELS:
        for config in configs or DEFAULTS[kernel]:
            for tma in ((True,) if args.tma else (False, True)):
                flag_text = "".join(f" {k}={int(v)}" for k, v in flags.items())
                print(f"{kernel:<5} {config} tma={tma}{flag_text}: {usage(kernel, config, tma, flags)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
