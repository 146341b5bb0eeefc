"""Launch fingerprints of softmax, cross_entropy and fused_linear_cross_entropy on an emulated H100
and H200 (lab/fingerprint.py has the machinery and the options): every shape of both grids in every
mode in bf16, and a few shapes in fp32 (whose rows are twice as wide in bytes: other paths) and
fp16 (cross_entropy's fp32 kernels form x - max exactly, its bf16 and fp16 ones do not).

    python lab/softmax_ce_fingerprint.py --out before.json       # before the change
    python lab/softmax_ce_fingerprint.py --out after.json        # after it
    python lab/softmax_ce_fingerprint.py --compare before.json after.json   # exit 1 if a launch differs
    python lab/softmax_ce_fingerprint.py --only op=softmax --gpu h200 --out softmax.json
    (--tree DIR takes the kernels from another checkout instead of this one)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab import fingerprint  # noqa: E402  (first: it compiles for the GPU, not the interpreter)

import torch  # noqa: E402

_CE = ("tokens=1024,vocab=32000,smoothing=0", "tokens=4096,vocab=128256,smoothing=0",
       "tokens=1,vocab=128256,smoothing=0", "tokens=6,vocab=20011,smoothing=0.1")
OTHER_DTYPES = {
    "softmax": {torch.float32: ("M=4096,N=32000", "M=2048,N=65536", "M=2048,N=128256", "M=1,N=128256",
                                "M=37,N=1000")},
    "cross_entropy": {torch.float32: _CE, torch.float16: _CE},
    "fused_linear_cross_entropy": dict.fromkeys((torch.float32, torch.float16),
                                                ("tokens=4096,hidden=4096,vocab=32000,smoothing=0.1",)),
}


def cases():
    from kcollect.kernels.cross_entropy.spec import SPEC as CE
    from kcollect.kernels.fused_linear_cross_entropy.spec import SPEC as FLCE
    from kcollect.kernels.softmax.spec import SPEC as SOFTMAX

    return fingerprint.spec_cases((SOFTMAX, CE, FLCE), OTHER_DTYPES, grids=("full", "quick"))


if __name__ == "__main__":
    sys.exit(fingerprint.main(cases, __doc__))
