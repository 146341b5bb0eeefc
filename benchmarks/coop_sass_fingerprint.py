"""Instruction fingerprints of the coop kernels (rms_norm._bwd_coop, layer_norm._ln_bwd_coop; softmax's
are in lab/softmax_ce_fingerprint.py), compiled offline for sm_90 (no GPU): a hash of
their SASS instructions, addresses stripped. A source refactor that leaves these unchanged leaves
the measured kernels unchanged (used for the review commit after the H200 runs of 2026-11-23).

    python benchmarks/coop_sass_fingerprint.py
"""
import hashlib
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import compile_report as cr  # noqa: E402  (first: compiles for the GPU, not the interpreter)

from kcollect.kernels import layer_norm as L  # noqa: E402
from kcollect.kernels import rms_norm as K  # noqa: E402


def fingerprint(compiled) -> tuple[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([os.path.join(cr._BIN, "cuobjdump"), "--dump-sass", f.name],
                             capture_output=True, text=True, check=True).stdout
    ins = [re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip()
           for line in out.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    return hashlib.sha1("\n".join(ins).encode()).hexdigest()[:12], len(ins)


COMMON = {"M": "i32", "N": "i32", "S": "i32", "iters": "i32", "SEG": "constexpr", "S_BLOCK": "constexpr"}
LN = {"x_ptr": "*bf16", "dy_ptr": "*bf16", "w_ptr": "*bf16", "mean_ptr": "*fp32", "rstd_ptr": "*fp32",
      "dx_ptr": "*bf16", "part_ptr": "*fp32", "slot_ptr": "*i64", **COMMON, "N_ALIGN": "constexpr"}
RB = {"x_ptr": "*bf16", "w_ptr": "*bf16", "dy_ptr": "*bf16", "dh_ptr": "*bf16", "rstd_ptr": "*fp32",
      "dx_ptr": "*bf16", "dwp_ptr": "*fp32", "slot_ptr": "*i64", **COMMON, "HAS_DH": "constexpr"}


def main():
    for s_block in (32, 64, 128):  # 65536, 128256 and 262144 wide in segments of 2048
        c = {"SEG": 2048, "S_BLOCK": s_block, "N_ALIGN": 16}
        print("layer_norm bwd", s_block, fingerprint(cr.compile_sm90(
            L._ln_bwd_coop, LN, c, 4, aligned=("x_ptr", "dy_ptr", "w_ptr", "dx_ptr", "part_ptr", "N"))))
        for dh in (False, True):
            print("rms_norm bwd", s_block, "dh" if dh else "", fingerprint(cr.compile_sm90(
                K._bwd_coop, RB, {"SEG": 2048, "S_BLOCK": s_block, "HAS_DH": dh}, 4,
                aligned=("x_ptr", "w_ptr", "dy_ptr", "dh_ptr", "dx_ptr", "dwp_ptr", "N"))))


if __name__ == "__main__":
    main()
