"""The modes and dtypes by name, for the command line, and `plain` for the text of errors: without
torch, so that the commands that never measure (summary, export, import, compare, build-site,
--help) start without importing it."""
from __future__ import annotations

import re

MODES = ("fwd", "bwd", "fwd+bwd")
DTYPE_CHOICES = ("bfloat16", "float16", "float32")  # spec.DTYPES maps each to its torch dtype

# A row's rate, defined once for the summary (report.py) and the store's view (store.py): the cost
# model's bytes or flops over the median time, bytes / (ms * 1e6) = GB/s for memory-bound kernels,
# flops / (ms * 1e9) = TFLOP/s for compute-bound ones: {bound: (column, scale, unit)}.
RATES = {"memory": ("bytes", 1e6, "GB/s"), "compute": ("flops", 1e9, "TFLOP/s")}


def rate_sql(bound: str, row: str = "r") -> str:
    """RATES[bound] as SQL over the columns of table alias `row`."""
    column, scale, _ = RATES[bound]
    return f"{row}.{column} / ({row}.median_ms * {scale:.0f})"


# A terminal's colour codes, which some compilers put in their messages (the CuTe DSL's
# "\x1b[91merror[INTERNAL]:\x1b[0m ..."): a row's error is read on pages and in CSV, not a terminal.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain(text: str | None) -> str | None:
    """`text` without terminal colour codes."""
    return _ANSI.sub("", text) if text else text
