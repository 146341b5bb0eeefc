"""What the GPU tuning scripts share: opening the device they time on."""
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
