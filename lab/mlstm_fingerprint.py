"""Launch fingerprints of mlstm on an emulated H100 and H200 (lab/fingerprint.py has the machinery and
the options): every shape of its full grid in every mode in bf16.

    python lab/mlstm_fingerprint.py --out after.json             # minutes of CPU: every binary compiles
    python lab/mlstm_fingerprint.py --tree /tmp/old --out before.json
    python lab/mlstm_fingerprint.py --compare before.json after.json   # exit 1 if a launch differs
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab import fingerprint  # noqa: E402  (first: it compiles for the GPU, not the interpreter)


def cases():
    from kcollect.kernels.mlstm.spec import SPEC

    return fingerprint.spec_cases((SPEC,))


if __name__ == "__main__":
    sys.exit(fingerprint.main(cases, __doc__))
