"""rope against its float64 reference: every provider, mode and dtype, on awkward shapes; layouts,
cos/sin forms, GQA head counts, one launch for q and k."""
import random

import pytest
import torch

from kcollect import verify
from kcollect.kernels import rope

SPEC = rope.SPEC
SHAPES = [shape.dims for shape in SPEC.grids["quick"]]
RUNNABLE = [p.name for p in SPEC.providers if p.available("cpu") is None]


@pytest.mark.parametrize("provider", RUNNABLE)
@pytest.mark.parametrize("mode", SPEC.modes)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: "x".join(map(str, d.values())))
def test_matches_reference(provider, mode, dtype, dims):
    if provider == "compile" and dims != SHAPES[0]:
        pytest.skip("compile is checked once per mode and dtype: each shape costs a CPU compile")
    result = verify.check(SPEC, provider, dims, dtype, mode, seed=random.randrange(2**31))
    assert result.ok, f"{provider} {mode} {dtype} {dims}: error {result.error:.3g} > {result.tolerance:.3g}"


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        assert {s.dims["pos"] for s in grid} == set(rope.POS), "both cos/sin forms in every grid"
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape


def test_liger_is_a_provider():
    assert "liger" in SPEC.provider_names
    assert SPEC.provider("liger").available("cpu") is not None  # Liger's kernels need a GPU


def _inputs(b=2, hq=6, hk=2, t=9, d=32, pos="ids", seed=0):
    return rope.make_inputs({"B": b, "Hq": hq, "Hk": hk, "T": t, "D": d, "pos": pos}, torch.float32, "cpu", seed)


def _check(q, k, cos, sin):
    got = rope.rope(q, k, cos, sin)
    want = rope.reference(q.double(), k.double(), cos.double(), sin.double())
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-6)
    return got


def test_inputs_have_the_hf_layout():
    x = _inputs()
    assert x["q"].shape == (2, 6, 9, 32) and x["k"].shape == (2, 2, 9, 32)
    assert x["q"].transpose(1, 2).is_contiguous()  # [B, T, H, D] in memory, as HF's projections
    assert x["cos"].shape == (2, 9, 32) and _inputs(pos="shared")["cos"].shape == (1, 9, 32)


@pytest.mark.parametrize("layout", ["hf", "contiguous"])
def test_any_layout_with_contiguous_head_dim(layout):
    x = _inputs()
    q, k = x["q"], x["k"]
    if layout == "contiguous":
        q, k = q.contiguous(), k.contiguous()
    _check(q, k, x["cos"], x["sin"])


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
    got = rope.rope(x["q"], x["k"], x["cos"], x["sin"])[0]
    first_rows_only = rope.reference(x["q"], x["k"], x["cos"][:1], x["sin"][:1])[0]
    assert not torch.allclose(got[1], first_rows_only[1], atol=1e-3)
    _check(x["q"], x["k"], x["cos"], x["sin"])


