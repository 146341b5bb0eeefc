"""attention against its float64 reference on the CPU interpreter: every path of the Triton kernels
(head dims 64/96/128, causal or not, grouped-query, Sq != Skv, sliding windows, packed batches
with empty and one-token sequences, fully masked rows), forward and backward, fp16 and bf16."""
import dataclasses
import os
from pathlib import Path
import random

import pytest
import torch

import opcheck
from kcollect import verify
from kcollect.kernels.attention import (AttentionConfig, BwdConfig, FwdConfig, attention, attention_forward,
                                        naive, providers)
from kcollect.kernels.attention.spec import SPEC, packed_inputs, varlen_lengths, visible_total
from kcollect.runner import Runner, RunConfig, plan
from kcollect.spec import Provider, Shape, Unavailable
from kcollect.store import Store

F16, BF16 = torch.float16, torch.bfloat16


def dense(b, hq, hkv, sq, sk, d, causal, window=0):
    return {"B": b, "Hq": hq, "Hkv": hkv, "Sq": sq, "Skv": sk, "D": d, "causal": causal, "window": window, "varlen": 0}


def check(inputs, dtype, fn=None):
    """fwd+bwd of `fn` (ours by default) on these inputs against float64: outputs, dq, dk, dv."""
    seed = random.randrange(2**31)
    dys, want = verify.reference_answers(SPEC, inputs, "fwd+bwd", seed)
    got = verify.build_call(SPEC, fn or SPEC.provider("triton").fn, verify.clone_inputs(inputs), "fwd+bwd", dys)()
    err, tol = verify.max_error(got, want), SPEC.tolerance[dtype]
    assert err <= tol, f"error {err:.3g} > {tol:.3g}"
    return got


DENSE = [  # (dims, dtype): lengths straddle the CPU config's 16-row blocks
    (dense(1, 2, 2, 37, 37, 64, 0), F16),
    (dense(2, 4, 2, 33, 33, 64, 1), BF16),  # grouped-query 2:1, two sequences
    (dense(1, 2, 1, 20, 45, 96, 1), F16),  # D 96 padded; fewer queries than keys
    (dense(1, 1, 1, 20, 33, 128, 0), BF16),
    (dense(1, 2, 2, 50, 50, 64, 1, window=16), F16),  # masked blocks at both edges of the window
]


@pytest.mark.parametrize("dims, dtype", DENSE, ids=lambda x: ",".join(f"{k}={v}" for k, v in x.items())
                         if isinstance(x, dict) else str(x)[6:])
def test_dense_matches_reference(dims, dtype):
    check(SPEC.make_inputs(dims, dtype, "cpu", random.randrange(2**31)), dtype)


def _no_key_rows(o, n):
    assert torch.isfinite(o).all()
    assert (o[..., :n, :, :] == 0).all() if o.dim() == 4 else (o[:n] == 0).all()


@pytest.mark.parametrize("window", [0, 5])
def test_rows_without_keys_give_zero_and_no_nan(window):
    # 45 queries over 20 keys, aligned at the end: the first 25 queries see no key
    dims = dense(1, 2, 1, 45, 20, 96, 1, window)
    got = check(SPEC.make_inputs(dims, F16, "cpu", random.randrange(2**31)), F16)
    _no_key_rows(got[0], 25)
    assert all(torch.isfinite(g).all() for g in got[1:])


PACKED = [  # (lens_q, lens_k, Hq, Hkv, D, causal, window, dtype)
    ([0, 1, 17, 33], None, 4, 2, 64, 1, 0, F16),  # empty and one-token sequences, grouped-query
    ([5, 0, 30], [12, 7, 20], 2, 2, 128, 0, 0, BF16),  # keys of a sequence without queries
    ([1, 40, 0, 9], None, 2, 1, 96, 1, 8, F16),  # window inside each sequence
]


@pytest.mark.parametrize("lens_q, lens_k, hq, hkv, d, causal, window, dtype", PACKED)
def test_packed_matches_reference(lens_q, lens_k, hq, hkv, d, causal, window, dtype):
    inputs = packed_inputs(lens_q, lens_k or lens_q, hq, hkv, d, causal, window, dtype, "cpu", random.randrange(2**31))
    check(inputs, dtype)


