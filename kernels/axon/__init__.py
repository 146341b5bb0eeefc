"""Cortex's AxonLayer: a stateful linear operator that can replace nn.Linear, on a fresh state.

    y, state = axon(x, w_lin, b_lin, w_out, b_out, nu_log, theta_log, w1, w2, signs, perm, resets=None)

    y = x @ w_lin.T + b_lin + [c1 | c2] @ w_out.T + b_out

x [B, T, H] (H a power of two), w_lin [O, H], w_out [O, 2H], b_lin and b_out [O]; (c1, c2) [B, T, H]
the streaming RTU of scan.py over xhat = SRHT(x) = H_d (signs * x[..., perm]) / sqrt(H) (H_d the
Sylvester-Hadamard matrix, signs [H] of +-1 and perm [H] fixed buffers), with nu_log, theta_log, w1,
w2 [H] its per-channel parameters; resets [B, T] bool. state [10, B, H] is what the layer carries to
the next chunk, without gradient: c1 and c2 after the last step and the eight eligibility traces.

Forward: the SRHT as one GEMM with the signed, permuted +-1 Hadamard matrix, the recurrence as a Triton
scan (with the traces), the two output GEMMs. Backward: the output GEMMs' gradients, a reverse Triton
scan for the recurrence's input and parameter gradients, the SRHT's transpose GEMM."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._host.cells import bias_grad, check_dtypes, fp32_product, weight_grads
from .config import AxonConfig, pick
from .scan import axon_scan_bwd, axon_scan_fwd, channel_constants

__all__ = ["AxonConfig", "AxonFunction", "axon", "pick", "srht_matrix"]


def srht_matrix(signs: torch.Tensor, perm: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """M [H, H] of +-1 with x @ M / sqrt(H) = SRHT(x): row perm[k] of M is signs[k] times row k of the
    Hadamard matrix, whose entry (k, j) is (-1)^popcount(k & j). One launch (as PyTorch ops, a dozen
    over the H x H entries)."""
    H = signs.shape[0]
    signs, perm = signs.contiguous(), perm.contiguous()  # read as [H]
    m = torch.empty(H, H, device=signs.device, dtype=dtype)
    rows, cols = min(32, triton.next_power_of_2(max(H, 1))), min(256, triton.next_power_of_2(max(H, 1)))
    _srht[(triton.cdiv(H, rows), triton.cdiv(H, cols))](signs, perm, m, H, BK=rows, BJ=cols)
    return m


@triton.jit
def _srht(signs_ptr, perm_ptr, m_ptr, H, BK: tl.constexpr, BJ: tl.constexpr):
    k = tl.program_id(0) * BK + tl.arange(0, BK)
    j = tl.program_id(1) * BJ + tl.arange(0, BJ)
    km, jm = k < H, j < H
    v = k[:, None] & j[None, :]
    for shift in tl.static_range(5):  # the parity of v's bits: fold 16, 8, 4, 2 and 1 bits onto bit 0
        v = v ^ (v >> (16 >> shift))
    sign = tl.load(signs_ptr + k, mask=km, other=0).to(tl.float32)
    value = sign[:, None] * (1 - 2 * (v & 1)).to(tl.float32)
    row = tl.load(perm_ptr + k, mask=km, other=0).to(tl.int64)
    tl.store(m_ptr + row[:, None] * H + j[None, :], value.to(m_ptr.dtype.element_ty), mask=km[:, None] & jm[None, :])


class AxonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_lin, b_lin, w_out, b_out, nu_log, theta_log, w1, w2, signs, perm, resets, config):
        B, T, H = x.shape
        config = config or pick(B, H, x.device)
        scale = 1.0 / math.sqrt(H)
        # fp32: the SRHT's sums of H signed inputs in float64, rounded once (in fp32, H roundings each,
        # 9 units of the last place at H = 1024 where eager's butterfly rounds log2(H) times)
        m = srht_matrix(signs, perm, torch.float64 if x.dtype == torch.float32 else x.dtype)
        x2 = x.reshape(B * T, H)
        xh = (x2.to(m.dtype) @ m).to(x.dtype).view(B, T, H)
        # float64's last products only where fp32 users expect eager's error
        wide = torch.float64 if x.dtype == torch.float32 else torch.float32
        par = channel_constants(nu_log, theta_log, w1, w2, wide)
        y2h, state = axon_scan_fwd(xh, par, resets, scale, config)  # float64 par: a float64 state (fp32)
        w_lin, w_out = w_lin.contiguous(), w_out.contiguous()  # (the CPU's addmm of a strided one rounds worse)
        y = torch.addmm(torch.addmm(b_lin + b_out, x2, w_lin.t()), y2h.view(B * T, 2 * H), w_out.t())
        ctx.save_for_backward(x, xh, y2h, par, m, w_lin, w_out, resets)
        ctx.config, ctx.scale = config, scale
        state = state.to(x.dtype)
        ctx.mark_non_differentiable(state)
        return y.view(B, T, -1), state

    @staticmethod
    def backward(ctx, dy, _dstate):
        x, xh, y2h, par, m, w_lin, w_out, resets = ctx.saved_tensors
        B, T, H = x.shape
        dy2 = dy.reshape(B * T, -1)
        db = bias_grad(dy2, 0)
        # in fp32: rounded to bf16, the adjoint's input lost 12% of nu_log's gradient at B1 H1 T63
        # (resets every step), whose terms cancel 70-fold over time (issue 40, an H200 sweep)
        dy2h = fp32_product(dy2, w_out).view(B, T, 2 * H)
        dxh, acc = axon_scan_bwd(dy2h, xh, y2h, par, resets, ctx.scale, ctx.config)
        if m.dtype == dy.dtype:
            dx = torch.addmm(dy2 @ w_lin, dxh.view(B * T, H), m.t()).view(B, T, H)
        else:
            dx = (dy2 @ w_lin + (dxh.view(B * T, H).to(m.dtype) @ m.t()).to(dy.dtype)).view(B, T, H)
        dnu = (acc[0] * par[5] + acc[1] * par[6] + acc[2] * par[7]).to(dy.dtype)
        dth = (acc[0] * par[8] + acc[1] * par[9]).to(dy.dtype)
        dw_lin, dw_out = weight_grads(dy2.t(), x.reshape(B * T, H), y2h.view(B * T, 2 * H))
        return (dx, dw_lin, db, dw_out, db.clone(), dnu, dth,
                acc[3].to(dy.dtype), acc[4].to(dy.dtype), None, None, None, None)


def axon(x, w_lin, b_lin, w_out, b_out, nu_log, theta_log, w1, w2, signs, perm, resets=None,
         config: AxonConfig | None = None):
    """(y, state); see the module docstring."""
    if x.dim() != 3:
        raise ValueError(f"axon: x must be [B, T, H], got {tuple(x.shape)}")
    B, T, H = x.shape
    if H & (H - 1):
        raise ValueError(f"axon: H must be a power of two (the SRHT's Hadamard transform), got {H}")
    O = w_lin.shape[0]
    expect = {"w_lin": (O, H), "b_lin": (O,), "w_out": (O, 2 * H), "b_out": (O,), "nu_log": (H,), "theta_log": (H,),
              "w1": (H,), "w2": (H,), "signs": (H,), "perm": (H,)}
    for name, t in zip(expect, (w_lin, b_lin, w_out, b_out, nu_log, theta_log, w1, w2, signs, perm)):
        if tuple(t.shape) != expect[name]:
            raise ValueError(f"axon: {name} must be {expect[name]} for x {tuple(x.shape)}, got {tuple(t.shape)}")
    check_dtypes("axon", x=x, w_lin=w_lin, b_lin=b_lin, w_out=w_out, b_out=b_out)
    if resets is not None and (tuple(resets.shape) != (B, T) or resets.dtype != torch.bool):
        raise ValueError(f"axon: resets must be a bool [B, T] = ({B}, {T}) mask, got {resets.dtype} "
                         f"{tuple(resets.shape)}")
    resets = resets.contiguous() if resets is not None else None  # the scans read it as [B, T]
    return AxonFunction.apply(x.contiguous(), w_lin, b_lin, w_out, b_out, nu_log, theta_log, w1, w2, signs, perm,
                              resets, config)
