"""The modes and dtypes by name, for the command line, and `plain` for the text of errors: without
torch, so that the commands that never measure (summary, export, import, compare, build-site,
--help) start without importing it."""
from __future__ import annotations

import re

MODES = ("fwd", "bwd", "fwd+bwd")
DTYPE_CHOICES = ("bfloat16", "float16", "float32")  # spec.DTYPES maps each to its torch dtype


# A terminal's colour codes, which some compilers put in their messages (the CuTe DSL's
# "\x1b[91merror[INTERNAL]:\x1b[0m ..."): a row's error is read on pages and in CSV, not a terminal.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain(text: str | None) -> str | None:
    """`text` without terminal colour codes."""
    return _ANSI.sub("", text) if text else text
