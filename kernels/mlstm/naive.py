"""The mLSTM in plain PyTorch: the recurrence one step at a time (the definition, Cortex's
mlstm_recurrent_step_stabilized_simple with resets), and the same maths chunkwise (the float64
reference the collector gates on, and the PyTorch baseline: the step form would keep a DH x DH state
per step for autograd, gigabytes at the training shapes). The tests check the one against the other.

Per step, with k' = k / sqrt(DH) and a = logsigmoid(f), a row that resets zeroes C, n and m first:

    m' = max(a + m, i),  C' = exp(a + m - m') C + exp(i - m') k' v^T,  n' = exp(a + m - m') n + exp(i - m') k'
    h = (q C') / (max(|q . n'|, exp(-m')) + 1e-6)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

EPS = 1e-6
NEG = -1e30  # the log-weight of what does not exist (a padded step, a pair across a reset)


def recurrent(q, k, v, i, f, resets=None):
    """(h, C_T, n_T, m_T), one step at a time; q, k, v [B, NH, T, DH], i, f [B, NH, T]."""
    B, NH, T, DH = q.shape
    C = q.new_zeros(B, NH, DH, DH)
    n, m = q.new_zeros(B, NH, DH), q.new_zeros(B, NH)
    ks = k / math.sqrt(DH)
    hs = []
    for t in range(T):
        if resets is not None:
            keep = (~resets[:, t]).to(q.dtype)[:, None]
            C, n, m = C * keep[..., None, None], n * keep[..., None], m * keep
        a = F.logsigmoid(f[:, :, t])
        m_new = torch.maximum(a + m, i[:, :, t])
        # exp(a + m - m_new) and exp(i - m_new), bit for bit, but the gate that set m_new gets 1
        # (no function of a, m or i), not exp(x - x): through that, autograd's gradient of a took
        # 1 - 1 and the other gate's share (1e-26 of it, issue 40's wild-gates fp32 case) rounded
        # away, in float64 as well (df 0 where a 70-digit finite difference gives 9.6e-27)
        d = a + m - i[:, :, t]
        fg, ig = torch.exp(d.clamp(max=0.0)), torch.exp((-d).clamp(max=0.0))
        C = fg[..., None, None] * C + ig[..., None, None] * ks[:, :, t, :, None] * v[:, :, t, None, :]
        n = fg[..., None] * n + ig[..., None] * ks[:, :, t]
        m = m_new
        qt = q[:, :, t]
        den = torch.maximum((qt * n).sum(-1).abs(), torch.exp(-m)) + EPS
        hs.append(torch.einsum("bhd,bhde->bhe", qt, C) / den[..., None])
    return torch.stack(hs, 2), C.detach(), n.detach(), m.detach()


def chunkwise(q, k, v, i, f, resets=None, chunk: int = 64):
    """The same (h, C_T, n_T, m_T) chunk by chunk: states at chunk starts by a loop over chunks,
    outputs of all chunks at once. Within a chunk, a pair (t, s) counts when no reset falls in
    (s, t]; the state at the chunk start counts for t when no reset falls in [start, t]. A reset
    at s also restarts the stabiliser from 0 (the zeroed m), which enters m as log-weight a_s + ..."""
    B, NH, T, DH = q.shape
    L = chunk
    NC = -(-T // L)
    pad = NC * L - T

    def chunks(x, value=0.0):
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad), value=value)
        return x.view(B, NH, NC, L, *x.shape[3:])

    qc, kc, vc = chunks(q), chunks(k / math.sqrt(DH)), chunks(v)
    ic, ac = chunks(i, NEG), chunks(F.logsigmoid(f))
    r = torch.zeros(B, T, dtype=torch.bool, device=q.device) if resets is None else resets
    rc = F.pad(r, (0, pad)).view(B, 1, NC, L).expand(B, NH, NC, L)
    A, seg = ac.cumsum(-1), rc.long().cumsum(-1)
    it = torch.where(rc, torch.maximum(ic, ac), ic)  # a reset's zeroed m competes in the max
    A_end, seg_end = A[..., -1:], seg[..., -1:]
    survive = seg == seg_end
    b = torch.where(survive, ic + A_end - A, NEG)
    bt = torch.where(survive, it + A_end - A, NEG)

    C = q.new_zeros(B, NH, DH, DH)
    n, m = q.new_zeros(B, NH, DH), q.new_zeros(B, NH)
    starts = []
    for c in range(NC):
        starts.append((C, n, m))
        clean = seg_end[:, :, c, 0] == 0
        carry = torch.where(clean, m + A_end[:, :, c, 0], NEG)
        m_next = torch.maximum(carry, bt[:, :, c].amax(-1))
        kappa = torch.where(clean, torch.exp(carry - m_next), 0.0)
        beta = torch.exp(b[:, :, c] - m_next[..., None])
        C = kappa[..., None, None] * C + torch.einsum("bhs,bhsd,bhse->bhde", beta, kc[:, :, c], vc[:, :, c])
        n = kappa[..., None] * n + torch.einsum("bhs,bhsd->bhd", beta, kc[:, :, c])
        m = m_next
    Cs, ns, ms = (torch.stack(x, 2) for x in zip(*starts))

    s_le_t = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    valid = s_le_t & (seg[..., :, None] == seg[..., None, :])
    logd = torch.where(valid, ic[..., None, :] + A[..., :, None] - A[..., None, :], NEG)
    logdt = torch.where(valid, it[..., None, :] + A[..., :, None] - A[..., None, :], NEG)
    base = torch.where(seg == 0, ms[..., None] + A, NEG)
    mj = torch.maximum(base, logdt.amax(-1))
    E = torch.exp(logd - mj[..., None]) * (qc @ kc.transpose(-1, -2))
    w = torch.exp(base - mj)
    num = E @ vc + w[..., None] * (qc @ Cs)
    den = E.sum(-1) + w * (qc * ns[..., None, :]).sum(-1)
    h = num / (torch.maximum(den.abs(), torch.exp(-mj)) + EPS)[..., None]
    return h.reshape(B, NH, NC * L, DH)[:, :, :T], C.detach(), n.detach(), m.detach()


def reference(q, k, v, i, f, resets=None):
    """Plain maths in float64, chunk by chunk (the tests check it against the step-by-step
    recurrence, which would keep a DH x DH state per step for autograd)."""
    return chunkwise(q, k, v, i, f, resets)
