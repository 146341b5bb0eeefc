"""The implementations attention is measured against: PyTorch's SDPA backends (each pinned),
FlexAttention, plain eager attention, and the peers fla and FlashAttention-4.

Every provider takes the collector's inputs (q [B, S, H, D] or packed [T, H, D] with cu_seqlens)
and returns the output in the same layout; SDPA and flex get free transposed views. Masks and
block masks are built once per inputs, outside the timed calls (`once_per`). A provider that
cannot take the inputs raises `Unavailable` with the reason, which the collector stores as an
unavailable row.
"""
from __future__ import annotations

import functools
import importlib
import warnings
import weakref

import torch
import torch.nn.functional as F

from kcollect.spec import Unavailable

from .naive import visible

# eager attention materialises the B * H * Sq * Skv scores (and their softmax): small shapes only
EAGER_MAX_SCORES = 1 << 26
# sdpa_math does too, in fp32 (plus the gradient's copies): beyond this it runs out of memory
MATH_MAX_SCORES = 1 << 30

_BUILT: dict = {}


def once_per(anchor: torch.Tensor, key, build):
    """build() once for this anchor tensor and key, dropped when the anchor is freed: what a
    provider prepares per inputs (masks) stays out of its timed calls and leaves with the case."""
    k = (id(anchor), key)
    if k not in _BUILT:
        _BUILT[k] = build()
        weakref.finalize(anchor, _BUILT.pop, k, None)
    return _BUILT[k]


def _scores(q, k, cu_q) -> int:
    if cu_q is not None:
        return q.shape[0] * k.shape[0] * q.shape[1]
    return q.shape[0] * q.shape[2] * q.shape[1] * k.shape[1]


def packed_positions(cu_q, cu_k, tq: int, tk: int):
    """Per token of a packed batch: its sequence (queries, keys), its position in it (queries,
    keys), and its sequence's shift = key length - query length (naive.visible's alignment)."""
    dev = cu_q.device
    doc_q = torch.searchsorted(cu_q, torch.arange(tq, device=dev, dtype=cu_q.dtype), right=True) - 1
    doc_k = torch.searchsorted(cu_k, torch.arange(tk, device=dev, dtype=cu_k.dtype), right=True) - 1
    i = torch.arange(tq, device=dev) - cu_q[doc_q]
    j = torch.arange(tk, device=dev) - cu_k[doc_k]
    shift = ((cu_k[1:] - cu_k[:-1]) - (cu_q[1:] - cu_q[:-1]))[doc_q]
    return doc_q, doc_k, i, j, shift


def _keep(same, i, j, shift, causal: bool, window: int):
    """naive.visible's rule on broadcast positions, inside one sequence (`same`)."""
    if causal:
        same = same & (j <= i + shift)
    if window:
        same = same & (j > i + shift - window)
    return same


def packed_mask(cu_q, cu_k, tq: int, tk: int, causal: bool, window: int) -> torch.Tensor:
    """[tq, tk] bool for a packed batch: same sequence, and the rule inside it."""
    doc_q, doc_k, i, j, shift = packed_positions(cu_q, cu_k, tq, tk)
    return _keep(doc_q[:, None] == doc_k[None, :], i[:, None], j[None, :], shift[:, None], causal, window)


def _mask(q, k, causal, window, cu_q, cu_k) -> torch.Tensor:
    if cu_q is not None:
        return once_per(cu_q, ("mask", causal, window),
                        lambda: packed_mask(cu_q, cu_k, q.shape[0], k.shape[0], causal, window))
    return once_per(q, ("mask", causal, window), lambda: visible(q.shape[1], k.shape[1], causal, window, q.device))


