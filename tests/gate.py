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
