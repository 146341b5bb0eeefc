"""What the collector needs to measure Cortex's AxonLayer: providers, the float64 reference, inputs,
grids, the cost model and the tolerance. The `linear` provider is nn.Linear(H, H) on the same x with
the layer's own linear branch: Cortex's linear_vs_axon comparison (time per call, and from the rows
tokens/s = B*T / time and peak memory), gated on its own float64 reference.

Dims: B (batch rows), T (timesteps), H (features in and out, a power of two), resets (the probability
that a row's state is zeroed before a step)."""
from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.nn.functional as F

from kcollect.spec import MODES, KernelSpec, Provider, peer_available

from .._host.config import config_record
from .._spec.cells import dims_check, resets_or_none, step_loop_limit
from .._spec.kit import by_mode, grids_of, sequence_tokens
from . import axon, pick
from .naive import reference, step_loop

DIMS = ("B", "T", "H", "resets")
STATE = ("hc1", "hc2", "E_nu_c1", "E_nu_c2", "E_th_c1", "E_th_c2", "E_w1_c1", "E_w1_c2", "E_w2_c1", "E_w2_c2")


def eager(**inputs):
    step_loop_limit("the PyTorch step loop", inputs["x"].shape[1])
    return step_loop(**inputs)


def triton_axon(**inputs):
    return axon(**inputs)


def linear(x, w_lin, b_lin, **_):
    """nn.Linear(H, H): what the layer replaces, on the same x with the layer's linear branch."""
    return F.linear(x, w_lin, b_lin)


def linear_reference(x, w_lin, b_lin, **_):
    return F.linear(x, w_lin, b_lin)


@functools.lru_cache(maxsize=None)
def _cortex_layer(H: int, O: int):
    """An AxonLayer(H, O) with Cortex's defaults, on the CPU: its parameters and buffers are replaced
    by ours at every call (torch.func.functional_call), so that gradients reach our tensors."""
    from cortex.cells.core import AxonLayer

    return AxonLayer(H, O)


@contextlib.contextmanager
def _cortex_triton():
    """Cortex's Triton RTU and PyTorch SRHT, as its benchmark forces backends: its CUDA extensions
    (the RTU for T <= 1000, the SRHT always) compile with nvcc at first use, minutes, more than a
    collection waits."""
    import cortex.cells.core.axon_cell as cell
    from cortex.kernels.pytorch.srht import srht_pytorch
    from cortex.utils import _lazy_import

    saved = cell.select_backend, cell.srht_cuda
    cell.select_backend = lambda *, triton_fn=None, **_: _lazy_import(triton_fn)
    cell.srht_cuda = lambda x, signs, perm, normalize=True: srht_pytorch(x, signs, perm, normalize=normalize)
    try:
        yield
    finally:
        cell.select_backend, cell.srht_cuda = saved


def cortex(x, w_lin, b_lin, w_out, b_out, nu_log, theta_log, w1, w2, signs, perm, resets=None):
    from tensordict import TensorDict
    from torch.func import functional_call

    B, T, H = x.shape
    layer = _cortex_layer(H, w_lin.shape[0])
    params = {"linear.weight": w_lin, "linear.bias": b_lin, "cell.out_proj.weight": w_out, "cell.out_proj.bias": b_out,
              "cell.nu_log": nu_log, "cell.theta_log": theta_log, "cell.w1": w1, "cell.w2": w2,
              "cell.srht_signs": signs, "cell.srht_perm": perm}
    state = TensorDict({}, batch_size=[B])
    with _cortex_triton():
        y = functional_call(layer, params, (x,), {"state": state, "resets": resets})
    group, key = layer.state_path()
    sub = state[group][key]
    return y, torch.stack([sub[k] for k in STATE]).detach()


def config_of(inputs) -> dict:
    x = inputs["x"]
    return config_record(axon=pick(x.shape[0], x.shape[2], x.device))