def eager(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """matmul, softmax, matmul in the inputs' dtype; a packed batch as one sequence with a
    block-diagonal mask."""
    if _scores(q, k, cu_seqlens_q) > EAGER_MAX_SCORES:
        raise Unavailable(f"eager materialises the scores: {_scores(q, k, cu_seqlens_q)} > {EAGER_MAX_SCORES}")
    qt, kt, vt = (x[None] if cu_seqlens_q is not None else x for x in (q, k, v))
    qt, kt, vt = qt.transpose(1, 2), kt.transpose(1, 2), vt.transpose(1, 2)
    group = qt.shape[1] // kt.shape[1]
    kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
    s = torch.matmul(qt, kt.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal or window or cu_seqlens_q is not None:
        s = s.masked_fill(~_mask(q, k, causal, window, cu_seqlens_q, cu_seqlens_k), float("-inf"))
    out = torch.matmul(torch.softmax(s, dim=-1), vt).transpose(1, 2)
    return out[0] if cu_seqlens_q is not None else out


def _sdpa_refusal(name: str, caught) -> str:
    reasons = [str(w.message).strip() for w in caught if "not used because" not in str(w.message)]
    return f"{name} refuses these inputs" + (": " + "; ".join(reasons)[:400] if reasons else "")


def sdpa(name: str):
    """F.scaled_dot_product_attention pinned to one backend ('flash', 'cudnn', 'efficient', 'math')."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]

    def call(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
        if cu_seqlens_q is not None:
            raise Unavailable("SDPA takes no packed variable-length batch (cu_seqlens)")
        if name == "math" and _scores(q, k, None) > MATH_MAX_SCORES:
            raise Unavailable(f"sdpa_math materialises the scores: {_scores(q, k, None)} > {MATH_MAX_SCORES}")
        # is_causal aligns the diagonal top-left; FlashAttention's rule (bottom-right) and windows
        # need the boolean mask
        mask = None
        if window or (causal and q.shape[1] != k.shape[1]):
            mask = _mask(q, k, causal, window, None, None)
        is_causal = bool(causal) and mask is None
        with sdpa_kernel(backend), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     attn_mask=mask, is_causal=is_causal,
                                                     enable_gqa=q.shape[2] != k.shape[2])
            except RuntimeError as e:
                if "No available kernel" in str(e):
                    raise Unavailable(_sdpa_refusal(f"sdpa_{name}", caught)) from None
                raise
        return out.transpose(1, 2)

    return call


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex_block_mask(q, k, causal, window, cu_q, cu_k):
    from torch.nn.attention.flex_attention import create_block_mask

    if cu_q is not None:  # per-token sequence ids and positions: O(tokens), not a [T, T] mask
        doc_q, doc_k, pos_q, pos_k, shift_q = packed_positions(cu_q, cu_k, q.shape[0], k.shape[0])

        def mask_mod(b, h, i, j):
            return _keep(doc_q[i] == doc_k[j], pos_q[i], pos_k[j], shift_q[i], causal, window)

        return create_block_mask(mask_mod, None, None, q.shape[0], k.shape[0], device=q.device)
    shift = k.shape[1] - q.shape[1]

    def mask_mod(b, h, i, j):
        return _keep(j >= 0, i, j, shift, causal, window)

    return create_block_mask(mask_mod, None, None, q.shape[1], k.shape[1], device=q.device)


def flex(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """FlexAttention compiled, the masks as block masks (a packed batch: one sequence whose mask
    keeps each token in its own sequence)."""
    packed = cu_seqlens_q is not None
    block_mask = None
    if causal or window or packed:
        anchor = cu_seqlens_q if packed else q
        block_mask = once_per(anchor, ("flex", causal, window),
                              lambda: _flex_block_mask(q, k, causal, window, cu_seqlens_q, cu_seqlens_k))
    qt, kt, vt = ((x[None] if packed else x).transpose(1, 2) for x in (q, k, v))
    out = _compiled_flex()(qt, kt, vt, block_mask=block_mask, enable_gqa=q.shape[-2] != k.shape[-2])
    out = out.transpose(1, 2)
    return out[0] if packed else out


def fla(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """fla-core's parallel_attn: causal self-attention only (one length for queries and keys)."""
    if not causal:
        raise Unavailable("fla's parallel_attn is causal only")
    from fla.ops.attn import parallel_attn

    if cu_seqlens_q is None:
        if q.shape[1] != k.shape[1]:
            raise Unavailable("fla's parallel_attn takes one length for queries and keys")
        return parallel_attn(q, k, v, window_size=window or None)
    cu = once_per(cu_seqlens_q, "fla", lambda: cu_seqlens_q.long() if torch.equal(cu_seqlens_q, cu_seqlens_k) else None)
    if cu is None:
        raise Unavailable("fla's parallel_attn takes one length for queries and keys")
    return parallel_attn(q[None], k[None], v[None], window_size=window or None, cu_seqlens=cu)[0]


def fa4(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """FlashAttention-4 (CuTe DSL); its window_size=(W - 1, 0) is naive.visible's window of W."""
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    window_size = (window - 1, 0) if window else (None, None)
    if cu_seqlens_q is None:
        out = flash_attn_func(q, k, v, causal=bool(causal), window_size=window_size)
    else:
        out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                     max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=bool(causal),
                                     window_size=window_size)
    return out[0] if isinstance(out, tuple) else out


def cuda_only(what: str):
    def check(device: str) -> str | None:
        return None if device == "cuda" else f"{what} runs on CUDA GPUs only"

    return check


def importable(module: str):
    """Availability of a peer: on a CUDA device, and its module imports (the import is tried,
    since a wheel can be installed without the CUDA libraries it loads)."""

    def check(device: str) -> str | None:
        if device != "cuda":
            return f"{module} needs a CUDA GPU (its kernels do not run under Triton's interpreter)"
        try:
            importlib.import_module(module)
        except Exception as e:  # not installed, or its native libraries missing
            return f"{module} cannot be imported: {type(e).__name__}: {str(e)[:200]}"
        return None

    return check
