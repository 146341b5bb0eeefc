"""tl.dot's operands: what the kernels multiply in fp32 (DOT_F32 of kernels/_jit/recurrent.py: dot),
and what the CPU interpreter, whose tl.dot multiplies bf16 operands as their uint16 bit patterns,
is handed instead of bf16 tensors."""
from __future__ import annotations

import torch


# DOT_F32 modes of kernels/_jit/recurrent.py: dot (0: the operands' own type)
IEEE = 1  # fp32 products on the CUDA cores
FP64 = 2  # the operands widened to float64, summed in float64 (sm_90's DMMA), rounded once by the kernel
TF32X3 = 3  # Triton's "tf32x3" (about 2^-21 a product)


def dot_f32(dtype: torch.dtype, device, fp32: int = IEEE) -> int:
    """How the kernels' tl.dot multiplies (0 or a mode above): the kernel's `fp32` mode for fp32
    inputs on a GPU, whose recurrences would lose 13 mantissa bits a step to TF32 (see dot for
    each kernel's choice); IEEE on the CPU interpreter, whose tl.dot multiplies bf16 operands as
    their uint16 bit patterns (Triton 3.6) and fp32 exactly whatever the mode, but FP64 there too
    for fp32 inputs of a kernel whose mode it is (the interpreter's float64 product is the GPU's
    up to the order of its sums, so the tests run the GPU's code); else 0."""
    if torch.device(device).type != "cuda":
        return FP64 if fp32 == FP64 and dtype == torch.float32 else IEEE
    return fp32 if dtype == torch.float32 else 0


def interpreter_operands(*xs):
    """The tensors the kernels read: as given on the GPU; on the CPU interpreter bf16 ones as fp32,
    since Triton 3.6's interpreter keeps bf16 as uint16 and its tl.dot multiplies those integers.
    fp32 holds every bf16 value exactly; what changes there is only that P and dS are not rounded
    to bf16 before their products (outputs are still stored in the inputs' dtype)."""
    if xs[0].is_cuda or xs[0].dtype != torch.bfloat16:
        return xs
    return tuple(x.float() for x in xs)
