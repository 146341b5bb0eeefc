"""Launch fingerprints of gelu, geglu, swiglu, rope and fp8_quant on an emulated H100 and H200
(lab/fingerprint.py has the machinery and the options): every full-grid shape in every mode, in
bf16 and fp32. Run it on two trees and compare the files: equal tables mean the same binaries
launched the same way.

    python lab/elementwise_fingerprint.py --out before.json      # a few minutes of CPU
    python lab/elementwise_fingerprint.py --out after.json
    python lab/elementwise_fingerprint.py --compare before.json after.json   # exit 1 if a launch differs
    python lab/elementwise_fingerprint.py --only op=rope --only dtype=float32 --out rope.json
    (--tree DIR takes the kernels from another checkout; --gpu h100|h200 one GPU)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab import fingerprint  # noqa: E402  (first: it compiles for the GPU, not the interpreter)

import torch  # noqa: E402

OPS = ("gelu", "geglu", "swiglu", "rope", "fp8_quant")


def cases():
    from kcollect.registry import builtin_spec

    return fingerprint.spec_cases([builtin_spec(op) for op in OPS], dict.fromkeys(OPS, {torch.float32: fingerprint.ALL}))


if __name__ == "__main__":
    sys.exit(fingerprint.main(cases, __doc__))
