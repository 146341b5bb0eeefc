"""rope against its float64 reference: each provider, mode and dtype once on awkward shapes
(opcheck.lean_reference_cases); layouts, cos/sin forms, GQA head counts, one launch for q and k,
the configs the heuristic picks and others."""
import random

import pytest
import torch
import triton

import opcheck
from kcollect import verify
from kcollect.kernels import rope
from kcollect.kernels.rope import fwd as K
from kcollect.kernels.rope.spec import POS, SPEC, make_inputs, reference

SHAPES = [shape.dims for shape in SPEC.grids["quick"]]


# torch.compile of the eager code left out: PyTorch's, gated on every collector run, and each
# case costs seconds of CPU compile
@pytest.mark.parametrize("provider, mode, dtype, dims", opcheck.lean_reference_cases(SPEC, SHAPES))
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        assert {s.dims["pos"] for s in grid} == set(POS), "both cos/sin forms in every grid"
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape


def test_liger_is_a_provider():
    assert "liger" in SPEC.provider_names
    assert SPEC.provider("liger").available("cpu") is not None  # Liger's kernels need a GPU


def _inputs(b=2, hq=6, hk=2, t=9, d=32, pos="ids", dtype=torch.float32, seed=0):
    return make_inputs({"B": b, "Hq": hq, "Hk": hk, "T": t, "D": d, "pos": pos}, dtype, "cpu", seed)


def _check(q, k, cos, sin, config=None):
    """Forward and backward (random upstream gradients) against the reference's, in q's dtype's
    tolerance; the forward's outputs."""
    qg, kg = q.detach().clone().requires_grad_(True), k.detach().clone().requires_grad_(True)
    qd, kd = q.detach().double().requires_grad_(True), k.detach().double().requires_grad_(True)
    outs = rope.rope(qg, kg, cos, sin, config)
    want = reference(qd, kd, cos.double(), sin.double())
    dys = [torch.randn(o.shape, dtype=torch.float64) for o in outs]
    grads = torch.autograd.grad(outs, (qg, kg), [dy.to(q.dtype) for dy in dys])
    want_grads = torch.autograd.grad(want, (qd, kd), dys)
    tol = SPEC.tolerance[q.dtype]
    for name, g, w in zip(("q", "k", "dq", "dk"), outs + grads, want + want_grads):
        assert g.shape == w.shape
        assert verify.rel_error(g, w) <= tol, f"{name}: {verify.rel_error(g, w):.3g} > {tol}"
    return tuple(o.detach() for o in outs)


def test_inputs_have_the_hf_layout():
    x = _inputs()
    assert x["q"].shape == (2, 6, 9, 32) and x["k"].shape == (2, 2, 9, 32)
    assert x["q"].transpose(1, 2).is_contiguous()  # [B, T, H, D] in memory, as HF's projections
    assert x["cos"].shape == (2, 9, 32) and _inputs(pos="shared")["cos"].shape == (1, 9, 32)


@pytest.mark.parametrize("kind", ["heads", "flat"])
@pytest.mark.parametrize("layout", ["hf", "contiguous", "head_dim strided"])
def test_layouts(layout, kind):
    x = _inputs()
    q, k = x["q"], x["k"]
    if layout == "contiguous":
        q, k = q.contiguous(), k.contiguous()
    if layout == "head_dim strided":  # copied to a contiguous head_dim first
        q, k = q.transpose(2, 3).contiguous().transpose(2, 3), k.transpose(2, 3).contiguous().transpose(2, 3)
    _check(q, k, x["cos"], x["sin"], rope.RoPEConfig(layout=kind))


def test_cos_sin_forms_agree():
    # [T, D], [1, T, D] and the same rows expanded to [B, T, D] give the same rotation.
    x = _inputs(pos="shared")
    cos, sin = x["cos"], x["sin"]
    a = _check(x["q"], x["k"], cos[0], sin[0])
    b = _check(x["q"], x["k"], cos, sin)
    c = _check(x["q"], x["k"], cos.expand(2, -1, -1).contiguous(), sin.expand(2, -1, -1).contiguous())
    for u, v, w in zip(a, b, c):
        assert torch.equal(u, v) and torch.equal(u, w)


def test_position_ids_are_per_sequence():
    # With explicit per-sequence positions, sequence 1 must use its own cos/sin rows.
    x = _inputs(pos="ids")
    got = _check(x["q"], x["k"], x["cos"], x["sin"])[0]
    first_rows_only = reference(x["q"], x["k"], x["cos"][:1], x["sin"][:1])[0]
    assert not torch.allclose(got[1], first_rows_only[1], atol=1e-3)


def test_general_cos_sin_both_halves_are_read():
    # cos/sin whose halves differ (not cat(freqs, freqs)): the exact formula, not a shortcut.
    x = _inputs()
    g = torch.Generator().manual_seed(random.randrange(2**31))
    _check(x["q"], x["k"], torch.randn(x["cos"].shape, generator=g), torch.randn(x["sin"].shape, generator=g))


