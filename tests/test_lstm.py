"""lstm against its float64 reference: our kernels (the persistent path, and the stepped path that
splits the hidden units over programs), the PyTorch step loop, every dtype, forward and backward."""
import os

import pytest
import torch

import opcheck
from cells_check import cast, errors_against_reference, reference_cases, with_resets
from kcollect import verify
from kcollect.kernels import lstm
from kcollect.kernels.lstm.spec import SPEC, reference

# 3x4x32 with resets: one batch group, a reset mask drawn at p = 0.3; 2x3x20: a hidden size that is
# neither a power of two nor a multiple of 16 (masked units and weight rows), no resets
SMALL = {"B": 3, "T": 4, "H": 32, "resets": "0.3"}
ODD = {"B": 2, "T": 3, "H": 20, "resets": "0"}
CASES = reference_cases(SMALL, ODD)
GRADS = ("x", "h0", "c0", "w_ih", "w_hh", "b")


@pytest.mark.parametrize("provider, mode, dtype, dims", CASES)
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def _errors(inputs, config):
    return errors_against_reference(reference, lstm.lstm, inputs, GRADS, config=config)


def _inputs(B, T, H, device="cpu"):
    inputs = SPEC.make_inputs({"B": B, "T": T, "H": H, "resets": "0"}, torch.float32, device, seed=7)
    return with_resets(inputs, B, T, device)


def test_hidden_split_over_programs_and_batch_groups():
    # 17 rows in two groups of 16, 24 units over two programs (the second half masked): the stepped
    # path, whose kernel boundary is the barrier between the programs of a step
    config = lstm.LSTMConfig(bb=16, hb=16, hb_bwd=16, bk=16)
    errors = _errors(_inputs(17, 3, 24), config)
    assert max(errors) < 1e-5, errors


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("hb, split", [(32, 1), (16, 1), (16, 2)])
def test_inputs_loaded_a_step_ahead(prefetch, hb, split):
    # a step's own inputs (input projection, resets, dy, gates, c before it) loaded a step ahead of
    # its wait, and not: one program a batch group (the persistent loop over the steps), the stepped
    # path (a launch a step) and the split backward (partials, then gates); resets at the edges
    config = lstm.LSTMConfig(bb=16, hb=hb, hb_bwd=hb, bk=16, split_bwd=split, prefetch=prefetch,
                             prefetch_bwd=prefetch)
    errors = _errors(_inputs(17, 5, 24), config)
    assert max(errors) < 1e-5, errors


def test_backward_tiles_apart_from_the_forward():
    # the backward streams its weight and dG tiles in its own length (32 rows: 4 tiles of the 128
    # padded gate rows at H 20) while the forward keeps 16-row tiles (the H200's pick differs so)
    from kcollect.kernels.lstm import sequence

    config = lstm.LSTMConfig(bb=16, hb=32, hb_bwd=32, bk=16, bk_bwd=32, warps_bwd=8)
    cpu = torch.device("cpu")
    assert sequence._bwd_meta(config, 20, torch.float32, cpu)["BK"] == 32
    assert sequence._fwd_meta(config, 20, torch.float32, cpu)["BK"] == 16
    errors = _errors(_inputs(3, 3, 20), config)
    assert max(errors) < 1e-5, errors


def test_fitting_shrinks_the_backward_tiles_too():
    # a picked config whose tiles do not fit a device's shared memory loses rows in both kernels'
    # tiles alike (an fp32 backward tile of 64 x 256 in 3 stages is more than an H100 or H200 holds)
    from kcollect.kernels.lstm import sequence

    config = lstm.LSTMConfig(bb=64, hb=16, hb_bwd=16, bk=128, bk_bwd=256, warps_bwd=8)
    shrunk = []
    c = config
    while True:
        c = sequence.shrink(c)
        if c is None:
            break
        shrunk.append((c.bk, c.bk_bwd))
    assert shrunk[:3] == [(64, 128), (32, 64), (16, 32)] and shrunk[3] == (16, 16), shrunk


def test_resident_weights():
    # the weights held in registers for the whole sequence, forward and backward
    config = lstm.LSTMConfig(bb=16, hb=32, hb_bwd=32, bk=16, resident=True, resident_bwd=True)
    errors = _errors(_inputs(3, 3, 32), config)
    assert max(errors) < 1e-5, errors


