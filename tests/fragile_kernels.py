"""Kernels whose providers take their measuring process down (`--kernel-module`, tests/test_collect.py):
on the 4-row shape `crash` aborts the process, as an LLVM assertion in a compiler does, and on the
3-row one `hang` never returns; on the other shape each is right, as `torch` always is. `stuck`
hangs as `hang` does and `wreck` crashes as `crash` does, but they build nothing: the precompile
pass leaves them to the run. `deaf`'s
provider, on the 3-row shape, neither returns nor hears Ctrl-C or SIGTERM (a call stuck in native
code does not run Python's signal handlers). `torn`'s `tear` crashes in its backward on the 4-row
shape, so in its bwd and fwd+bwd modes there. Kept apart
from planted_kernels.py, whose kernels every other run test measures."""
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loaded by path, from a fresh process

from planted_kernels import _SHAPES, _p, _spec  # noqa: E402

import torch  # noqa: E402

from kcollect.spec import MODES, Provider  # noqa: E402


HANGS = "KCOLLECT_TEST_HANGS"  # a folder where `hang` leaves a file named by its process id
CRASH = "fragile.cpp:42: void lower(): Assertion `op->use_empty()' failed."  # its last words


def _crash(x):
    if x.shape[0] == 4:
        os.write(2, f"python3: {CRASH}\n".encode())  # as a C++ assertion writes, unbuffered, to fd 2
        os.abort()
    return x * 2.0


def _hang(x):
    if x.shape[0] == 3 and os.environ.get(HANGS):  # says so, for a test's watchdog clock (test_collect)
        Path(os.environ[HANGS], str(os.getpid())).touch()
    while x.shape[0] == 3:
        time.sleep(60)
    return x * 2.0


DEAF = "deaf: SIGINT and SIGTERM blocked"  # on stderr, for the test to signal at the right moment


def _deaf(x):
    if x.shape[0] == 3:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        sys.stderr.write(DEAF + "\n")
        sys.stderr.flush()
        while True:
            time.sleep(60)
    return x * 2.0


SPEC = _spec("fragile", (_p("torch", lambda x: x * 2.0), Provider("crash", _crash), Provider("hang", _hang),
                         Provider("stuck", _hang, builds=False), Provider("wreck", _crash, builds=False)),
                _SHAPES[:2])


class _Tear(torch.autograd.Function):
    """x * 2 whose backward aborts on the 4-row shape, as a compiler's assertion in a backward does."""

    @staticmethod
    def forward(ctx, x):
        ctx.rows = x.shape[0]
        return x * 2.0

    @staticmethod
    def backward(ctx, grad):
        if ctx.rows == 4:
            os.write(2, f"python3: {CRASH}\n".encode())
            os.abort()
        return grad * 2.0


# `tear`'s fwd is right everywhere; its bwd, and so its fwd+bwd, crash on the 4-row shape
TORN = dataclasses.replace(_spec("torn", (_p("torch", lambda x: x * 2.0), Provider("tear", _Tear.apply)),
                                 _SHAPES[:2]), modes=MODES)
SPECS = (SPEC, _spec("deaf", (_p("torch", lambda x: x * 2.0), Provider("deaf", _deaf)), _SHAPES[:2]), TORN)
