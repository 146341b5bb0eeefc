"""Awkward cases of attention: dense batches (head dims that are not multiples of 16, Sq != Skv
either way, windows of 1 key to more than the sequence, grouped-query, batch 1), packed batches
(empty sequences, one-token ones, keys of another length than the queries, max_seqlen given or
not), one-frame decoding over a cache (empty caches, windows), inputs whose rows are padded (strides
not 16-byte aligned) or start off the alignment, upstream gradients that are not contiguous, large
scores, and inputs past the documented limits (head dim over 128, fp32), which must be refused;
on a GPU also dense shapes in the Gluon kernels' scope with a Gluon config forced (`hopper`).

Shapes come from a fixed pool per path (`POOL`), built once from a fixed seed out of the awkward
sets below: the GPU compiles one kernel variant per shape, dtype and layout, so a sweep of thousands
of cases compiles a bounded number of them. Each case draws its shape from the pool and its data
(seed, magnitude) and options (dtype, layout) freely."""
from __future__ import annotations

import functools
import random

import torch

from . import common

# head dims: multiples of 16, of 8, odd, one, the limit; past it (refused)
HEAD_DIMS = (1, 8, 24, 33, 40, 64, 72, 100, 127, 128)
HEAD_DIMS_CPU = (1, 8, 24, 33, 64, 100, 128)
TOO_WIDE = (129, 160)
LENGTHS = (1, 2, 7, 16, 17, 31, 64, 65, 100, 129, 150, 257)
LENGTHS_CPU = (1, 2, 5, 16, 17, 33)
WINDOWS = (1, 2, 5, 17, 64, 1000)
PACKED_LENGTHS = (0, 0, 1, 2, 7, 16, 17, 40, 100)
PACKED_LENGTHS_CPU = (0, 0, 1, 2, 7, 17)
CACHE_LENGTHS = (0, 1, 5, 17, 100, 300)
CACHE_LENGTHS_CPU = (0, 1, 5, 17)
POOL_SIZE = {"dense": 28, "varlen": 14, "decode": 10, "hopper": 16}
POOL_SIZE_CPU = {"dense": 12, "varlen": 6, "decode": 4, "hopper": 4}
PATHS = ("dense", "dense", "dense", "varlen", "varlen", "decode")
# on a GPU also the Gluon kernels' own scope (kernels/attention/hopper.py, hopper_bwd.py), forced:
# lengths in multiples of their 64-row blocks, causal with at least as many keys as queries
GPU_PATHS = PATHS + ("hopper", "hopper")
HOPPER_LENGTHS = (64, 128, 192, 256, 320, 512, 576)
# the one-warpgroup tiles and the ping-pong's 128 rows (kernels/attention/pingpong.py), drawn per case
HOPPER = {64: dict(block_m=64, block_n=64, warps=4, stages=3, gluon=True),
          128: dict(block_m=128, block_n=64, warps=4, stages=4, gluon=True)}
# q and k this many times larger: scores of a spread of ~150, a softmax one-hot to fp32's resolution,
# whose gradients vanish below any dtype's (their relative error measures nothing): forward only
PEAKY = 12.0


def _heads(r: random.Random) -> tuple[int, int]:
    hkv = r.choice((1, 1, 2, 3))
    return hkv * r.choice((1, 1, 2, 3, 4)), hkv


def _dense_shape(r: random.Random, cpu: bool) -> dict:
    hq, hkv = _heads(r)
    lengths = LENGTHS_CPU if cpu else LENGTHS
    causal = r.random() < 0.7
    return {"B": r.choice((1, 1, 2, 3)), "Hq": hq, "Hkv": hkv, "Sq": r.choice(lengths), "Skv": r.choice(lengths),
            "D": r.choice(HEAD_DIMS_CPU if cpu else HEAD_DIMS), "causal": int(causal),
            "window": r.choice((0, 0) + WINDOWS) if causal else 0}


def _varlen_shape(r: random.Random, cpu: bool) -> dict:
    hq, hkv = _heads(r)
    lengths = PACKED_LENGTHS_CPU if cpu else PACKED_LENGTHS
    lens_q = [r.choice(lengths) for _ in range(r.choice((1, 2, 3, 5)))]
    lens_k = list(lens_q) if r.random() < 0.5 else [r.choice(lengths) for _ in lens_q]
    causal = r.random() < 0.7
    return {"lens_q": lens_q, "lens_k": lens_k, "Hq": hq, "Hkv": hkv,
            "D": r.choice(HEAD_DIMS_CPU if cpu else HEAD_DIMS), "causal": int(causal),
            "window": r.choice((0, 0) + WINDOWS) if causal else 0}


