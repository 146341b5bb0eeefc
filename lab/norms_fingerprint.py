"""Launch fingerprints of rms_norm, add_rms_norm and layer_norm on an emulated H100 and H200
(lab/fingerprint.py has the machinery and the options): every shape of their full grids in every
mode in bf16, and in fp16 and fp32 a shape of each launch path (register tiles of one and two
column blocks, persistent grids, unaligned rows, the wide rows' lines / packed / coop paths).

    python lab/norms_fingerprint.py --out after.json             # minutes of CPU: every binary compiles
    mkdir /tmp/old && git archive REV | tar -x -C /tmp/old       # the kernels before a change
    python lab/norms_fingerprint.py --tree /tmp/old --out before.json
    python lab/norms_fingerprint.py --compare before.json after.json   # exit 1 if a launch differs
    python lab/norms_fingerprint.py --only op=layer_norm --only mode=bwd --gpu h100 --out ln.json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab import fingerprint  # noqa: E402  (first: it compiles for the GPU, not the interpreter)

import torch  # noqa: E402

_OTHER = {"rms_norm": ("M=8192,N=4096", "M=16384,N=5120", "M=2048,N=16384", "M=999,N=5003", "M=1024,N=65536"),
          "add_rms_norm": ("M=8192,N=4096", "M=999,N=5003", "M=1024,N=65536"),
          "layer_norm": ("M=4096,N=4096", "M=8192,N=8192", "M=3000,N=5120", "M=4096,N=16384", "M=2048,N=65536")}


def cases():
    from kcollect.kernels.add_rms_norm.spec import SPEC as ADD
    from kcollect.kernels.layer_norm.spec import SPEC as LN
    from kcollect.kernels.rms_norm.spec import SPEC as RMS

    other = {op: dict.fromkeys((torch.float16, torch.float32), labels) for op, labels in _OTHER.items()}
    return fingerprint.spec_cases((RMS, ADD, LN), other)


if __name__ == "__main__":
    sys.exit(fingerprint.main(cases, __doc__))