def test_packed_sequence_without_keys_gives_zero():
    inputs = packed_inputs([3, 4], [0, 6], 2, 2, 64, 0, 0, F16, "cpu", 1)
    got = check(inputs, F16)
    _no_key_rows(got[0], 3)


CONFIGS = {
    # asymmetric blocks, a persistent forward (sm_count is 4 on the CPU: fewer programs than tiles)
    "persistent": (AttentionConfig(FwdConfig(32, 16, 4, 1, persistent=1), BwdConfig(32, 16, 4, 1, 16, 32, 4, 1)),
                   lambda seed: SPEC.make_inputs(dense(1, 3, 1, 40, 40, 64, 1), F16, "cpu", seed)),
    # tensor descriptors (the interpreter runs them): zero-filled rows past each packed sequence and
    # head columns 96-127, clipped stores
    "tma": (AttentionConfig(FwdConfig(16, 16, 4, 1, tma=True), BwdConfig(tma=True, **{
        f: 16 for f in ("kv_n", "kv_m", "q_m", "q_n")}, kv_stages=1, q_stages=1, kv_warps=4, q_warps=4)),
            lambda seed: packed_inputs([0, 19, 33], [0, 19, 33], 2, 1, 96, 1, 0, BF16, "cpu", seed)),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_other_configs(name):
    config, make = CONFIGS[name]
    inputs = make(random.randrange(2**31))
    check(inputs, inputs["q"].dtype, lambda **kw: attention(**kw, config=config))


@pytest.mark.parametrize("provider", ["eager", "sdpa_math"])
def test_cpu_providers_match_reference(provider):
    fn = SPEC.provider(provider).fn
    check(SPEC.make_inputs(dense(2, 4, 2, 40, 56, 64, 1, window=9), BF16, "cpu", random.randrange(2**31)), BF16, fn)
    if provider == "eager":  # packed batches through the block-diagonal mask
        check(packed_inputs([7, 30, 1], [7, 30, 1], 2, 2, 64, 1, 0, F16, "cpu", random.randrange(2**31)), F16, fn)


def test_refusals_are_unavailable():
    inputs = packed_inputs([3, 4], [3, 4], 2, 2, 64, 1, 0, F16, "cpu", 0)
    with pytest.raises(Unavailable, match="packed"):
        SPEC.provider("sdpa_math").fn(**inputs)
    with pytest.raises(Unavailable, match="causal only"):
        providers.fla(**SPEC.make_inputs(dense(1, 1, 1, 8, 8, 64, 0), F16, "cpu", 0))


def test_runner_stores_a_refusal_as_unavailable(tmp_path):
    def refuse(**inputs):
        raise Unavailable("too large for this backend")

    spec = dataclasses.replace(SPEC, providers=(Provider("refuses", refuse),), baseline="refuses",
                               grids={"quick": (Shape(dense(1, 1, 1, 8, 8, 16, 0), "tiny"),), "full": ()})
    config = RunConfig(kernels=("attention",), grid="quick", device="cpu", modes=("fwd",), dtypes=("float16",),
                       warmup_ms=1, rep_ms=1, min_reps=1, seed=1)
    with Store(tmp_path / "k.duckdb") as store:
        runner = Runner(config, store)
        runner.start(Path(__file__).resolve().parent.parent)
        rows = [r for case in plan([spec], config) for r in runner.run_case(case)]
    assert [(r["status"], r["error"]) for r in rows] == [("unavailable", "too large for this backend")]


@pytest.mark.parametrize("kwargs, match", [
    (dict(q=torch.randn(1, 4, 2, 16)), "dtype"),
    (dict(k=torch.randn(1, 4, 3, 16, dtype=F16), v=torch.randn(1, 4, 3, 16, dtype=F16)), "multiple"),
    (dict(window=4), "causal=True"),
    (dict(q=torch.randn(1, 4, 2, 160, dtype=F16), k=torch.randn(1, 4, 2, 160, dtype=F16),
          v=torch.randn(1, 4, 2, 160, dtype=F16)), "head dim"),
])
def test_bad_inputs_are_refused(kwargs, match):
    args = dict(q=torch.randn(1, 4, 2, 16, dtype=F16), k=torch.randn(1, 4, 2, 16, dtype=F16),
                v=torch.randn(1, 4, 2, 16, dtype=F16))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        attention_forward(**args)


def test_grid_shapes_are_accepted():
    opcheck.check_grids_accepted(SPEC)


def test_cost_model_counts_visible_pairs():
    # dense causal: half the square (FlashAttention's convention); windows and packing: exact
    assert visible_total(dense(2, 1, 1, 64, 64, 64, 1)) == 2 * 64 * 64 / 2
    window = dense(1, 1, 1, 50, 70, 64, 1, window=9)
    assert visible_total(window) == naive.visible(50, 70, True, 9).sum().item()
    lens = varlen_lengths(8, 2048)
    assert sum(lens) == 8 * 2048 and lens == varlen_lengths(8, 2048) and len(set(lens)) > 1
    packed = dict(dense(8, 1, 1, 2048, 2048, 64, 1), varlen=1)
    assert visible_total(packed) == sum(n * (n + 1) // 2 for n in lens)
    assert SPEC.flops(packed, "bwd") == 2.5 * SPEC.flops(packed, "fwd")


# -- on an sm_90 GPU (TRITON_INTERPRET=0 pytest tests/test_attention.py -k gpu): the compiled kernels,
# every Hopper switch, at sizes with many blocks -----------------------------------------------------
ON_GPU = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
                            or torch.cuda.get_device_capability() != (9, 0),
                            reason="needs an sm_90 GPU with TRITON_INTERPRET=0")
GPU_CONFIGS = {
    "pick": None,
    "tma": AttentionConfig(FwdConfig(tma=True), BwdConfig(tma=True)),
    "persistent": AttentionConfig(FwdConfig(persistent=1), BwdConfig(kv_n=64, kv_m=32, q_m=64, q_n=32)),
    "small": AttentionConfig(FwdConfig(64, 32, 4, 2), BwdConfig(64, 32, 4, 3, 64, 32, 4, 3)),
}
GPU_CASES = {
    "gqa": lambda seed: SPEC.make_inputs(dense(2, 8, 2, 1000, 1000, 128, 1), BF16, "cuda", seed),
    "window": lambda seed: SPEC.make_inputs(dense(1, 4, 4, 1500, 1500, 64, 1, window=300), F16, "cuda", seed),
    "packed": lambda seed: packed_inputs(*[[0, 1, 700, 1300, 5]] * 2, 4, 2, 96, 1, 0, BF16, "cuda", seed),
    "no_keys": lambda seed: SPEC.make_inputs(dense(1, 2, 2, 700, 300, 128, 1), F16, "cuda", seed),
    "full": lambda seed: SPEC.make_inputs(dense(1, 4, 4, 777, 1111, 64, 0), F16, "cuda", seed),
}


@ON_GPU
@pytest.mark.parametrize("config", GPU_CONFIGS)
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_matches_reference(case, config):
    inputs = GPU_CASES[case](random.randrange(2**31))
    cfg = GPU_CONFIGS[config]
    got = check(inputs, inputs["q"].dtype, lambda **kw: attention(**kw, config=cfg))
    if case == "no_keys":  # the first 400 queries see no key
        _no_key_rows(got[0], 400)


@ON_GPU
def test_gpu_packed_call_is_graph_capturable():
    inputs = packed_inputs([3, 900, 0, 257], [3, 900, 0, 257], 4, 4, 128, 1, 128, BF16, "cuda", 0)
    q, k, v = (inputs[n].requires_grad_(True) for n in ("q", "k", "v"))
    rest = {n: inputs[n] for n in inputs if n not in ("q", "k", "v")}
    do = torch.randn_like(q)
    torch.autograd.grad(attention(q, k, v, **rest), (q, k, v), do)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = torch.autograd.grad(attention(q, k, v, **rest), (q, k, v), do)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.isfinite(g).all() for g in grads)


def test_tuning_script_dry_run(capsys):
    from lab import attention_tune

    assert attention_tune.main(["--device", "cpu", "--limit", "1", "--rep-ms", "1"]) == 0
    out = capsys.readouterr().out
    assert "== tiny fwd" in out and "== tiny bwd" in out and "FwdConfig(" in out and "BwdConfig(" in out
    assert "sdpa_flash" in out and "unavailable" in out
