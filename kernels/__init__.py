"""The built-in ops, one folder each (`kernels/<op>/`: the public functions in `__init__.py`, the
spec in `spec.py`), and `_lib/` for what several of them share. The list of ops and the lookup
live in `kcollect.registry`.

Importing an op defines Triton kernels, so whoever wants Triton's CPU interpreter must set
TRITON_INTERPRET=1 before the first import (the CLI and tests/conftest.py do).
"""
from ._lib.interpreter import round_to_nearest

round_to_nearest()  # under the interpreter, bf16 casts round as on the GPU (_lib/interpreter.py)
