"""Instruction fingerprints of softmax's coop kernels (_softmax_fwd_coop / _softmax_bwd_coop),
compiled offline for sm_90 (no GPU): a hash of their SASS instructions, addresses stripped. A
source refactor that leaves these unchanged leaves the measured kernels unchanged (used for the
review commit after the H200 runs of 2026-11-23).

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

from kcollect.kernels import softmax as SM  # noqa: E402


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
SF = {"x_ptr": "*bf16", "y_ptr": "*bf16", "slot_ptr": "*i64", **COMMON, "N_ALIGN": "constexpr"}
SB = {"y_ptr": "*bf16", "dy_ptr": "*bf16", "dx_ptr": "*bf16", "slot_ptr": "*i64", **COMMON, "N_ALIGN": "constexpr"}


def main():
    for s_block in (32, 64, 128):  # 65536, 128256 and 262144 wide in segments of 2048
        c = {"SEG": 2048, "S_BLOCK": s_block, "N_ALIGN": 16}
        print("softmax fwd", s_block, fingerprint(cr.compile_sm90(SM._softmax_fwd_coop, SF, c, 4,
                                                                   aligned=("x_ptr", "y_ptr", "N"))))
        print("softmax bwd", s_block, fingerprint(cr.compile_sm90(SM._softmax_bwd_coop, SB, c, 4,
                                                                   aligned=("y_ptr", "dy_ptr", "dx_ptr", "N"))))


if __name__ == "__main__":
    main()
