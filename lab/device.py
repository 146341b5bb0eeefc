"""What the GPU tuning scripts share: opening the device they time on, saying what it is, and the
names they are asked to tune."""
from __future__ import annotations

import os
import sys


def open_device(device: str, prog: str):
    """torch, ready for `device` ('cuda', or 'cpu': a dry run on Triton's interpreter, which must be
    switched on before any kernel is imported); None, after a one-line message, without a GPU."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from kcollect.common import pin_ptxas

    if device == "cuda" and not torch.cuda.is_available():
        print(f"{prog}: no CUDA GPU here (--device cpu runs a dry run on the interpreter)", file=sys.stderr)
        return None
    pin_ptxas()
    return torch


def device_line(torch, device: str) -> str:
    """What the timings ran on: the GPU's name (or the CPU's interpreter) and torch's version."""
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreter)"
    return f"{gpu}  torch {torch.__version__}"


def names_in(parser, given: str, known, what: str) -> list[str]:
    """The comma-separated names of `given`, each one of `known` (a usage error naming the known
    ones otherwise): the scripts' shape and op selections."""
    names = [s.strip() for s in given.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")
    return names