def _decode_shape(r: random.Random, cpu: bool) -> dict:
    hq, hkv = _heads(r)
    return {"B": r.choice((1, 2, 3)), "Hq": hq, "Hkv": hkv, "S": r.choice(CACHE_LENGTHS_CPU if cpu else CACHE_LENGTHS),
            "D": r.choice(HEAD_DIMS_CPU if cpu else HEAD_DIMS), "window": r.choice((0, 0, 1, 2, 7, 1000))}


def _hopper_shape(r: random.Random, cpu: bool) -> dict:
    hq, hkv = _heads(r)
    sq, sk = sorted(r.choice(HOPPER_LENGTHS) for _ in range(2))
    if r.random() < 0.4:  # the Gluon backward's scope (hopper_bwd.py): as many keys as queries
        sq = sk
    causal = r.random() < 0.6
    if not causal and r.random() < 0.5:
        sq, sk = sk, sq
    return {"B": r.choice((1, 2, 3)), "Hq": hq, "Hkv": hkv, "Sq": sq, "Skv": sk, "D": r.choice((16, 32, 64, 128)),
            "causal": int(causal), "window": 0}


_SHAPES = {"dense": _dense_shape, "varlen": _varlen_shape, "decode": _decode_shape, "hopper": _hopper_shape}


def pool(path: str, cpu: bool) -> list[dict]:
    """The fixed shapes of one path (the same list on every call and machine)."""
    r = random.Random(f"attention-{path}-{cpu}")
    return [_SHAPES[path](r, cpu) for _ in range((POOL_SIZE_CPU if cpu else POOL_SIZE)[path])]


def draw(rng: random.Random, device: str) -> dict:
    """One case: a pooled shape of a path, a dtype, data and layout options; now and then a shape
    past a limit (a head dim over 128, fp32), which the op must refuse."""
    cpu = device == "cpu"
    path = rng.choice(PATHS if cpu else GPU_PATHS)
    dims = dict(rng.choice(pool(path, cpu)))
    dtype = rng.choice(("float16", "bfloat16"))
    refusal = None
    if path in ("dense", "varlen") and rng.random() < 0.03:
        if rng.random() < 0.5:
            dims["D"], refusal = rng.choice(TOO_WIDE), "head dim"
        else:
            dtype, refusal = "float32", "bfloat16"
    options = {"scale": rng.choice((1.0, 1.0, 1.0, 2.0, 3.0, PEAKY)),  # q, k magnitude: large scores, peaky softmax
               "layout": rng.choice(("contiguous",) * (5 if path == "hopper" else 2) + ("padded", "offset")),
               "grad_layout": rng.choice(("contiguous", "contiguous", "strided"))}
    if path == "varlen":
        options["max_given"] = rng.random() < 0.5
    if path == "hopper":
        options["rows"] = rng.choice(tuple(HOPPER))
    return {"op": "attention", "path": path, "dtype": dtype, "dims": dims, "options": options,
            "refusal": refusal, "seed": rng.randrange(2**31)}


def variant(case: dict) -> str:
    """What decides the compiled kernels (cases sorted by it share compiles)."""
    return f"{case['path']}-{case['dtype']}-{case['options']['layout']}-{sorted(case['dims'].items())}"


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "padded":
        return common.padded(t, pad=1)
    if layout == "offset":
        return common.padded(t, pad=0, offset=1)
    return t


def _tensors(case: dict, shapes: dict, device: str) -> dict:
    g = common.seeded(case["seed"])
    dtype, opts = common.dtype_of(case["dtype"]), case["options"]
    out = {}
    for name, shape in shapes.items():
        scale = opts["scale"] if name in ("q", "k") else 1.0
        t = (torch.randn(shape, generator=g) * scale).to(device=device, dtype=dtype)
        out[name] = _layout(t, opts["layout"])
    return out