@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_fp32_recurrent_sums_rounded_once(resident, direction):
    # Issue 40 (H200 sweeps, H 512): fp32 products summed in fp32 left dh0 at 1.3e-6 where eager's was
    # 4.5e-7 (one FMA chain over 4H = 2048 terms), and with chains blocked in tiles 3 of 63
    # saturated-gate LSTMs still over 2x eager's error. fp32 products are now summed in float64 and
    # rounded once. Weights of one sign (partial sums that grow with K) and T = 1, so that the
    # forward's gate pre-activations and the backward's dh0 are those sums alone, checked against
    # float64 of the kernel's own operands. An fp32 chain (tests/gpu_dot.py: the GPU's fp32 dot on
    # the interpreter) measured 8.1-8.8 units of 2^-24 in dh0, tiles of 64 summed 1.1-1.2.
    import gpu_dot
    from kcollect.kernels.lstm.sequence import lstm_bwd, lstm_fwd

    B, H = 3, 256
    g = torch.Generator().manual_seed(int(torch.randint(2**31, ())))
    config = lstm.LSTMConfig(bb=16, hb=16, hb_bwd=16, bk=64, resident=resident, resident_bwd=resident)
    w = torch.rand(4 * H, H, generator=g)
    with gpu_dot.fma_chain():
        if direction == "fwd":
            gx, h0 = torch.randn(B, 1, 4 * H, generator=g), torch.rand(B, H, generator=g)
            _, _, act, _ = lstm_fwd(gx, w.t().contiguous(), h0, torch.randn(B, H, generator=g), None, True, config)
            # act less gx: the product, with the roundings of the sum and of the difference (each half
            # a unit of a value about the product's size: gx is N(0, 1), the product about H / 4)
            got, want = act[:, 0] - gx[:, 0], h0.double() @ w.double().t()
        else:
            act, cs = torch.rand(B, 1, 4 * H, generator=g), torch.randn(B, 2, H, generator=g)
            dy, dhn, dcn = (torch.rand(B, 1, H, generator=g), torch.rand(B, H, generator=g),
                            torch.rand(B, H, generator=g))
            dg, got, _ = lstm_bwd(dy, dhn, dcn, w, act, cs, None, config)
            want = dg[:, 0].double() @ w.double()
    error = verify.rel_error(got, want) / 2 ** -24
    assert error < 1.0, f"{direction}: {error:.2f} units of 2^-24 off float64 of the kernel's own operands"


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a GPU with TRITON_INTERPRET=0 (the persistent grid barrier: co-resident programs)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("split", [1, 4])
def test_persistent_barrier_on_gpu(dtype, resident, split):
    # units split over 4 programs (16 with the backward's product split 4 ways, which wait twice a
    # step) of 2 batch groups that wait for each other at every step
    config = lstm.LSTMConfig(bb=32, hb=16, hb_bwd=16, bk=32, resident=resident, resident_bwd=resident,
                             split_bwd=split)
    errors = _errors(cast(_inputs(40, 50, 64, "cuda"), dtype), config)
    assert max(errors) < SPEC.tolerance[dtype], errors


def test_mismatched_inputs_are_refused():
    inputs = SPEC.make_inputs(SMALL, torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="w_ih must be"):
        lstm.lstm(**dict(inputs, w_ih=inputs["w_ih"][:5]))
    with pytest.raises(ValueError, match="resets must be a bool"):
        lstm.lstm(**dict(inputs, resets=torch.zeros(3, 4)))


def test_config_is_recorded():
    inputs = SPEC.make_inputs(SMALL, torch.float32, "cpu", 0)
    record = SPEC.provider("triton").config(inputs)
    assert record["lstm"]["hb"] == 32 and record["lstm"]["persistent"] is True


@pytest.mark.parametrize("split, hb_bwd, H, resident", [(2, 16, 24, False), (4, 32, 20, False), (4, 32, 40, True)])
def test_backward_product_split_over_programs(split, hb_bwd, H, resident):
    # dh = dG W over 4H gate columns, cut in `split` shares of programs that publish partial
    # products and sum each other's (the stepped path: a launch for the partials, one for the gates;
    # at H 20 the last of 4 shares of the 128 padded columns holds none); resets, two batch groups
    config = lstm.LSTMConfig(bb=16, hb=16, hb_bwd=hb_bwd, bk=16, resident_bwd=resident, split_bwd=split)
    errors = _errors(_inputs(17, 5, H), config)
    assert max(errors) < 1e-5, errors


def test_split_that_does_not_divide_the_units_is_refused():
    inputs = SPEC.make_inputs(SMALL, torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="split_bwd"):
        lstm.lstm(**inputs, config=lstm.LSTMConfig(bb=16, hb=16, hb_bwd=16, split_bwd=3))


@pytest.mark.parametrize("B, H", [(1, 256), (32, 512), (64, 2048), (256, 512), (4096, 2048), (8, 20), (3, 8192)])
def test_picked_backward_split(B, H):
    # the GPU pick: every program of every batch group on its own SM (they wait for each other), a
    # split that divides the block of units, shares of 16 gate columns at least; split from H 128 on
    from kcollect.kernels.lstm.config import _split

    groups = -(-B // min(64, max(16, 1 << (B - 1).bit_length())))
    hb_bwd, split = _split(H, groups, 132)
    assert -(-H // hb_bwd) * split * groups <= 132 or split == 1, (hb_bwd, split)
    assert hb_bwd % split == 0 and max(16, 1 << (4 * H - 1).bit_length()) // split >= 16, (hb_bwd, split)
    assert (split > 1) == (H >= 128 and -(-H // hb_bwd) * 2 * groups <= 132), (hb_bwd, split)


def test_fitting_shrinks_only_the_kernel_that_is_over(monkeypatch):
    # the H200's pick at B64 H2048: Triton 3.6 gave its backward (256-row tiles of 128 units) more
    # shared memory than a program may use, and fitting halved both kernels' tiles: the forward, which
    # fitted, took 4.35 ms where it had taken 3.49 (full-grid run at 6bf9a6d). Now only the tiles of
    # the kernel over the limit are halved (the compiler's answer stood in for: what each needs)
    from kcollect.kernels.lstm import sequence

    limit = 232448
    monkeypatch.setattr(sequence, "fit_limit", lambda device: limit)
    monkeypatch.setattr(sequence, "_needs", lambda c, dtype, H, device, limit: (
        c.bk * 1000, limit + 1 if c.bk_bwd > 128 else limit))
    config = lstm.LSTMConfig(bb=64, hb=16, hb_bwd=128, bk=128, bk_bwd=256, warps_bwd=8, split_bwd=8)
    got = sequence.fitted(config, torch.bfloat16, 2048, "cuda", True)
    assert (got.bk, got.bk_bwd, got.split_bwd) == (128, 128, 8), got
    with pytest.raises(ValueError, match="shared memory"):  # a forced config is not changed
        sequence.fitted(config, torch.bfloat16, 2048, "cuda", False)