@pytest.mark.parametrize("layout", ["heads", "flat"])
@pytest.mark.parametrize("hq,hk,d", [(12, 4, 16), (7, 1, 16), (8, 2, 256)])
def test_head_counts(hq, hk, d, layout):
    # heads layout: 2 heads a thread (12/4), one (odd 7, MQA's 1), 4 from head_dim 256
    x = _inputs(b=1, hq=hq, hk=hk, t=3, d=d)
    _check(x["q"], x["k"], x["cos"], x["sin"], rope.RoPEConfig(layout=layout, max_heads=4 if d == 256 else 2))


@pytest.mark.parametrize("d", [18, 24, 72])
def test_flat_vectors_divide_the_half(d):
    # halves of 9, 12 and 36: vectors of 1, 4 and 4 elements in fp32 and in bf16, never across
    # the half's end
    assert [K.flat_vec(d // 2, size) for size in (4, 2)] == {18: [1, 1], 24: [4, 4], 72: [4, 4]}[d]
    for dtype in (torch.float32, torch.bfloat16):
        x = _inputs(b=2, hq=3, hk=1, t=5, d=d, dtype=dtype, seed=random.randrange(2**31))
        _check(x["q"], x["k"], x["cos"], x["sin"], rope.RoPEConfig(layout="flat", warps=1))


# Configs the heuristic does not pick, forward and backward in every dtype: one head a thread,
# 8 heads a thread (more than a head block), one token a program (many token blocks), 2 warps,
# cache hints (no effect on the interpreter: that they are accepted); the flat layout, its last
# program part full (8x5 slots of 8 elements in bf16, 10 of 4 in fp32, against 32 and 64 a program)
CONFIGS = [rope.RoPEConfig(max_heads=1), rope.RoPEConfig(max_heads=8, warps=2), rope.RoPEConfig(tokens=1),
           rope.RoPEConfig(policy="evict_first", cs_policy=""), rope.RoPEConfig(layout="flat", warps=1),
           rope.RoPEConfig(layout="flat", warps=1, slots=2)]


@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_configs_match_reference(config, dtype):
    # head_dim 80: half 40 padded to 64; 8/4 heads; T not a multiple of the token block
    x = _inputs(b=1, hq=8, hk=4, t=5, d=80, pos=random.choice(POS), dtype=dtype, seed=random.randrange(2**31))
    _check(x["q"], x["k"], x["cos"], x["sin"], config)


def _recorded_launch(monkeypatch, run, execute=True, kernel="_rope_qk"):
    """The (grid, keywords) of each launch of `kernel` `run` makes; `execute`: run them too."""
    launches = opcheck.record_launches(monkeypatch, K, kernel, execute)
    run()
    return launches


def test_one_launch_per_direction_with_the_config(monkeypatch):
    x = _inputs(d=80)
    q, k = x["q"].requires_grad_(True), x["k"].requires_grad_(True)
    config = rope.RoPEConfig(warps=2, max_heads=1, policy="evict_first", cs_policy="")

    def run():
        qo, ko = rope.rope(q, k, x["cos"], x["sin"], config)
        torch.autograd.grad((qo, ko), (q, k), (torch.ones_like(qo), torch.ones_like(ko)))

    launches = _recorded_launch(monkeypatch, run, False)
    assert [kw["BACKWARD"] for _, kw in launches] == [False, True]
    for _, kw in launches:
        assert kw["num_warps"] == 2 and kw["HBQ"] == kw["HBK"] == 1
        assert (kw["POLICY"], kw["CS_POLICY"]) == ("evict_first", "")


def test_default_launch(monkeypatch):
    # the collector's launch: 4 warps, up to 2 heads per thread (4 from head_dim 256), threads over
    # [BT, HALF_P] once with one 16-byte vector each, cos/sin hinted evict_last
    x = make_inputs({"B": 3, "Hq": 32, "Hk": 8, "T": 20, "D": 128, "pos": "ids"}, torch.bfloat16, "cpu", 0)
    (grid, kw), = _recorded_launch(monkeypatch, lambda: rope.rope_apply(x["q"], x["k"], x["cos"], x["sin"]), False)
    assert (kw["num_warps"], kw["HBQ"], kw["HBK"], kw["ROWS"], kw["W"]) == (4, 2, 2, 16, 64)
    assert (kw["POLICY"], kw["CS_POLICY"]) == ("", "evict_last")
    assert grid == (4 * (16 + 4),)  # cdiv(60 tokens, 16) token blocks x (q + k head blocks)
    # head_dim 80 (a half of 40, not a power of two) and 64: the flat layout, 128 slots a program of
    # 5 and 4 vectors of 8 a head's half; q in HF's layout walks tokens outer, its gradient heads
    for d, per_head in ((80, 5), (64, 4)):
        x = make_inputs({"B": 3, "Hq": 32, "Hk": 8, "T": 20, "D": d, "pos": "ids"}, torch.bfloat16, "cpu", 0)
        q, k, cos, sin = x["q"], x["k"], x["cos"], x["sin"]
        (grid, kw), = _recorded_launch(monkeypatch, lambda: rope.rope_apply(q, k, cos, sin), False, "_rope_flat")
        assert (kw["num_warps"], kw["SLOTS"], kw["VEC"], kw["Q_HEADS_OUTER"]) == (4, 128, 8, False)
        assert grid == (triton.cdiv(60 * 32 * per_head, 128) + triton.cdiv(60 * 8 * per_head, 128),)
        (_, kw), = _recorded_launch(monkeypatch, lambda: rope.rope_apply(q.contiguous(), k.contiguous(), cos, sin),
                                    False, "_rope_flat")
        assert kw["Q_HEADS_OUTER"] and kw["K_HEADS_OUTER"]
    x = make_inputs({"B": 2, "Hq": 8, "Hk": 2, "T": 5, "D": 256, "pos": "shared"}, torch.bfloat16, "cpu", 0)
    (grid, kw), = _recorded_launch(monkeypatch, lambda: rope.rope_apply(x["q"], x["k"], x["cos"], x["sin"]), False)
    assert (kw["num_warps"], kw["HBQ"], kw["HBK"], kw["ROWS"], kw["W"]) == (4, 4, 2, 8, 128)
    assert grid == (2 * (2 + 1),)  # cdiv(10 tokens, 8) token blocks x (q + k head blocks)


def test_a_forced_config_reaches_the_launch(monkeypatch):
    # the lab's A/B forces configs through the tunable pick (kcollect.kernels._host.config.forced)
    from kcollect.kernels._host.config import forced

    x = _inputs()
    with forced(rope.RoPEConfig(max_heads=1, warps=8)):
        (_, kw), = _recorded_launch(monkeypatch, lambda: rope.rope_apply(x["q"], x["k"], x["cos"], x["sin"]), False)
    assert (kw["HBQ"], kw["num_warps"]) == (1, 8)


def test_config_is_recorded():
    inputs = make_inputs({"B": 1, "Hq": 2, "Hk": 1, "T": 3, "D": 256, "pos": "ids"}, torch.float32, "cpu", 0)
    assert SPEC.provider("triton").config(inputs) == {
        "rope": {"warps": 4, "max_heads": 4, "tokens": None, "policy": "", "cs_policy": "evict_last", "layout": "heads",
                 "slots": 1}}


def test_inputs_are_not_modified():
    x = _inputs()
    before = {n: v.clone() for n, v in x.items()}
    rope.rope(x["q"], x["k"], x["cos"], x["sin"])
    for n, v in x.items():
        assert torch.equal(v, before[n]), n


def test_gradient_of_an_unused_output_is_zero():
    x = _inputs()
    q, k = x["q"].requires_grad_(True), x["k"].requires_grad_(True)
    qo, _ = rope.rope(q, k, x["cos"], x["sin"])
    dq, dk = torch.autograd.grad(qo.sum(), (q, k))
    assert torch.count_nonzero(dk) == 0
    want = torch.autograd.grad(reference(q.double(), k.double(), x["cos"].double(), x["sin"].double())[0].sum(), q)[0]
    torch.testing.assert_close(dq, want, rtol=1e-5, atol=1e-6)


def test_refused_shapes_and_configs():
    x = _inputs()
    q, k, cos, sin = x["q"], x["k"], x["cos"], x["sin"]
    with pytest.raises(ValueError, match="head_dim must be even"):
        rope.rope(q[..., :31], k[..., :31], cos[..., :31], sin[..., :31])
    with pytest.raises(ValueError, match="share batch, sequence"):
        rope.rope(q, k[:, :, :5], cos, sin)
    with pytest.raises(ValueError, match="cos and sin must be"):
        rope.rope(q, k, cos[:, :5], sin[:, :5])
    with pytest.raises(ValueError, match=r"\[B, H, T, D\]"):
        rope.rope(q[0], k[0], cos, sin)
    assert "even" in SPEC.check_shape({"B": 1, "Hq": 2, "Hk": 1, "T": 4, "D": 15, "pos": "ids"})
    assert "pos must be" in SPEC.check_shape({"B": 1, "Hq": 2, "Hk": 1, "T": 4, "D": 16, "pos": "arange"})
    for bad in [{"warps": 3}, {"max_heads": 6}, {"tokens": 12}, {"policy": "evict_normal"}, {"cs_policy": "last"}]:
        with pytest.raises(ValueError):
            rope.RoPEConfig(**bad)
