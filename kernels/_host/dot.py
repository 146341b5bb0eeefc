"""tl.dot's operands: what the kernels multiply in fp32 (DOT_F32 of kernels/_jit/recurrent.py: dot),
and what the CPU interpreter, whose tl.dot multiplies bf16 operands as their uint16 bit patterns,
is handed instead of bf16 tensors."""
from __future__ import annotations

import torch


def dot_f32(dtype: torch.dtype, device) -> bool:
    """Whether the kernels' tl.dot takes fp32 operands (as TF32x3, about fp32's accuracy: see dot):
    for fp32 inputs, whose recurrences would lose 13 mantissa bits a step to TF32, and on the CPU
    interpreter, whose tl.dot multiplies bf16 operands as their uint16 bit patterns (Triton 3.6)."""
    return dtype == torch.float32 or torch.device(device).type != "cuda"


def interpreter_operands(*xs):
    """The tensors the kernels read: as given on the GPU; on the CPU interpreter bf16 ones as fp32,
    since Triton 3.6's interpreter keeps bf16 as uint16 and its tl.dot multiplies those integers.
    fp32 holds every bf16 value exactly; what changes there is only that P and dS are not rounded
    to bf16 before their products (outputs are still stored in the inputs' dtype)."""
    if xs[0].is_cuda or xs[0].dtype != torch.bfloat16:
        return xs
    return tuple(x.float() for x in xs)