def _dense_inputs(case, device):
    d = case["dims"]
    t = _tensors(case, {"q": (d["B"], d["Sq"], d["Hq"], d["D"]), "k": (d["B"], d["Skv"], d["Hkv"], d["D"]),
                        "v": (d["B"], d["Skv"], d["Hkv"], d["D"])}, device)
    return {**t, "causal": bool(d["causal"]), "window": d["window"]}


def _varlen_inputs(case, device):
    from kcollect.kernels.attention.spec import cu_seqlens

    d = case["dims"]
    tq, tk = sum(d["lens_q"]), sum(d["lens_k"])
    t = _tensors(case, {"q": (tq, d["Hq"], d["D"]), "k": (tk, d["Hkv"], d["D"]), "v": (tk, d["Hkv"], d["D"])}, device)
    given = case["options"]["max_given"]
    cu_q, cu_k = cu_seqlens(d["lens_q"], device), cu_seqlens(d["lens_k"], device)
    if case["options"]["layout"] == "padded":  # cumulative lengths as strided views too
        cu_q, cu_k = common.every_other(cu_q), common.every_other(cu_k)
    return {**t, "causal": bool(d["causal"]), "window": d["window"], "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
            "max_seqlen_q": max(d["lens_q"]) if given else None, "max_seqlen_k": max(d["lens_k"]) if given else None}


def _decode_inputs(case, device):
    d = case["dims"]
    b, hq, hkv, s, dh = d["B"], d["Hq"], d["Hkv"], d["S"], d["D"]
    t = _tensors(case, {"q": (b, hq, dh), "k_cache": (b, s, hkv, dh), "v_cache": (b, s, hkv, dh), "k": (b, hkv, dh),
                        "v": (b, hkv, dh)}, device)
    return {**t, "window": d["window"]}


def decode_maths(q, k_cache, v_cache, k, v, window):
    """One-frame attention in plain PyTorch, in the inputs' dtype: the cache's last window - 1 keys
    (all with window 0) and the new key, softmax over them (decode.py's rule)."""
    keys = torch.cat([k_cache, k[:, None]], dim=1)
    values = torch.cat([v_cache, v[:, None]], dim=1)
    if window:
        keys, values = keys[:, -window:], values[:, -window:]
    group = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(group, 2), values.repeat_interleave(group, 2)
    s = torch.einsum("bhd,bshd->bhs", q, keys) * q.shape[-1] ** -0.5
    return torch.einsum("bhs,bshd->bhd", torch.softmax(s, dim=-1), values)


def subject(case: dict, device: str) -> common.Subject:
    from kcollect.kernels.attention import attention, naive, providers
    from kcollect.kernels.attention.step import attention_decode
    from kcollect.kernels.attention.spec import SPEC, triton_attention

    dtype = common.dtype_of(case["dtype"])
    tolerance = SPEC.tolerance.get(dtype, SPEC.tolerance[torch.float16])
    kw = dict(dtype=dtype, tolerance=tolerance, refusal=case["refusal"], grad_layout=case["options"]["grad_layout"],
              seed=case["seed"])
    if case["path"] == "decode":
        return common.Subject(lambda: _decode_inputs(case, device), attention_decode, decode_maths, decode_maths, (),
                              **kw)
    make = _varlen_inputs if case["path"] == "varlen" else _dense_inputs
    grads = ("q", "k", "v") if case["options"]["scale"] < PEAKY else ()
    # attention(accurate=True) where the case's options ask for it (the sweep's draws do not: it
    # judges what a call with the defaults gives)
    ours = functools.partial(attention, accurate=True) if case["options"].get("accurate") else triton_attention
    if case["path"] == "hopper":
        ours = _gluon_forced(ours, case["options"].get("rows", 64))
    return common.Subject(lambda: make(case, device), ours, providers.eager, naive.reference, grads, **kw)


def _gluon_forced(fn, rows: int):
    """fn with a Gluon forward (HOPPER[rows]) forced in place of the forward's pick, and the Gluon
    backward (hopper_bwd.py) switched on in the backward's pick."""
    from kcollect.kernels._host.config import changed, forced
    from kcollect.kernels.attention import BwdConfig, FwdConfig

    def call(**kw):
        with forced(FwdConfig(**HOPPER[rows]), changed(BwdConfig, gluon=True)):
            return fn(**kw)
    return call


def check(case: dict, device: str) -> dict:
    return common.verdict(subject(case, device))
