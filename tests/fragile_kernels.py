"""A kernel whose providers take their measuring process down (`--kernel-module`, tests/test_collect.py):
`crash` aborts the process, as an LLVM assertion in a compiler does, and `hang` never returns, beside
a plain `torch`. Kept apart from planted_kernels.py, whose kernels every other run test measures."""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loaded by path, from a fresh process

from planted_kernels import _SHAPES, _p, _spec  # noqa: E402

from kcollect.spec import Provider  # noqa: E402


def _crash(x):
    os.abort()


def _hang(x):
    while True:
        time.sleep(60)


SPEC = _spec("fragile", (_p("torch", lambda x: x * 2.0), Provider("crash", _crash), Provider("hang", _hang)),
             _SHAPES[:2])
