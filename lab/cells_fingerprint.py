"""Launch fingerprints of the recurrent cells (lstm, slstm, mlstm, axon) on an emulated H100 and H200
(lab/fingerprint.py has the machinery and the options): every shape of their full grids in every
mode, in bf16 and in fp32 (whose kernels take the PRECISE and float64 paths).

    python lab/cells_fingerprint.py --only op=lstm --out after.json   # minutes of CPU a cell
    python lab/cells_fingerprint.py --only op=lstm --tree /tmp/old --out before.json
    python lab/cells_fingerprint.py --compare before.json after.json  # exit 1 if a launch differs
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab import fingerprint  # noqa: E402  (first: it compiles for the GPU, not the interpreter)


def cases():
    import torch

    from kcollect.registry import builtin_spec

    specs = [builtin_spec(op) for op in ("lstm", "slstm", "mlstm", "axon")]
    return fingerprint.spec_cases(specs, {s.name: {torch.float32: fingerprint.ALL} for s in specs})


if __name__ == "__main__":
    sys.exit(fingerprint.main(cases, __doc__))
