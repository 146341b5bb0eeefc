"""The seed of each case's random inputs.

From the run's seed and the case's identity (kernel, shape, dtype) alone, never from its place in
the plan: `kcollect run KERNEL --shape LABEL --dtype D --seed S` then draws the same inputs as the
case had in the whole run of seed S, so that one failing row can be reproduced by itself (with the
seed offset by the position, as before, the same row drew other inputs in a smaller plan).
"""
from __future__ import annotations

import hashlib

from .plan import Case
from .spec import DTYPE_NAMES


def case_seed(run_seed: int, case: Case) -> int:
    """A 31-bit seed from a stable hash (Python's hash() of a string changes per process)."""
    key = f"{run_seed}\0{case.spec.name}\0{case.shape.label}\0{DTYPE_NAMES[case.dtype]}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") & 0x7FFFFFFF
