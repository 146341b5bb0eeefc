"""Launch fingerprints of every built-in op on an emulated H100 and H200 (lab/fingerprint.py has the
machinery and the options): every shape of the full grid in every mode in bf16, and the quick grid
in every dtype the op claims. For a refactor that must not change what any kernel compiles to (files
and functions moved or renamed): equal tables mean the same binaries launched the same way.

    mkdir /tmp/old && git archive REV | tar -x -C /tmp/old       # the kernels before the change
    python lab/all_fingerprint.py --tree /tmp/old --out before.json   # tens of minutes of CPU
    python lab/all_fingerprint.py --out after.json
    python lab/all_fingerprint.py --compare before.json after.json     # exit 1 if a launch differs
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab import fingerprint  # noqa: E402  (first: it compiles for the GPU, not the interpreter)


def cases():
    from kcollect.registry import BUILTIN, builtin_spec

    specs = [builtin_spec(op) for op in BUILTIN]
    full = fingerprint.spec_cases(specs, grids=("full",))
    quick = [(spec, mode, shape.dims, dtype) for spec in specs for shape in spec.grids["quick"]
             for mode in spec.modes for dtype in spec.dtypes]
    return full + quick


if __name__ == "__main__":
    sys.exit(fingerprint.main(cases, __doc__))
