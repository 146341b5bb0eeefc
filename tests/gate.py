"""Shared rules of the kernel tests' correctness checks."""
import math

import torch

# Below this many elements a bf16 result's relative error is too noisy to gate on: bf16 keeps 8
# mantissa bits and the interpreter truncates, so over 35 elements (and a 7-element dw) 1 draw in
# about 300 passes the tolerance for PyTorch's kernels as for ours (measured on 5x7: tails of
# 1.0e-2 to 2.1e-2 against medians of 3e-3 to 7e-3). Tiny shapes are there for masking, which does
# not depend on the dtype: they are checked in fp16 and fp32, whose tolerances are tight.
MIN_BF16_ELEMENTS = 256


def too_few_for_bf16(dims, dtype) -> bool:
    size = math.prod(v for v in dims.values() if isinstance(v, int))
    return dtype == torch.bfloat16 and size < MIN_BF16_ELEMENTS


def run_offline_compile(script: str) -> str:
    """Run `script` (Python that compiles kernels with benchmarks/compile_report.py and prints what
    it found) in its own process without TRITON_INTERPRET, so that Triton compiles for sm_90
    instead of interpreting: the way to check PTX that the CPU interpreter cannot run. Its stdout;
    a failed compile fails the test with the script's error."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parent.parent, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
