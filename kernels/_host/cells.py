"""What the recurrent cells' launchers share (lstm, slstm, mlstm, axon): the check of their inputs'
dtypes, the unit-major gate order, the PRECISE flag of kernels/_jit/recurrent.py's fp32 maths, and
whether a config fits the device's shared memory."""
from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_dtypes(op: str, **tensors) -> torch.dtype:
    """The dtype `tensors` share (those an op's products read in one type; states and gates it
    converts may differ); ValueError unless they agree and it is one of DTYPES."""
    dtypes = {name: t.dtype for name, t in tensors.items()}
    first = next(iter(dtypes.values()))
    if first not in DTYPES or any(d != first for d in dtypes.values()):
        raise ValueError(f"{op}: the inputs must share one dtype of float32, bfloat16 or float16, got "
                         + ", ".join(f"{n} {str(d)[6:]}" for n, d in dtypes.items()))
    return first


def unit_major(n_units: int, n_gates: int, device) -> torch.Tensor:
    """Row order that puts the gates of one unit next to each other: [g*H + j] -> position
    j*n_gates + g, so that a program holding units [a, b) holds the contiguous gate rows
    [a*n_gates, b*n_gates) (PyTorch's LSTM layout stacks the gates: i of all units, then f ...)."""
    return (torch.arange(n_gates, device=device)[None, :] * n_units
            + torch.arange(n_units, device=device)[:, None]).reshape(-1)


def precise(dtype: torch.dtype) -> bool:
    """The kernels' PRECISE flag: fp32 tensors (see kernels/_jit/recurrent.py: exp_f32)."""
    return dtype == torch.float32


# The weights' and biases' gradients sum over B x T steps: for fp32 in float64, rounded once, since
# fp32 users expect eager's error and a long fp32 sum rounds at every step; bf16/fp16 in their own
# GEMMs (which accumulate in fp32) and fp32 sums.
def wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype the products of a weight's gradient are summed in."""
    return torch.float64 if dtype == torch.float32 else dtype


def fp32_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-byte inputs with its fp32 sums kept, not rounded to the inputs' dtype: a gradient
    that a scan then sums over time, whose terms may cancel far more than one rounding of bf16 can
    bear. cuBLAS's fp32 output of a bf16/fp16 GEMM on CUDA (mm's out_dtype; the same tensor-core
    work); elsewhere the inputs widened. fp32 inputs: a @ b."""
    if a.dtype == torch.float32:
        return a @ b
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def weight_grads(dg_t: torch.Tensor, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """dg_t @ x for each x (the sum over B x T rows), in `wide` and returned in dg_t's dtype."""
    w = wide(dg_t.dtype)
    d = dg_t.to(w)
    return tuple((d @ x.to(w)).to(dg_t.dtype) for x in xs)


def bias_grad(dg: torch.Tensor, dims) -> torch.Tensor:
    """dg summed over `dims`, in float64 for fp32 and fp32 otherwise, returned in dg's dtype."""
    return dg.sum(dims, dtype=torch.promote_types(wide(dg.dtype), torch.float32)).to(dg.dtype)


# ---------------------------------------------------------------------------------------------
# Whether a config fits the device's shared memory. What a compiled kernel needs (the dot operands'
# staging, layout conversions) is known exactly only once compiled, so the check compiles, with
# Kernel.warmup on the arguments' dtypes: the very variant the launch then takes from the JIT's
# cache. On the CPU interpreter nothing is checked (fit_limit is None there). Not the same as
# kernels/_host/device.py's shared_limit / shared_bytes, which take the launch's own arguments and
# answer for the CPU as a GPU would.

_SHARED: dict[tuple, int] = {}


def fit_limit(device) -> int | None:
    """Bytes of shared memory a program may use on a CUDA device (the opt-in limit a launch checks;
    227 KB on Hopper); None on the CPU interpreter, which has no limit."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", props.shared_memory_per_block)


def shared_bytes_for_types(kernel, args: tuple, meta: dict, device) -> int:
    """Shared memory of `kernel` compiled for `args` (tensors given as their dtypes, ints as the
    launch passes them: the JIT specialises on their divisibility by 16) and launch keywords `meta`."""
    key = (kernel.fn.__name__, id(kernel), args, tuple(sorted(meta.items())), torch.device(device).index)
    if key not in _SHARED:
        with torch.cuda.device(device):
            _SHARED[key] = kernel.warmup(*args, grid=(1,), **meta).metadata.shared
    return _SHARED[key]