def test_general_cos_sin_both_halves_are_read():
    # cos/sin whose halves differ (not cat(freqs, freqs)): the exact formula, not a shortcut.
    x = _inputs()
    g = torch.Generator().manual_seed(1)
    cos, sin = torch.randn(x["cos"].shape, generator=g), torch.randn(x["sin"].shape, generator=g)
    _check(x["q"], x["k"], cos, sin)
    q, k = x["q"].detach().clone().requires_grad_(True), x["k"].detach().clone().requires_grad_(True)
    qd, kd = q.detach().double().requires_grad_(True), k.detach().double().requires_grad_(True)
    outs = rope.rope(q, k, cos, sin)
    ref = rope.reference(qd, kd, cos.double(), sin.double())
    dys = [torch.randn(o.shape, generator=g) for o in outs]
    got = torch.autograd.grad(outs, (q, k), dys)
    want = torch.autograd.grad(ref, (qd, kd), [dy.double() for dy in dys])
    for u, w in zip(got, want):
        torch.testing.assert_close(u.double(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hq,hk", [(12, 4), (5, 5), (7, 1), (40, 8)])
def test_head_counts(hq, hk):
    x = _inputs(b=1, hq=hq, hk=hk, t=3, d=16)
    _check(x["q"], x["k"], x["cos"], x["sin"])


def test_one_launch_per_direction(monkeypatch):
    real = rope._rope_qk
    launches = []

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(rope, "_rope_qk", Counting())
    x = _inputs()
    q, k = x["q"].requires_grad_(True), x["k"].requires_grad_(True)
    qo, ko = rope.rope(q, k, x["cos"], x["sin"])
    assert len(launches) == 1
    torch.autograd.grad((qo, ko), (q, k), (torch.ones_like(qo), torch.ones_like(ko)))
    assert len(launches) == 2


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
    want = torch.autograd.grad(rope.reference(q.double(), k.double(), x["cos"].double(), x["sin"].double())[0].sum(), q)[0]
    torch.testing.assert_close(dq, want, rtol=1e-5, atol=1e-6)


def test_refused_shapes():
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


# ---------------------------------------------------------------------------------------------
# Launch options (keywords of rope_apply / rope, for the GPU A/B benchmarks/rope_ab.py): each, and
# the combinations the A/B times, against the float64 reference, forward and backward, in every
# dtype, with fresh random inputs on awkward shapes.

OPTIONS = {
    "warps2": {"num_warps": 2},
    "warps8": {"num_warps": 8},
    "max_hb1": {"max_hb": 1},
    "max_hb2": {"max_hb": 2},
    "max_hb8": {"max_hb": 8},
    "tokens1": {"tokens": 1},
    "tokens4": {"tokens": 4},
    "qk_evict_first": {"policy": "evict_first"},
    "qk_evict_last": {"policy": "evict_last"},
    "cs_evict_last": {"cs_policy": "evict_last"},
    "qk_ef_cs_el": {"policy": "evict_first", "cs_policy": "evict_last"},
    "warps8_hb2": {"num_warps": 8, "max_hb": 2},
    "warps2_hb8": {"num_warps": 2, "max_hb": 8},
    "hb8_cs_el": {"max_hb": 8, "cs_policy": "evict_last"},
    "chunks": {"layout": "chunks"},
    "chunks_warps8": {"layout": "chunks", "num_warps": 8},
    "chunks_hb2": {"layout": "chunks", "max_hb": 2},
    "chunks_hb8": {"layout": "chunks", "max_hb": 8},
    "chunks_cs_el": {"layout": "chunks", "cs_policy": "evict_last"},
    "chunks_tokens2": {"layout": "chunks", "tokens": 2},
    "chunks_hb2_warps8": {"layout": "chunks", "max_hb": 2, "num_warps": 8},
    "chunks_hb1": {"layout": "chunks", "max_hb": 1},
    "hb2_warps2": {"max_hb": 2, "num_warps": 2},
    "hb1_warps8": {"max_hb": 1, "num_warps": 8},
    "hb4_warps4": {"max_hb": 4, "num_warps": 4},
    "hb2_warps4": {"max_hb": 2, "num_warps": 4},
}
OPTION_SHAPES = [
    (2, 6, 3, 5, 80, "ids"),  # head_dim 80 (half 40: padded to 64, or 5 chunks of 8 / 10 of 4), heads 6/3
    (1, 5, 1, 1, 80, "shared"),  # one token, MQA, odd head count
    (3, 16, 8, 7, 24, "ids"),  # half 12: chunks of 4 (8 bytes in bf16), GQA with 8 heads per thread
    (2, 8, 2, 9, 128, "shared"),  # power-of-two half, T not a multiple of the token block
]


def _options_case(dims, dtype, options, seed):
    b, hq, hk, t, d, pos = dims
    x = rope.make_inputs({"B": b, "Hq": hq, "Hk": hk, "T": t, "D": d, "pos": pos}, dtype, "cpu", seed)
    q, k = x["q"].requires_grad_(True), x["k"].requires_grad_(True)
    outs = rope.rope(q, k, x["cos"], x["sin"], **options)
    g = torch.Generator().manual_seed(seed + 1)
    dys = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    grads = torch.autograd.grad(outs, (q, k), [dy.to(dtype) for dy in dys])
    qd, kd = (v.detach().double().requires_grad_(True) for v in (q, k))
    ref = rope.reference(qd, kd, x["cos"].double(), x["sin"].double())
    ref_grads = torch.autograd.grad(ref, (qd, kd), dys)
    return outs + grads, ref + ref_grads


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", OPTION_SHAPES, ids=lambda d: "x".join(map(str, d)))
def test_launch_options_match_reference(dims, dtype, options):
    got, want = _options_case(dims, dtype, options, seed=random.randrange(2**31))
    tol = SPEC.tolerance[dtype]
    for name, g, w in zip(("q", "k", "dq", "dk"), got, want):
        err = verify.rel_error(g, w)
        assert err <= tol, f"{options} {dtype} {dims} {name}: error {err:.3g} > {tol:.3g}"


def test_ab_variants_are_tested():
    # every keyword set the GPU A/B times is one of the tested option sets above
    from benchmarks.rope_ab import VARIANTS

    tested = [o for o in OPTIONS.values()] + [{}, {"inplace": True}]  # inplace: test_inplace_option
    for label, kw, _, _ in VARIANTS:
        assert kw in tested, f"A/B variant {label!r} {kw} has no test"


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", OPTION_SHAPES, ids=lambda d: "x".join(map(str, d)))
def test_inplace_option(dims, dtype, backward):
    # the A/B's in-place launch (Liger's semantics): the rotation written over q and k, which are
    # returned, and equal to the reference's on the inputs as they were (HF's transposed layout)
    b, hq, hk, t, d, pos = dims
    x = rope.make_inputs({"B": b, "Hq": hq, "Hk": hk, "T": t, "D": d, "pos": pos}, dtype, "cpu",
                         random.randrange(2**31))
    q, k = x["q"].clone(), x["k"].clone()
    got = rope.rope_apply(q, k, x["cos"], x["sin"], backward=backward, inplace=True)
    assert got[0] is q and got[1] is k
    q0, k0 = x["q"].double(), x["k"].double()
    c, s = x["cos"].double(), x["sin"].double()
    if backward:  # the transpose of the rotation: the reference's vector-Jacobian product
        q0.requires_grad_(True)
        k0.requires_grad_(True)
        ref = rope.reference(q0, k0, c, s)
        want = torch.autograd.grad(ref, (q0, k0), (x["q"].double(), x["k"].double()))
    else:
        want = rope.reference(q0, k0, c, s)
    for g, w in zip(got, want):
        assert verify.rel_error(g, w) <= SPEC.tolerance[dtype]


def _recorded_launch(monkeypatch, run):
    real = rope._rope_qk
    launches = []

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((grid, kwargs))
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(rope, "_rope_qk", Recording())
    run()
    return launches


def test_options_reach_forward_and_backward(monkeypatch):
    x = _inputs(d=80)
    q, k = x["q"].requires_grad_(True), x["k"].requires_grad_(True)
    opts = {"num_warps": 2, "max_hb": 1, "policy": "evict_first", "cs_policy": "evict_last", "layout": "chunks"}

    def run():
        qo, ko = rope.rope(q, k, x["cos"], x["sin"], **opts)
        torch.autograd.grad((qo, ko), (q, k), (torch.ones_like(qo), torch.ones_like(ko)))

    launches = _recorded_launch(monkeypatch, run)
    assert len(launches) == 2
    for _, kw in launches:
        assert kw["num_warps"] == 2 and kw["HBQ"] == kw["HBK"] == 1
        assert (kw["POLICY"], kw["CS_POLICY"]) == ("evict_first", "evict_last")
        assert (kw["W"], kw["NC"]) == (4, 10)  # float32: 4-element (16-byte) chunks of the 40-wide half
    assert [kw["BACKWARD"] for _, kw in launches] == [False, True]


def test_default_launch(monkeypatch):
    # the collector's launch: 4 warps, up to 2 heads per thread (4 from head_dim 256), threads over
    # [BT, HALF_P] once with one 16-byte vector each, cos/sin hinted evict_last, the padded half
    x = rope.make_inputs({"B": 3, "Hq": 32, "Hk": 8, "T": 20, "D": 80, "pos": "ids"}, torch.bfloat16, "cpu", 0)
    launches = _recorded_launch(monkeypatch, lambda: rope.rope_apply(x["q"], x["k"], x["cos"], x["sin"]))
    (grid, kw), = launches
    assert (kw["num_warps"], kw["HBQ"], kw["HBK"], kw["ROWS"], kw["W"], kw["NC"]) == (4, 2, 2, 16, 64, 1)
    assert (kw["POLICY"], kw["CS_POLICY"]) == ("", "evict_last")
    assert grid == (4 * (16 + 4),)  # cdiv(60 tokens, 16) token blocks x (q + k head blocks)


def test_default_launch_wide_heads(monkeypatch):
    x = rope.make_inputs({"B": 2, "Hq": 8, "Hk": 2, "T": 5, "D": 256, "pos": "shared"}, torch.bfloat16, "cpu", 0)
    launches = _recorded_launch(monkeypatch, lambda: rope.rope_apply(x["q"], x["k"], x["cos"], x["sin"]))
    (grid, kw), = launches
    assert (kw["num_warps"], kw["HBQ"], kw["HBK"], kw["ROWS"], kw["W"]) == (4, 4, 2, 8, 128)
    assert grid == (2 * (2 + 1),)  # cdiv(10 tokens, 8) token blocks x (q + k head blocks)


def test_chunks_layout_has_no_padding(monkeypatch):
    x = rope.make_inputs({"B": 1, "Hq": 4, "Hk": 4, "T": 64, "D": 80, "pos": "ids"}, torch.bfloat16, "cpu", 0)
    launches = _recorded_launch(
        monkeypatch, lambda: rope.rope_apply(x["q"], x["k"], x["cos"], x["sin"], layout="chunks"))
    (grid, kw), = launches
    assert kw["W"] * kw["NC"] == kw["HALF"] == 40 and kw["W"] == 8  # bf16: one 16-byte vector a chunk
    assert grid == (triton_cdiv(64 * 5, kw["ROWS"]) * (2 + 2),)  # 2 heads per thread: 2 + 2 head blocks


def triton_cdiv(a, b):
    return -(-a // b)


@pytest.mark.parametrize("bad", [{"num_warps": 3}, {"max_hb": 6}, {"tokens": 12}, {"policy": "evict_normal"},
                                 {"cs_policy": "last"}, {"layout": "full"}])
def test_bad_options_are_refused(bad):
    x = _inputs()
    with pytest.raises(ValueError):
        rope.rope_apply(x["q"], x["k"], x["cos"], x["sin"], **bad)
