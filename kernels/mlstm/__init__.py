"""The mLSTM cell (matrix memory, exponential input gate) over a sequence with resets, chunkwise-
parallel over the sequence.

    h, C_T, n_T, m_T = mlstm(q, k, v, i, f, resets=None)

q, k, v [B, NH, T, DH], i and f [B, NH, T] the input and forget gate pre-activations, resets [B, T]
bool (a row's state zeroed before that step). The maths is naive.recurrent's (Cortex's step); the
state starts at zero. h [B, NH, T, DH]; C_T [B, NH, DH, DH], n_T [B, NH, DH], m_T [B, NH] the
stabilised final state, returned without gradient (the state a next segment starts from, detached).

Forward (fwd.py): a scan over chunks for the chunk-start states, then all chunks' outputs at once.
Backward (bwd.py): a reverse scan for the states' gradients, then all chunks' gradients at once,
then a reverse scan for the gradients of the chunks' whole decays."""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from .._host.cells import check_dtypes
from .._host.dot import IEEE, TF32X3, dot_f32
from .._host.cells import fit_limit
from .bwd import mlstm_bwd, shared_bwd
from .config import MLSTMConfig, pick
from .fwd import mlstm_fwd, shared_fwd
from .naive import EPS

__all__ = ["MLSTMConfig", "MLSTMFunction", "dot_mode", "fitted", "mlstm", "pick"]


def dot_mode(dtype, device, DH: int) -> int:
    """How the chunk kernels' tl.dot multiplies (kernels/_host/dot.py): fp32 heads padded to 32 or
    fewer columns take IEEE, wider ones TF32X3 (the stack IEEE costs them: _jit/recurrent.py's dot);
    but for S = q k^T, which fp32 sums in float64 whatever the width (chunk.scores64).
    Built by Triton 3.6 for sm_90 with TF32X3 at 16 columns, the backward's chunk kernel reads
    shared memory past its allocation (compute-sanitizer on an H200: DH 3 and 16, not 64, not with
    IEEE; lab/results/sanitize_mlstm_h200_b8e243f.txt), which gave wrong gradients where the stray
    values were large and broke the CUDA context once."""
    return dot_f32(dtype, device, IEEE if DH <= 32 else TF32X3)


@functools.lru_cache(maxsize=None)  # a launch's check is then one lookup
def fitted(config: MLSTMConfig, dtype, DH: int, device, picked: bool) -> MLSTMConfig:
    """The config to launch: `config` where the device's shared memory holds its kernels; a
    picked one that does not, with narrower value blocks, then shorter chunks; ValueError naming the
    limit where none fits (a forced config is not changed)."""
    limit = fit_limit(device)
    if limit is None:
        return config
    candidates, c = [config], config
    while picked and (c.bv > 16 or c.chunk > 16):
        c = replace(c, bv=c.bv // 2) if c.bv > 16 else replace(c, chunk=c.chunk // 2)
        candidates.append(c)
    fast = dot_mode(dtype, device, DH)
    for c in candidates:
        need = max(shared_fwd(c, dtype, DH, fast, device), shared_bwd(c, dtype, DH, fast, device))
        if need <= limit:
            return c
    raise ValueError(f"mlstm: heads of DH={DH} in {str(dtype)[6:]} need {need} bytes of shared memory a program, "
                     f"more than the {limit} bytes this GPU allows")


class MLSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, i, f, resets, config):
        B, NH, T, DH = q.shape
        config = fitted(config or pick(T, DH, q.device, B * NH, q.dtype), q.dtype, DH, q.device, picked=config is None)
        flat = [x.reshape(B * NH, T, DH) for x in (q, k, v)] + [x.reshape(B * NH, T) for x in (i, f)]
        fast = dot_mode(q.dtype, q.device, DH)
        h, cs, ns, ms, mo, den = mlstm_fwd(*flat, resets, NH, config, fast, EPS)
        ctx.save_for_backward(*flat, resets, h, cs, ns, ms, mo, den)
        ctx.config, ctx.dot_f32, ctx.shape = config, fast, (B, NH)
        last = (cs[:, -1].view(B, NH, DH, DH).to(q.dtype), ns[:, -1].view(B, NH, DH).to(q.dtype),
                ms[:, -1].view(B, NH).to(q.dtype))
        ctx.mark_non_differentiable(*last)
        return (h.view(B, NH, T, DH),) + last

    @staticmethod
    def backward(ctx, dh, *_):
        q, k, v, i, f, resets, h, *saved = ctx.saved_tensors
        B, NH = ctx.shape
        BH, T, DH = q.shape
        dq, dk, dv, di, df = mlstm_bwd(dh.reshape(BH, T, DH), q, k, v, i, f, resets, NH, h, saved, ctx.config,
                                       ctx.dot_f32, EPS)
        return (dq.view(B, NH, T, DH), dk.view(B, NH, T, DH), dv.view(B, NH, T, DH), di.view(B, NH, T),
                df.view(B, NH, T), None, None)


def mlstm(q, k, v, i, f, resets=None, config: MLSTMConfig | None = None):
    """(h, C_T, n_T, m_T); see the module docstring."""
    if q.dim() != 4:
        raise ValueError(f"mlstm: q must be [B, NH, T, DH], got {tuple(q.shape)}")
    B, NH, T, DH = q.shape
    for name, t, shape in (("k", k, (B, NH, T, DH)), ("v", v, (B, NH, T, DH)), ("i", i, (B, NH, T)),
                           ("f", f, (B, NH, T))):
        if tuple(t.shape) != shape:
            raise ValueError(f"mlstm: {name} must be {shape} for q {tuple(q.shape)}, got {tuple(t.shape)}")
    if resets is not None and (tuple(resets.shape) != (B, T) or resets.dtype != torch.bool):
        raise ValueError(f"mlstm: resets must be a bool [B, T] = ({B}, {T}) mask, got {resets.dtype} "
                         f"{tuple(resets.shape)}")
    if check_dtypes("mlstm", q=q, k=k, v=v) == torch.float16:
        # fp16's range (65504) cannot hold the normaliser's inverse (up to 1e6) that the backward's
        # products take in: the fp32 kernels, as eager computes fp16
        out = mlstm(q.float(), k.float(), v.float(), i.float(), f.float(), resets, config)
        return tuple(o.half() for o in out)
    resets = resets.contiguous() if resets is not None else None  # the kernels read it as [B, T]
    return MLSTMFunction.apply(*(x.contiguous() for x in (q, k, v, i, f)), resets, config)
