"""A worker process's standard error, kept in a file that its parent forwards to its own.

A worker that dies of a compiler's assertion (LLVM's, inside Triton's compile: signal 6) says why
only on its standard error, just before it dies; its `error` row said only "signal 6 (SIGABRT)".
So each worker writes its standard error (Python's and the C libraries' alike: file descriptor 2)
to a file; the parent copies what arrives to its own standard error as it watches the workers,
and a dead worker's row quotes the last line it wrote since its case began."""
from __future__ import annotations

import os
import sys

KEEP = 4096  # bytes of the newest output searched for the line to quote


def redirect(path: str) -> None:
    """In the worker, before anything else writes: file descriptor 2 appends to `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


def written() -> int:
    """In the worker: how many bytes its standard error holds so far (what a case's mark is)."""
    sys.stderr.flush()
    return os.lseek(2, 0, os.SEEK_END)


class Tail:
    """The parent's side of one worker's file: forward what is new; quote what came since a mark
    (the offset the worker reported when its current case began)."""

    def __init__(self, path: str):
        self.path, self.offset, self.since = path, 0, 0
        open(path, "ab").close()

    def mark(self, at: int) -> None:
        self.since = at

    def forward(self, out=None) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            new = f.read()
        if new:
            self.offset += len(new)
            out = out or sys.stderr
            out.write(new.decode(errors="replace"))
            out.flush()

    def last_line(self, limit: int = 300) -> str | None:
        """The newest non-empty line since the mark, cut to `limit` characters; None if none."""
        self.forward()
        with open(self.path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(self.since, size - KEEP))
            text = f.read().decode(errors="replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            return None
        return lines[-1] if len(lines[-1]) <= limit else lines[-1][: limit - 3] + "..."
