"""The Axon layer's recurrence (a streaming RTU with diagonal input weights) as Triton scans.

Per channel h the state is a complex number c = (c1, c2) turned by lambda = r e^{i theta} each step:

    c1' = g c1 - phi c2 + gamma w1 xhat,   c2' = g c2 + phi c1 + gamma w2 xhat
    (g, phi) = r (cos theta, sin theta), r = exp(-exp(nu_log)), theta = exp(theta_log), gamma = sqrt(1 - r^2)

with (c1, c2) zeroed before the steps where a row resets. The forward also carries the eight
eligibility traces Cortex's AxonCell hands to the next chunk (forward-mode derivatives of c with
respect to nu_log, theta_log, w1 and w2 since the row's last reset), and returns them with the final
state. Layouts: xh [B, T, H] the SRHT-mixed input before its 1/sqrt(H) scale; par [10, H] the
per-channel constants (_PAR below; float64 for fp32 inputs, whose state and adjoint the scans
then carry in float64); y2h [B, T, 2H] (c1 | c2); state [10, B, H] (c1, c2, then the
traces E_nu_c1, E_nu_c2, E_th_c1, E_th_c2, E_w1_c1, E_w1_c2, E_w2_c1, E_w2_c2, Cortex's order)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import AxonConfig

_PAR = ("g", "phi", "gamma", "w1", "w2", "dg_nu", "dphi_nu", "dgamma_nu", "dg_th", "dphi_th")


def channel_constants(nu_log, theta_log, w1, w2, dtype=torch.float64) -> torch.Tensor:
    """[10, H] in `dtype` (float64 for the fp32 backward's last products, else fp32, which the
    kernels take): the dynamics, the input weights and the derivatives of (g, phi, gamma) with
    respect to nu_log and theta_log that the traces need. Computed in float64 (H numbers): in fp32,
    gamma = sqrt(1 - r^2) loses 3e-5 of itself at r = 1 - 1e-6 (a memory of a million steps) and is 0
    within 6e-8 of 1, where the input would be dropped. One launch: as a dozen element-wise PyTorch
    ops they were a tenth of the forward at the real-time shapes."""
    H = nu_log.shape[0]
    nu_log, theta_log, w1, w2 = (t.contiguous() for t in (nu_log, theta_log, w1, w2))  # read as [H]
    out = torch.empty(10, H, device=nu_log.device, dtype=dtype)
    block = min(256, triton.next_power_of_2(max(H, 1)))  # (1024 in float64 broke Triton 3.6's layout pass)
    _constants[(triton.cdiv(H, block),)](nu_log, theta_log, w1, w2, out, H, BH=block)
    return out


@triton.jit
def _constants(nu_ptr, th_ptr, w1_ptr, w2_ptr, out_ptr, H, BH: tl.constexpr):
    h = tl.program_id(0) * BH + tl.arange(0, BH)
    m = h < H
    e_nu = tl.exp(tl.load(nu_ptr + h, mask=m, other=0.0).to(tl.float64))
    theta = tl.exp(tl.load(th_ptr + h, mask=m, other=0.0).to(tl.float64))
    r = tl.exp(-e_nu)
    g, phi = r * tl.cos(theta), r * tl.sin(theta)
    # 1 - r^2 = -expm1(-2 e_nu) without the cancellation: its series where exp(x) - 1 would cancel
    x = -2.0 * e_nu
    gamma = tl.sqrt(-tl.where(x > -1e-5, x * (1.0 + x * (0.5 + x / 6.0)), tl.exp(x) - 1.0))
    ty = out_ptr.dtype.element_ty
    values = (g, phi, gamma, tl.load(w1_ptr + h, mask=m, other=0.0).to(tl.float64),
              tl.load(w2_ptr + h, mask=m, other=0.0).to(tl.float64), -e_nu * g, -e_nu * phi,
              e_nu * r * r / gamma, -phi * theta, g * theta)
    for i in tl.static_range(10):
        tl.store(out_ptr + i * H + h, values[i].to(ty), mask=m)


@triton.jit
def _keep(rs_ptr, b, t, T, has_resets):
    return 1.0 - tl.load(rs_ptr + b.to(tl.int64) * T + t, mask=has_resets != 0, other=0).to(tl.float32)


@triton.jit
def _fwd_step(t, b, h, hm, xh_ptr, y2h_ptr, rs_ptr, T, H, scale, p, c1, c2, e, has_resets):
    """One step: the state (c1, c2) in p's dtype (float64 for fp32 inputs: see _axon_fwd), the traces
    in fp32 (from the state rounded to fp32)."""
    g, phi, gamma, w1, w2, dg_nu, dphi_nu, dgamma_nu, dg_th, dphi_th = p
    enu1, enu2, eth1, eth2, ew11, ew12, ew21, ew22 = e
    keep = _keep(rs_ptr, b, t, T, has_resets)
    c1, c2 = c1 * keep, c2 * keep
    row = (b.to(tl.int64) * T + t)
    xhat = tl.load(xh_ptr + row * H + h, mask=hm, other=0.0).to(tl.float32) * scale
    u1, u2 = w1 * xhat, w2 * xhat
    n1 = g * c1 - phi * c2 + gamma * u1
    n2 = g * c2 + phi * c1 + gamma * u2
    f32 = tl.float32  # (casts of fp32 values are none)
    g, phi, gamma, dg_nu, dphi_nu = g.to(f32), phi.to(f32), gamma.to(f32), dg_nu.to(f32), dphi_nu.to(f32)
    dgamma_nu, dg_th, dphi_th = dgamma_nu.to(f32), dg_th.to(f32), dphi_th.to(f32)
    c1, c2, u1, u2 = c1.to(f32), c2.to(f32), u1.to(f32), u2.to(f32)
    tl.store(y2h_ptr + row * 2 * H + h, n1.to(y2h_ptr.dtype.element_ty), mask=hm)
    tl.store(y2h_ptr + row * 2 * H + H + h, n2.to(y2h_ptr.dtype.element_ty), mask=hm)
    enu1, enu2 = enu1 * keep, enu2 * keep
    eth1, eth2 = eth1 * keep, eth2 * keep
    ew11, ew12, ew21, ew22 = ew11 * keep, ew12 * keep, ew21 * keep, ew22 * keep
    e = (dg_nu * c1 + g * enu1 - dphi_nu * c2 - phi * enu2 + dgamma_nu * u1,
         dg_nu * c2 + g * enu2 + dphi_nu * c1 + phi * enu1 + dgamma_nu * u2,
         dg_th * c1 + g * eth1 - dphi_th * c2 - phi * eth2,
         dg_th * c2 + g * eth2 + dphi_th * c1 + phi * eth1,
         g * ew11 - phi * ew12 + gamma * xhat, g * ew12 + phi * ew11,
         g * ew21 - phi * ew22, g * ew22 + phi * ew21 + gamma * xhat)
    return n1, n2, e


@triton.jit(do_not_specialize=["B", "T", "has_resets"])
def _axon_fwd(xh_ptr, par_ptr, rs_ptr, y2h_ptr, st_ptr, B, T, H, scale, has_resets, BH: tl.constexpr,
              PIPE: tl.constexpr, STAGES: tl.constexpr):
    """The state in par's dtype: float64 for fp32 inputs (rounded once to fp32 where stored). The
    parameter gradients are sums over T x B of the adjoint times the stored state, which cancel
    (the issue 40 H200 sweep: B3 H4 T257, dnu_log 2.95e-6 where eager's was 6.2e-7), and an fp32
    recurrence run with g and phi rounded to fp32 drifts from float64's by 16 of the state's
    roundings (radius 0.97 there): on the interpreter most of those gradients' error, 1e-7 to 2e-6
    over upstream draws, where the float64 recurrence rounded once gave 1e-8 to 3e-7."""
    b = tl.program_id(1)
    h = tl.program_id(0) * BH + tl.arange(0, BH)
    hm = h < H
    p = (tl.load(par_ptr + h, mask=hm, other=0.0), tl.load(par_ptr + H + h, mask=hm, other=0.0),
         tl.load(par_ptr + 2 * H + h, mask=hm, other=0.0), tl.load(par_ptr + 3 * H + h, mask=hm, other=0.0),
         tl.load(par_ptr + 4 * H + h, mask=hm, other=0.0), tl.load(par_ptr + 5 * H + h, mask=hm, other=0.0),
         tl.load(par_ptr + 6 * H + h, mask=hm, other=0.0), tl.load(par_ptr + 7 * H + h, mask=hm, other=0.0),
         tl.load(par_ptr + 8 * H + h, mask=hm, other=0.0), tl.load(par_ptr + 9 * H + h, mask=hm, other=0.0))
    z = tl.zeros((BH,), tl.float32)
    zc = tl.zeros((BH,), par_ptr.dtype.element_ty)
    c1, c2, e = zc, zc, (z, z, z, z, z, z, z, z)
    if PIPE:
        for t in tl.range(0, T, num_stages=STAGES):
            c1, c2, e = _fwd_step(t, b, h, hm, xh_ptr, y2h_ptr, rs_ptr, T, H, scale, p, c1, c2, e, has_resets)
    else:
        t = 0
        while t < T:
            c1, c2, e = _fwd_step(t, b, h, hm, xh_ptr, y2h_ptr, rs_ptr, T, H, scale, p, c1, c2, e, has_resets)
            t += 1
    plane = B * H
    out = st_ptr + b.to(tl.int64) * H + h
    tl.store(out, c1.to(tl.float32), mask=hm)
    tl.store(out + plane, c2.to(tl.float32), mask=hm)
    for i in tl.static_range(8):
        tl.store(out + (2 + i) * plane, e[i], mask=hm)


@triton.jit
def _bwd_step(t, b, h, hm, dy2h_ptr, xh_ptr, y2h_ptr, rs_ptr, dxh_ptr, T, H, scale, p, l1, l2, acc, has_resets):
    """One step of the reverse scan: the adjoint (l1, l2) of c_t from c_{t+1}'s, the input gradient,
    and the step's terms of the per-channel parameter gradients."""
    g, phi, gamma, w1, w2 = p
    dg, dphi, dgamma, dw1, dw2 = acc
    row = b.to(tl.int64) * T + t
    keep_next = _keep(rs_ptr, b, tl.minimum(t + 1, T - 1), T, has_resets)  # t = T-1: l is zero anyway
    l1, l2 = (tl.load(dy2h_ptr + row * 2 * H + h, mask=hm, other=0.0).to(tl.float32) + keep_next * (g * l1 + phi * l2),
              tl.load(dy2h_ptr + row * 2 * H + H + h, mask=hm, other=0.0).to(tl.float32)
              + keep_next * (g * l2 - phi * l1))
    keep = _keep(rs_ptr, b, t, T, has_resets)
    before = hm & (t > 0)
    c1 = tl.load(y2h_ptr + (row - 1) * 2 * H + h, mask=before, other=0.0).to(tl.float32) * keep
    c2 = tl.load(y2h_ptr + (row - 1) * 2 * H + H + h, mask=before, other=0.0).to(tl.float32) * keep
    xhat = tl.load(xh_ptr + row * H + h, mask=hm, other=0.0).to(tl.float32) * scale
    tl.store(dxh_ptr + row * H + h, (gamma * (l1 * w1 + l2 * w2) * scale).to(dxh_ptr.dtype.element_ty), mask=hm)
    acc = (dg + l1 * c1 + l2 * c2, dphi - l1 * c2 + l2 * c1, dgamma + (l1 * w1 + l2 * w2) * xhat,
           dw1 + gamma * l1 * xhat, dw2 + gamma * l2 * xhat)
    return l1, l2, acc


@triton.jit(do_not_specialize=["B", "T", "has_resets"])
def _axon_bwd(dy2h_ptr, xh_ptr, y2h_ptr, par_ptr, rs_ptr, dxh_ptr, acc_ptr, B, T, H, scale, has_resets,
              BH: tl.constexpr, PIPE: tl.constexpr, STAGES: tl.constexpr, ACC64: tl.constexpr):
    """ACC64 (fp32 inputs): the parameter gradients, sums of T terms, accumulated in float64: an fp32
    running sum rounds T times, 5x eager's error at T = 257. The adjoint in par's dtype (float64 for
    fp32 inputs, as the forward's state): in fp32 with g and phi rounded to fp32 it drifted as the
    forward's did, and the gradient of theta_log kept 1e-6 of that."""
    b = tl.program_id(1)
    h = tl.program_id(0) * BH + tl.arange(0, BH)
    hm = h < H
    p = (tl.load(par_ptr + h, mask=hm, other=0.0), tl.load(par_ptr + H + h, mask=hm, other=0.0),
         tl.load(par_ptr + 2 * H + h, mask=hm, other=0.0), tl.load(par_ptr + 3 * H + h, mask=hm, other=0.0),
         tl.load(par_ptr + 4 * H + h, mask=hm, other=0.0))
    z = tl.zeros((BH,), par_ptr.dtype.element_ty)
    if ACC64:
        a = tl.zeros((BH,), tl.float64)
    else:
        a = z
    l1, l2, acc = z, z, (a, a, a, a, a)
    if PIPE:
        for s in tl.range(0, T, num_stages=STAGES):
            l1, l2, acc = _bwd_step(T - 1 - s, b, h, hm, dy2h_ptr, xh_ptr, y2h_ptr, rs_ptr, dxh_ptr, T, H, scale, p,
                                    l1, l2, acc, has_resets)
    else:
        t = T - 1
        while t >= 0:
            l1, l2, acc = _bwd_step(t, b, h, hm, dy2h_ptr, xh_ptr, y2h_ptr, rs_ptr, dxh_ptr, T, H, scale, p, l1, l2,
                                    acc, has_resets)
            t -= 1
    out = acc_ptr + b.to(tl.int64) * H + h
    for i in tl.static_range(5):
        tl.store(out + i * B * H, acc[i], mask=hm)


def _launch(B, H, device, config: AxonConfig) -> tuple[tuple, dict]:
    on_gpu = torch.device(device).type == "cuda"
    return (triton.cdiv(H, config.bh), B), dict(BH=config.bh, PIPE=on_gpu, STAGES=config.stages, num_warps=config.warps)


def axon_scan_fwd(xh, par, resets, scale: float, config: AxonConfig):
    """(y2h [B, T, 2H] in xh's dtype, state [10, B, H] fp32); par [10, H] fp32, or float64 (fp32 xh)."""
    B, T, H = xh.shape
    y2h = torch.empty(B, T, 2 * H, device=xh.device, dtype=xh.dtype)
    state = torch.empty(10, B, H, device=xh.device, dtype=torch.float32)
    rs = resets.view(torch.uint8) if resets is not None else xh
    grid, meta = _launch(B, H, xh.device, config)
    _axon_fwd[grid](xh, par, rs, y2h, state, B, T, H, scale, int(resets is not None), **meta)
    return y2h, state


def axon_scan_bwd(dy2h, xh, y2h, par, resets, scale: float, config: AxonConfig):
    """(d xh [B, T, H], [5, H]: the gradients of g, phi, gamma, w1, w2 summed over rows and steps, in
    float64 for fp32 inputs, else fp32); par [10, H] as axon_scan_fwd's."""
    B, T, H = xh.shape
    dxh = torch.empty_like(xh)
    acc64 = xh.dtype == torch.float32
    acc = torch.empty(5, B, H, device=xh.device, dtype=torch.float64 if acc64 else torch.float32)
    rs = resets.view(torch.uint8) if resets is not None else xh
    grid, meta = _launch(B, H, xh.device, config)
    _axon_bwd[grid](dy2h.contiguous(), xh, y2h, par, rs, dxh, acc, B, T, H, scale, int(resets is not None),
                    ACC64=acc64, **meta)
    return dxh, acc.sum(1)
