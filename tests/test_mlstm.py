"""mlstm against its float64 reference: our chunkwise kernels (several chunks, a partial last one,
value blocks narrower than the head), the PyTorch chunkwise form, every dtype, forward and backward;
the chunkwise reference itself against the step-by-step recurrence."""
import os

import pytest
import torch
import triton
import triton.language as tl

import opcheck
from cells_check import cast, errors_against_reference, reference_cases, with_resets
from kcollect import verify
from kcollect.kernels import mlstm
from kcollect.kernels.mlstm.bwd import dlinks, suffix_sum
from kcollect.kernels.mlstm.naive import chunkwise, recurrent
from kcollect.kernels.mlstm.spec import SPEC, reference

# 2 rows, 2 heads of 16, 37 steps: chunks of 16 on the CPU, the last one partial; resets at p = 0.2.
# 3 rows, one head of 24 (masked columns), 20 steps, no resets.
SMALL = {"B": 2, "NH": 2, "T": 37, "DH": 16, "resets": "0.2"}
ODD = {"B": 3, "NH": 1, "T": 20, "DH": 24, "resets": "0"}
CASES = reference_cases(SMALL, ODD)
GRADS = ("q", "k", "v", "i", "f")


@pytest.mark.parametrize("provider, mode, dtype, dims", CASES)
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def _inputs(B, NH, T, DH, device="cpu", dtype=torch.float32):
    inputs = SPEC.make_inputs({"B": B, "NH": NH, "T": T, "DH": DH, "resets": "0"}, dtype, device, seed=11)
    return with_resets(dict(inputs, i=inputs["i"] * 2, f=inputs["f"] * 2 + 1), B, T, device)


@pytest.mark.parametrize("chunk", [16, 8])
def test_chunkwise_reference_is_the_recurrence(chunk):
    # float64, gates ~ N(0, 2), resets at the first, consecutive and last steps, a partial last chunk
    inputs = verify.upcast(_inputs(3, 2, 21, 8))
    leaves = {n: inputs[n].clone().requires_grad_(True) for n in GRADS}
    a, b = recurrent(**dict(inputs, **leaves)), chunkwise(**dict(inputs, **leaves), chunk=chunk)
    dh = torch.randn_like(a[0])
    for x, y in zip(a + torch.autograd.grad(a[0], list(leaves.values()), dh),
                    b + torch.autograd.grad(b[0], list(leaves.values()), dh)):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("prefetch", [True, False])
def test_value_blocks_and_resets(prefetch):
    # a 32-wide head in two value blocks of 16 (the state scans' second program, the chunk kernels'
    # loop over blocks), resets at the edge cases, gates ~ N(0, 2); the forward's scan with the next
    # chunk's inputs loaded ahead and without
    errors = errors_against_reference(recurrent, mlstm.mlstm, _inputs(3, 1, 20, 32), GRADS,
                                      config=mlstm.MLSTMConfig(chunk=16, bv=16, prefetch=prefetch))
    assert max(errors) < SPEC.tolerance[torch.float32], errors


