"""mlstm against its float64 reference: our chunkwise kernels (several chunks, a partial last one,
value blocks narrower than the head), the PyTorch chunkwise form, every dtype, forward and backward;
the chunkwise reference itself against the step-by-step recurrence."""
import pytest
import torch

import opcheck
from cells_check import cast, errors_against_reference, reference_cases, with_resets
from kcollect import verify
from kcollect.kernels import mlstm
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


def test_value_blocks_and_resets():
    # a 32-wide head in two value blocks of 16 (the state scans' second program, the chunk kernels'
    # loop over blocks), resets at the edge cases, gates ~ N(0, 2)
    errors = errors_against_reference(recurrent, mlstm.mlstm, _inputs(3, 1, 20, 32), GRADS,
                                      config=mlstm.MLSTMConfig(chunk=16, bv=16))
    assert max(errors) < SPEC.tolerance[torch.float32], errors


def test_a_short_sequence_in_a_long_chunk_with_large_input_gates():
    # the GPU's chunks of 64 over 17 steps: 47 padded rows, whose stabiliser is not stored; input
    # gates ~ 95 + N(0, 5) would overflow their weights (exp(i - 0)) to inf and every sum over rows
    # (dk, dv, di, df) to inf or NaN, as the H200 sweep found (seed 4)
    inputs = _inputs(3, 1, 17, 24)
    g = torch.Generator().manual_seed(23)
    inputs["i"] = 95 + 5 * torch.randn(inputs["i"].shape, generator=g)
    errors = errors_against_reference(recurrent, mlstm.mlstm, inputs, GRADS,
                                      config=mlstm.MLSTMConfig(chunk=64, bv=32))
    assert max(errors) < SPEC.tolerance[torch.float32], errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need a GPU")
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need a GPU")
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
    assert record == {"mlstm": {"chunk": 16, "bv": 16, "warps": 4, "state_warps": 4}}
