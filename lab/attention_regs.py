"""Registers and spills of the attention kernels per config, without a GPU.

Each kernel is built by the installed Triton for sm_90 (benchmarks/compile_report.py: bf16, D 128,
causal, pointers 16-byte aligned), which reports the registers a thread uses, its stack (where the
spills go) and the local stores and loads in its SASS. What a tuning run times (the stalls) this
does not see; it says where the register file overflows, and so which configs and which code
changes are worth a GPU's time:

    python -m lab.attention_regs                 # the forward, the dk/dv and the dq kernel, TMA or not
    python -m lab.attention_regs --kernel dkdv --config 64,32,4,3 --tma --flag ONE_KEY=1

--config is BLOCK_A,BLOCK_B,warps,stages (fwd: BLOCK_M,BLOCK_N; dkdv: BLOCK_N,BLOCK_M; dq:
BLOCK_M,BLOCK_N); --flag sets one of the kernel's other constexprs (RESIDUAL, SHIFT, ONE_KEY).
Triton's own ptxas may differ from the one the collector builds with (the torch wheel's), and the
GPU machine's Triton from this machine's: read the numbers as differences between configs.
"""
from __future__ import annotations

import argparse
import sys

KERNELS = ("fwd", "dkdv", "dq")
POINTERS = {"Q", "K", "V", "O", "R", "LSE", "CU_Q", "CU_K", "DO", "DELTA", "DK", "DV", "DQ"}
DEFAULTS = {  # the H200's picks for causal MHA at S 4096 (kernels/attention/config.py)
    "fwd": [(64, 64, 4, 3)], "dkdv": [(64, 64, 4, 2), (64, 32, 4, 3)], "dq": [(128, 64, 8, 3), (64, 64, 4, 3)]}


def _signature(fn, consts: dict) -> dict:
    """Every argument's type: pointers bf16 (R int8, LSE/DELTA fp32, CU_* int32), the scales fp32,
    the rest int32, the constexprs as such."""
    special = {"R": "*i8", "LSE": "*fp32", "DELTA": "*fp32", "CU_Q": "*i32", "CU_K": "*i32"}
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in POINTERS:
            sig[name] = special.get(name, "*bf16")
        else:
            sig[name] = "fp32" if name in ("qk_scale", "scale") else "i32"
    return sig


def usage(kernel: str, config: tuple[int, int, int, int], tma: bool, flags: dict) -> str:
    """Registers, the stack (where the spills go) and the local stores and loads in the SASS of one build."""
    from benchmarks.compile_report import report
    from kcollect.kernels.attention import bwd, fwd

    a, b, warps, stages = config
    base = dict(D=128, BLOCK_D=128, CAUSAL=True, HAS_WINDOW=False, VARLEN=False, TMA=tma, PIPELINE=True)
    fn, consts = {
        "fwd": (fwd._attn_fwd, dict(base, BLOCK_M=a, BLOCK_N=b, PERSISTENT=False, RESIDUAL=False, R_SCALE=32512.0)),
        "dkdv": (bwd._bwd_dkdv, dict(base, BLOCK_N=a, BLOCK_M=b, ONE_KEY=False)),
        "dq": (bwd._bwd_dq, dict(base, BLOCK_M=a, BLOCK_N=b, SHIFT=False, ONE_KEY=False)),
    }[kernel]
    consts.update(flags)
    sig = _signature(fn, consts)
    r = report(fn, sig, consts, num_warps=warps, num_stages=stages, aligned=[n for n in sig if n in POINTERS])
    ops = r["sass_ops"]
    stl, ldl = (sum(v for k, v in ops.items() if k.startswith(op)) for op in ("STL", "LDL"))
    return f"{r['registers']} registers, stack {r['stack']} B, STL {stl}, LDL {ldl} (SASS instructions)"


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