@pytest.mark.parametrize("by_chunk", [True, False], ids=["a-program-a-chunk", "a-program-a-row"])
def test_state_gradients_by_chunk_and_by_row(by_chunk):
    # the backward's chunk-start state gradients and the stabiliser's, a program a chunk then the scan
    # over chunks (where the next chunk start's stabiliser gradient reaches a chunk's gates through
    # the chunk kernel), or a program a row: 4 chunks of 16 (the last partial), two value blocks,
    # resets at the edge cases, input gates ~ 14 + N(0, 6) and forget gates near 1, so that the
    # stabiliser runs over chunk starts, q and k x 1e-3, so that q . n is near the normaliser's eps
    # exp(m) and m's gradient is felt: without the next start's share in the chunk kernel, di and df
    # were 0.40 and 0.88 off (3e-6 with it)
    inputs = _inputs(3, 1, 57, 32)
    inputs["q"], inputs["k"] = inputs["q"] * 1e-3, inputs["k"] * 1e-3
    g = torch.Generator().manual_seed(29)
    inputs["i"] = 14 + 6 * torch.randn(inputs["i"].shape, generator=g)
    inputs["f"] = 6 + torch.randn(inputs["f"].shape, generator=g)
    errors = errors_against_reference(recurrent, mlstm.mlstm, inputs, GRADS,
                                      config=mlstm.MLSTMConfig(chunk=16, bv=16, dstates_by_chunk=by_chunk))
    assert max(errors) < SPEC.tolerance[torch.float32], errors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_prefetch_changes_nothing_but_when_chunks_load(dtype):
    # the forward's outputs and saved states bit for bit with and without the scan's loads a chunk
    # ahead: 41 steps in chunks of 16 (the last partial), two value blocks, resets at the first and
    # last steps, at consecutive steps and at a chunk's first step
    from kcollect.kernels.mlstm.fwd import mlstm_fwd
    from kcollect.kernels.mlstm.naive import EPS

    B, NH, T, DH = 2, 1, 41, 32
    inputs = cast(_inputs(B, NH, T, DH), dtype)
    inputs["resets"][0, 16] = True
    flat = [inputs[n].reshape(B * NH, T, DH) for n in "qkv"] + [inputs[n].reshape(B * NH, T) for n in "if"]
    got = [mlstm_fwd(*flat, inputs["resets"], NH, mlstm.MLSTMConfig(chunk=16, bv=16, prefetch=prefetch),
                     mlstm.dot_mode(dtype, "cpu", DH), EPS) for prefetch in (True, False)]
    for a, b in zip(*got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_short_sequence_in_a_long_chunk_with_large_input_gates(prefetch):
    # the GPU's chunks of 64 over 17 steps: 47 padded rows, whose stabiliser is not stored; input
    # gates ~ 95 + N(0, 5) would overflow their weights (exp(i - 0)) to inf and every sum over rows
    # (dk, dv, di, df) to inf or NaN, as the H200 sweep found (seed 4)
    inputs = _inputs(3, 1, 17, 24)
    g = torch.Generator().manual_seed(23)
    inputs["i"] = 95 + 5 * torch.randn(inputs["i"].shape, generator=g)
    errors = errors_against_reference(recurrent, mlstm.mlstm, inputs, GRADS,
                                      config=mlstm.MLSTMConfig(chunk=64, bv=32, prefetch=prefetch))
    assert max(errors) < SPEC.tolerance[torch.float32], errors


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a GPU with TRITON_INTERPRET=0 (compiled kernels)")
@pytest.mark.parametrize("dh", [64, 128])
def test_gpu_chunks_of_64(dh):
    inputs = cast(_inputs(4, 2, 200, dh, "cuda"), torch.bfloat16)
    errors = errors_against_reference(reference, mlstm.mlstm, inputs, GRADS)
    assert max(errors) < SPEC.tolerance[torch.bfloat16], errors


def test_narrow_heads_are_padded_to_32_columns():
    """At 16 padded columns the fp32 chunk kernels built for sm_90 gave gradients off by O(1) on an
    H200 (kernels/mlstm/chunk.py); the interpreter did not."""
    from kcollect.kernels.mlstm.chunk import padded

    assert [padded(dh) for dh in (1, 3, 16, 17, 32, 33, 100)] == [32, 32, 32, 32, 32, 64, 128]


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a GPU with TRITON_INTERPRET=0 (compiled kernels)")
@pytest.mark.parametrize("dh", [3, 16])
def test_gpu_narrow_fp32_heads(dh):
    # the H200 sweep's shape: chunks of 64 over 129 steps, resets, heads of 3 and 16 columns
    inputs = _inputs(1, 2, 129, dh, "cuda")
    errors = errors_against_reference(recurrent, mlstm.mlstm, inputs, GRADS)
    assert max(errors) < SPEC.tolerance[torch.float32], errors


def test_narrow_fp32_heads_multiply_in_ieee_on_the_gpu():
    """Triton 3.6's tf32x3 backward at 16 padded columns reads shared memory out of bounds on sm_90
    (compute-sanitizer, H200): heads of 32 columns or fewer take IEEE there, wider ones tf32x3; the
    interpreter and 16-bit inputs are unaffected."""
    from kcollect.kernels._host.dot import IEEE, TF32X3

    assert [mlstm.dot_mode(torch.float32, "cuda", dh) for dh in (1, 3, 16, 24, 32)] == [IEEE] * 5
    assert [mlstm.dot_mode(torch.float32, "cuda", dh) for dh in (33, 64, 128)] == [TF32X3] * 3
    assert mlstm.dot_mode(torch.bfloat16, "cuda", 16) == 0
    assert mlstm.dot_mode(torch.float32, "cpu", 64) == IEEE


def test_mismatched_inputs_are_refused():
    inputs = SPEC.make_inputs(ODD, torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="v must be"):
        mlstm.mlstm(**dict(inputs, v=inputs["v"][..., :8]))
    with pytest.raises(ValueError, match="resets must be a bool"):
        mlstm.mlstm(**dict(inputs, resets=torch.ones(3, 20)))


def test_config_is_recorded():
    record = SPEC.provider("triton").config(SPEC.make_inputs(ODD, torch.float32, "cpu", 0))
    assert record == {"mlstm": {"chunk": 16, "bv": 16, "warps": 4, "state_warps": 4, "prefetch": True,
                                "warps_bwd": 0, "state_warps_bwd": 0, "dstates_by_chunk": True}}


def _loss_mp(q, k, v, i, f, dy, resets, dps: int):
    """sum(h * dy) of naive.recurrent's definition for one (row, head), in mpmath at `dps` digits."""
    import mpmath as mp

    T, DH = len(i), len(q[0])
    with mp.workdps(dps):
        ks = [[mp.mpf(x) / mp.sqrt(DH) for x in row] for row in k]
        C, n, m, total = [[mp.mpf(0)] * DH for _ in range(DH)], [mp.mpf(0)] * DH, mp.mpf(0), mp.mpf(0)
        for t in range(T):
            if resets[t]:
                C, n, m = [[mp.mpf(0)] * DH for _ in range(DH)], [mp.mpf(0)] * DH, mp.mpf(0)
            a = -mp.log(1 + mp.exp(-f[t]))
            m_new = max(a + m, mp.mpf(i[t]))
            fg, ig = mp.exp(a + m - m_new), mp.exp(i[t] - m_new)
            C = [[fg * C[r][c] + ig * ks[t][r] * v[t][c] for c in range(DH)] for r in range(DH)]
            n = [fg * n[r] + ig * ks[t][r] for r in range(DH)]
            m = m_new
            den = max(abs(mp.fsum(q[t][r] * n[r] for r in range(DH))), mp.exp(-m)) + mp.mpf(1e-6)
            total += mp.fsum(mp.fsum(q[t][r] * C[r][c] for r in range(DH)) * dy[t][c] for c in range(DH)) / den
        return total


def test_reference_gradient_keeps_the_gate_that_lost_the_max():
    """naive.recurrent's float64 gradient of a forget gate where the old state set m and a new input,
    1e-26 of it, did not (issue 40's wild-gates fp32 case, as the H200 sweep at bbc84b9 drew it):
    autograd took exp(a + m - m') as a function of a (1 - 1) and the input's share rounded away, df 0
    where the true one is 1e-26, and our kernels' (right) answer was 5,000x the reference's norm off.
    Against a 60-digit central difference of the same definition, each df within 1e-6 of the largest;
    our fp32 kernels' within 1e-4."""
    import mpmath as mp

    T, DH = 5, 4
    q, k, v = (torch.randn(1, 1, T, DH, dtype=torch.float64) * 0.01 for _ in range(3))
    i = (torch.tensor([-7.0, 21.0, 28.0, -35.0, -44.0]) + torch.rand(T)).double().view(1, 1, T)
    f = (torch.tensor([-57.0, -37.0, -61.0, -5.0, 22.0]) + torch.rand(T)).double().view(1, 1, T)
    resets = torch.tensor([[True, False, False, False, False]])
    dy = torch.randn(1, 1, T, DH, dtype=torch.float64)
    f.requires_grad_(True)
    (df,) = torch.autograd.grad((recurrent(q, k, v, i, f, resets)[0] * dy).sum(), f)
    rows = [x[0, 0].tolist() for x in (q, k, v, i, f.detach(), dy)]
    want = []
    with mp.workdps(60):
        step = mp.mpf("1e-20")
        for t in range(T):
            up, down = [mp.mpf(x) for x in rows[4]], [mp.mpf(x) for x in rows[4]]
            up[t], down[t] = up[t] + step, down[t] - step
            want.append(float((_loss_mp(*rows[:4], up, rows[5], resets[0].tolist(), 60)
                               - _loss_mp(*rows[:4], down, rows[5], resets[0].tolist(), 60)) / (2 * step)))
    want = torch.tensor(want, dtype=torch.float64)
    assert want[3].abs() > 0, want  # the case: a gradient the old reference rounded to 0
    assert ((df[0, 0] - want).abs() <= 1e-6 * want.abs().max()).all(), (df[0, 0].tolist(), want.tolist())
    x = [t.float().requires_grad_(t is f) for t in (q, k, v, i, f)]
    (ours,) = torch.autograd.grad((mlstm.mlstm(*x, resets=resets)[0] * dy.float()).sum(), x[4])
    err = ((ours[0, 0].double() - want).abs().max() / want.abs().max()).item()
    assert err < 1e-4, (ours[0, 0].tolist(), want.tolist())  # and our fp32 kernels' (fp32: a few 1e-6)


def test_the_backward_launches_with_its_own_warps(monkeypatch):
    # the backward's chunk-local state gradient and chunk kernel take the config's backward warps where
    # set (the GPU's pick sets them apart from the forward's), else the forward's; the gradients are
    # the same either way
    from kcollect.kernels.mlstm import bwd

    seen = {}

    class Recording:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen[self.kernel.fn.__name__] = kwargs["num_warps"]
                return self.kernel[grid](*args, **kwargs)
            return launch

    for name in ("_mlstm_dlocal", "_mlstm_dchunk"):
        monkeypatch.setattr(bwd, name, Recording(getattr(bwd, name)))
    inputs = _inputs(2, 1, 20, 16)
    leaves = [inputs[n].requires_grad_(True) for n in GRADS]
    grads = {}
    for config in (mlstm.MLSTMConfig(chunk=16, bv=16, warps=4, state_warps=4),
                   mlstm.MLSTMConfig(chunk=16, bv=16, warps=4, state_warps=4, warps_bwd=2, state_warps_bwd=8)):
        h = mlstm.mlstm(**inputs, config=config)[0]
        grads[config.warps_bwd] = torch.autograd.grad(h, leaves, torch.ones_like(h))
        want = (config.state_warps_bwd or config.state_warps, config.warps_bwd or config.warps)
        assert (seen["_mlstm_dlocal"], seen["_mlstm_dchunk"]) == want
    assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[2]))