def make_inputs(dims, dtype, device, seed):
    """Cortex's initialisation: nn.Linear's uniform weights, the RTU's radius in (0, 1) and phase in
    (0, 6.28), input weights within 1/sqrt(H); random signs and permutation for the SRHT."""
    B, T, H = dims["B"], dims["T"], dims["H"]
    g = torch.Generator().manual_seed(seed)

    def uniform(*shape, bound):
        return ((torch.rand(shape, generator=g) * 2 - 1) * bound).to(device=device, dtype=dtype)

    u1, u2 = torch.rand(H, generator=g).clamp(1e-3, 1 - 1e-3), torch.rand(H, generator=g).clamp(min=1e-3)
    return {"x": torch.randn(B, T, H, generator=g).to(device=device, dtype=dtype),
            "w_lin": uniform(H, H, bound=1 / math.sqrt(H)), "b_lin": uniform(H, bound=1 / math.sqrt(H)),
            "w_out": uniform(H, 2 * H, bound=1 / math.sqrt(2 * H)), "b_out": uniform(H, bound=1 / math.sqrt(2 * H)),
            "nu_log": torch.log(-0.5 * torch.log(u1)).to(device=device, dtype=dtype),
            "theta_log": torch.log(6.28 * u2).to(device=device, dtype=dtype),
            "w1": uniform(H, bound=1 / math.sqrt(H)), "w2": uniform(H, bound=1 / math.sqrt(H)),
            "signs": (torch.randint(0, 2, (H,), generator=g) * 2 - 1).to(device=device, dtype=dtype),
            "perm": torch.randperm(H, generator=g).to(device),
            "resets": resets_or_none(B, T, float(dims["resets"]), g, device)}


_needs_dims = dims_check("axon", DIMS)


def check_shape(dims) -> str | None:
    missing = _needs_dims(dims)
    if missing:
        return missing
    if dims["H"] & (dims["H"] - 1):
        return f"axon's SRHT needs H a power of two, got {dims['H']}"
    return None


GRIDS = grids_of(__file__)  # grids.toml beside this file


# Cost model (O = H outputs). GEMMs: the SRHT 2*B*T*H^2, the linear branch 2*B*T*H*O and the output
# map 2*B*T*2H*O forward, twice each backward; the scan about 60 FLOPs a channel and step forward
# (the state and the eight traces), 25 backward. Bytes: x and the weights read once, y and the
# carried state written once; backward reads dy, x and the weights and writes dx and the gradients.
def flops(dims, mode) -> float:
    B, T, H = dims["B"], dims["T"], dims["H"]
    gemm = 2 * B * T * H * H * 4
    fwd, bwd = gemm + 60 * B * T * H, 2 * gemm + 25 * B * T * H
    return float(by_mode(mode, fwd, bwd))


def bytes_moved(dims, dtype, mode) -> int:
    B, T, H = dims["B"], dims["T"], dims["H"]
    weights = 3 * H * H + 6 * H
    fwd = B * T * H + weights + B * T * H + 10 * B * H
    bwd = 2 * B * T * H + weights + B * T * H + weights
    return dtype.itemsize * by_mode(mode, fwd, bwd)


SPEC = KernelSpec(
    name="axon", modes=MODES, baseline="cortex", bound="compute",
    description="Cortex's AxonLayer (nn.Linear plus a streaming RTU over an SRHT of the input, with its "
    "eligibility traces) on a fresh state, with resets; beside nn.Linear(H, H), forward and backward",
    reference=reference, make_inputs=make_inputs,
    grad_inputs=("x", "w_lin", "b_lin", "w_out", "b_out", "nu_log", "theta_log", "w1", "w2"), grids=GRIDS,
    check_shape=check_shape, tokens=sequence_tokens, bytes_moved=bytes_moved, flops=flops,
    dtypes=(torch.bfloat16, torch.float32),
    providers=(
        Provider("triton", triton_axon, config=config_of, ours=True),
        Provider("cortex", cortex, peer_available("cortex"),
                 note="Cortex's AxonLayer on its Triton RTU and PyTorch SRHT (its CUDA extensions build for minutes). "
                      "That SRHT's butterfly (_fwht_) overwrites a with a + b before it computes a - b, so it "
                      "returns [a + b, a], not the Hadamard transform: every row fails the gate (its output 3.5% "
                      "off in fp32 at B8 T256 H256 on the H200); in bf16 its nu traces also overflow"),
        Provider("linear", linear, reference=linear_reference, grad_inputs=("x", "w_lin", "b_lin"),
                 note="nn.Linear(H, H), the layer AxonLayer replaces: H^2 + H parameters against 3H^2 + 6H",
                 builds=False),
        Provider("eager", eager, note="the PyTorch step loop", builds=False),
    ),
    # About 2.5 times the PyTorch step loop's own error against float64 at B=4, T=48, H=64 on the CPU
    # (bf16: 1.1e-2 forward, 1.9e-2 backward, every step rounded to bf16; ours 2.4e-3 and 5.7e-3), and
    # 30 times in fp32 (7.6e-7 and 1.5e-6: radii within 1e-3 of 1 amplify the traces' rounding).
    tolerance={torch.bfloat16: 5e-2, torch.float32: 5e-5},
    notes="linear is nn.Linear(H, H) on the same input (Cortex's linear_vs_axon): H^2 + H parameters against "
          "AxonLayer's 3H^2 + 6H; tokens/s = B*T / time. The eligibility traces after a reset count from the "
          "reset (they are the derivatives of the state since then). eager is timed up to T=256.")
