"""Under Triton's interpreter, float32 -> bfloat16 casts round to nearest even, as the GPU's do
(kernels/_interpreter_patch.py): the interpreter's own cast truncates, which doubled every bf16
kernel's error on the CPU."""
import numpy as np
import torch
import triton
import triton.language as tl

import kcollect.kernels  # noqa: F401  (patches the interpreter, as any use of our kernels does)
from kcollect.kernels._interpreter_patch import bf16_bits


@triton.jit
def _cast_and_store(x_ptr, to_ptr, store_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(to_ptr + offs, x.to(tl.bfloat16), mask=offs < n)  # an explicit cast
    tl.store(store_ptr + offs, x * 1.0, mask=offs < n)  # fp32 stored into a bf16 tensor


def test_kernels_round_fp32_to_bf16_to_nearest_even_as_pytorch_does():
    g = torch.Generator().manual_seed(1)
    halfway = torch.tensor([1.00390625, 1.01171875, -1.00390625, 3.0e38, 1e-40], dtype=torch.float32)
    x = torch.cat([torch.randn(997, generator=g) * torch.exp(8 * torch.randn(997, generator=g)), halfway])
    cast, stored = torch.empty(x.numel(), dtype=torch.bfloat16), torch.empty(x.numel(), dtype=torch.bfloat16)
    _cast_and_store[(1,)](x, cast, stored, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    want = x.bfloat16()
    assert torch.equal(cast, want) and torch.equal(stored, want)


def test_bf16_bits_keeps_infinities_and_nan():
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], dtype=np.float32)
    got = torch.from_numpy(bf16_bits(x).view(np.int16)).view(torch.bfloat16).float()
    assert got[0] == float("inf") and got[1] == -float("inf") and torch.isnan(got[2])
    assert got[3] == 0 and got[4] == 0 and torch.signbit(got[4])
