"""The built-in ops, one folder each (`kernels/<op>/`, built as docs/add-a-kernel.md says), and what
several of them share, by layer: `_jit/` (Triton device helpers), `_host/` (launch shapes, configs,
device queries), `_spec/` (what the spec modules share; the collector's side). The list of ops and
the lookup live in `kcollect.registry`.

Importing an op defines Triton kernels, so whoever wants Triton's CPU interpreter must set
TRITON_INTERPRET=1 before the first import (the CLI and tests/conftest.py do).
"""
from ._interpreter_patch import round_to_nearest

round_to_nearest()  # under the interpreter, bf16 casts round as on the GPU (_interpreter_patch.py)