@pytest.mark.parametrize("tile, out_dtype", [(dict(steps=32), torch.float32), (dict(steps=16, most=2), torch.float32),
                                             (dict(steps=512), torch.bfloat16)])
def test_link_scan_is_the_chunk_by_chunk_recurrence(tile, out_dtype):
    """_mlstm_dlinks (one associative scan over the chunks, then CB chunks of steps a turn) against the
    recurrence it stands for, taken a chunk at a time in float64: D = 0 after the last chunk; at chunk
    c, delta = D - Y - K, df += (D - delta where j <= kind) sigmoid(-f), di += delta where j == kind,
    then D = X + (D - Y where kind < 0, else K). Five chunks of 16 steps, the last partial (T 75), every
    kind (-1, a step, L; one row -1 throughout), random terms. The tiles: 3 programs a row of 2 chunks
    each (the last 1), 2 programs of 3 chunks a turn at a time, 1 program of all 5 at once."""
    g = torch.Generator().manual_seed(int(torch.randint(2**31, ())))
    BH, L, T = 3, 16, 75
    NC = -(-T // L)
    links = torch.randn(BH, NC, 4, generator=g)
    links[..., 3] = torch.tensor([-1, 0, 7, 15, L])[torch.randint(0, 5, (BH, NC), generator=g)].float()
    links[0, :, 3] = -1  # a row whose carried states set every stabiliser: D runs through all its chunks
    f, di, df = (torch.randn(BH, T, generator=g) * 3 for _ in range(3))
    want_di, want_df = di.double().clone(), df.double().clone()
    for bh in range(BH):
        D = 0.0
        for c in reversed(range(NC)):
            X, Y, K, kind = links[bh, c].double().tolist()
            delta = D - Y - K
            for j in range(min(L, T - c * L)):
                t = c * L + j
                want_df[bh, t] += (D - (delta if j <= kind else 0.0)) * torch.sigmoid(-f[bh, t].double())
                want_di[bh, t] += delta if j == kind else 0.0
            D = X + (D - Y if kind < 0 else K)
    got_di, got_df = torch.empty(BH, T, dtype=out_dtype), torch.empty(BH, T, dtype=out_dtype)
    dlinks(links.clone(), f, di, df, got_di, got_df, L, out_dtype == torch.float32, **tile)
    tol = 1e-5 if out_dtype == torch.float32 else 1e-2
    for got, want in ((got_di, want_di), (got_df, want_df)):
        assert verify.rel_error(got, want) < tol, verify.rel_error(got, want)


@triton.jit
def _suffix_sum_of(x_ptr, out_ptr, PRECISE: tl.constexpr):
    j = tl.arange(0, 4)
    tl.store(out_ptr + j, suffix_sum(tl.load(x_ptr + j), PRECISE))


@pytest.mark.parametrize("precise", [True, False])
def test_suffix_sum_keeps_a_small_term_between_cancelling_ones(precise):
    """bwd.suffix_sum of [a, -X, s, X] at step 1 is s: in fp32, X + s rounds s away before -X cancels X
    (the reverse scan's order here; the GPU's tree order loses others). fp32 (precise) sums in
    float64 and keeps s; bf16's path (not precise) is left to fp32's rounding, and loses it."""
    g = torch.Generator().manual_seed(int(torch.randint(2**31, ())))
    X, s = float(torch.rand((), generator=g)) * 1e4 + 1e4, float(torch.rand((), generator=g)) * 1e-4 + 1e-4
    x = torch.tensor([0.5, -X, s, X], dtype=torch.float32)
    out = torch.empty(4)
    _suffix_sum_of[(1,)](x, out, precise)
    want = x.double().flip(0).cumsum(0).flip(0)
    if precise:
        assert ((out.double() - want).abs() <= 2.0 ** -24 * want.abs()).all(), (out, want)  # each rounded once
        assert abs(out[1].item() - s) < 1e-3 * s
    else:
        assert out[1].item() != pytest.approx(s, rel=1e-3)  # what fp32's partial sums leave
