"""Starting a worker process that a Ctrl-C must not interrupt while it starts up.

A spawned process imports kcollect and torch before it can install its signal handlers, and the
terminal sends Ctrl-C's SIGINT to the whole process group: a Ctrl-C in those seconds printed a
KeyboardInterrupt traceback from every worker. So each is started with SIGINT ignored: Python
keeps a SIGINT it inherits as ignored (it installs its KeyboardInterrupt handler only over the
default), until the worker installs its own handler. The parent forwards a Ctrl-C to its workers
as SIGTERM, which ends one that is still starting quietly.
"""
from __future__ import annotations

import signal


def start_quietly(proc) -> None:
    """proc.start(), the child inheriting SIGINT ignored. Meanwhile this process's SIGINT is blocked,
    not ignored: one that comes is held (Linux keeps a blocked signal even while it is ignored) and
    arrives, to the handler put back, when this returns."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT,))
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc.start()
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
