"""The one-step kernels of streamed inference (a frame from a carried state) against float64 maths
on the CPU interpreter: the selective scan's state update, the depthwise conv window and the LSTM
cell. Channels not a multiple of the block (masked), N and window widths not powers of two,
inputs that are views into wider rows (as a model's chunks and splits give them), fp32 and bf16;
in fp32 the error is held to the PyTorch step's own error (pooled over several draws), and the
carried state is left unchanged.
On a GPU (TRITON_INTERPRET=0) the same tests run compiled on CUDA, with `gpu` in their ids."""
import os
import random

import pytest
import torch
import torch.nn.functional as F

from kcollect import verify
from kcollect.kernels.attention.step import attention_decode
from kcollect.kernels.backbone.common import causal_conv, scan
from kcollect.kernels.conv1d.step import causal_conv_step
from kcollect.kernels.lstm.naive import step_loop
from kcollect.kernels.lstm.step import lstm_step
from kcollect.kernels.selective_scan.step import selective_state_update

F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64
BOUND = {F32: 1e-5, BF16: 1e-2}  # bf16: the output's own rounding (2^-8) with room for the sums


ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICES = [pytest.param("cuda", id="gpu")] if ON_GPU else [pytest.param("cpu", id="cpu")]
device = pytest.mark.parametrize("dev", DEVICES)


def gen():
    return torch.Generator().manual_seed(random.randrange(2**31))


DRAWS = 8  # independent problems a test: fp32's comparison with eager is over their pooled error


def within(draws, dtype):
    """draws: per problem, a list of (got, want, eager) outputs. Each output within the dtype's bound;
    in fp32 also as accurate as the PyTorch step, their errors summed over the draws (a floor of
    1e-7 a draw for when both are exact). One draw of a few outputs is not enough: at b 1, d 16 the
    state update's mean error is eager's (1.10e-7 and 1.08e-7 over 300 draws), yet where eager's
    roundings happen to cancel, ours was up to 7.9x eager's (2 of those 300 draws failed a 2x)."""
    ours = eager_sum = 0.0
    for outputs in draws:
        for got, want, eager in outputs:
            err = verify.rel_error(got, want)
            assert err <= BOUND[dtype], f"error {err:.3g} > {BOUND[dtype]:.3g}"
            ours, eager_sum = ours + err, eager_sum + verify.rel_error(eager, want)
    if dtype == F32:
        assert ours <= 2 * eager_sum + 1e-7 * len(draws), (ours, eager_sum)


@device
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("b, d, n", [(3, 37, 5), (1, 16, 16), (2, 300, 16)])
def test_selective_state_update(dev, dtype, b, d, n):
    within([_state_update_draw(dev, dtype, b, d, n) for _ in range(DRAWS)], dtype)


def _state_update_draw(dev, dtype, b, d, n):
    g = gen()
    wide = torch.randn(b, 3 * d + 7, generator=g).to(dev, dtype)  # x, delta, z as column slices of one row
    x, delta, z = wide[:, :d], wide[:, d:2 * d] - 1.0, wide[:, 2 * d + 7:]
    bc = torch.randn(b, 2 * n + 3, generator=g).to(dev, dtype)
    Bm, Cm = bc[:, 3:3 + n], bc[:, 3 + n:]
    A_log = (torch.rand(d, n, generator=g) * 2 - 1).to(dev, dtype)
    D = torch.randn(d, generator=g).to(dev, dtype)
    h = torch.randn(b, d, n, generator=g).to(dev)
    h_before = h.clone()

    def pytorch(work):
        A = -torch.exp(A_log.to(work))
        y, hn = scan(x[:, None].to(work), F.softplus(delta[:, None].to(work)), A, Bm[:, None].to(work),
                     Cm[:, None].to(work), D.to(work), h.to(work))
        return (y[:, 0] * F.silu(z.to(work))), hn

    want_y, want_h = pytorch(F64)
    eager_y, eager_h = pytorch(F32)
    y, hn = selective_state_update(h, x, delta, A_log, Bm, Cm, D, z, A_log=True)
    assert y.dtype == dtype and hn.dtype == F32 and torch.equal(h, h_before)
    within([[(hn.double(), want_h, eager_h.double())]], F32)  # the state is fp32 whatever the inputs
    y2, _ = selective_state_update(h, x, delta, -torch.exp(A_log.float()), Bm, Cm, D, z)
    assert verify.rel_error(y2.double(), y.double()) <= BOUND[dtype]
    return [(y.double(), want_y, eager_y.to(dtype).double())]


@device
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("b, d, k", [(3, 37, 4), (1, 20, 2), (2, 130, 3)])
def test_causal_conv_step(dev, dtype, b, d, k):
    within([_conv_step_draw(dev, dtype, b, d, k) for _ in range(DRAWS)], dtype)


def _conv_step_draw(dev, dtype, b, d, k):
    g = gen()
    xz = torch.randn(b, 2 * d, generator=g).to(dev, dtype)
    x = xz[:, :d]  # a chunk of the in-projection, as Mamba takes it
    state = torch.randn(b, d, k - 1, generator=g).to(dev, dtype)
    w, bias = torch.randn(d, k, generator=g).to(dev, dtype), torch.randn(d, generator=g).to(dev, dtype)
    before = state.clone()

    def pytorch(work):
        out, window = causal_conv(x[:, None].to(work), state.to(work), w.to(work), bias.to(work))
        return out[:, 0], window

    want, want_state = pytorch(F64)
    eager, _ = pytorch(F32)
    y, sn = causal_conv_step(state, x, w, bias)
    assert y.dtype == dtype and sn.dtype == dtype and torch.equal(state, before)
    assert torch.equal(sn.double(), want_state)  # the window moves: exact
    return [(y.double(), want, eager.to(dtype).double())]


@device
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("b, i, h", [(3, 24, 20), (1, 64, 64), (5, 7, 130)])
def test_lstm_step(dev, dtype, b, i, h):
    within([_lstm_step_draw(dev, dtype, b, i, h) for _ in range(DRAWS)], dtype)


def _lstm_step_draw(dev, dtype, b, i, h):
    g = gen()
    x, h0, c0 = (torch.randn(*s, generator=g).to(dev, dtype) for s in ((b, i), (b, h), (b, h)))
    w_ih, w_hh = (torch.randn(4 * h, n, generator=g).div(n ** 0.5).to(dev, dtype) for n in (i, h))
    bias = torch.randn(4 * h, generator=g).to(dev, dtype)

    def pytorch(work):
        _, hn, cn = step_loop(*(t.to(work) for t in (x[:, None], h0, c0, w_ih, w_hh, bias)))
        return hn, cn

    want_h, want_c = pytorch(F64)
    eager_h, eager_c = pytorch(F32)
    hn, cn = lstm_step(x, h0, c0, w_ih, w_hh, bias)
    assert hn.dtype == dtype and cn.dtype == dtype
    return [(hn.double(), want_h, eager_h.to(dtype).double()), (cn.double(), want_c, eager_c.to(dtype).double())]


def test_mismatched_inputs_are_refused():
    h = torch.randn(2, 8, 4)
    with pytest.raises(ValueError, match="x must be"):
        selective_state_update(h, torch.randn(2, 9), torch.randn(2, 8), torch.randn(8, 4), torch.randn(2, 4),
                               torch.randn(2, 4), torch.randn(8), torch.randn(2, 8))
    with pytest.raises(ValueError, match="weight"):
        causal_conv_step(torch.randn(2, 8, 3), torch.randn(2, 8), torch.randn(8, 3), torch.randn(8))
    with pytest.raises(ValueError, match="lstm_step"):
        lstm_step(torch.randn(2, 5), torch.randn(2, 4), torch.randn(2, 4), torch.randn(16, 5), torch.randn(16, 5),
                  torch.randn(16))


def _decode_reference(q, kc, vc, k, v, window):
    """float64 softmax over the visible cache keys and the new key."""
    B, Hq, D = q.shape
    G = Hq // kc.shape[2]
    keys = torch.cat([kc, k[:, None]], 1).double().repeat_interleave(G, dim=2)  # [B, S + 1, Hq, D]
    values = torch.cat([vc, v[:, None]], 1).double().repeat_interleave(G, dim=2)
    if window:
        keys, values = keys[:, -window:], values[:, -window:]
    s = torch.einsum("bhd,bjhd->bhj", q.double(), keys) * D ** -0.5
    return torch.einsum("bhj,bjhd->bhd", s.softmax(-1), values)


@device
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("b, s, hkv, g, d, window", [
    (3, 37, 2, 3, 40, 0),  # GQA with 3 query heads a kv head, head dim not a power of two
    (2, 70, 1, 1, 64, 9),  # a window: the new key and the last 8 of the cache
    (1, 0, 2, 2, 16, 0),  # an empty cache: the new key alone
    (4, 59, 8, 1, 64, 60),  # the agent's attention layer: the whole window
])
def test_attention_decode(dev, dtype, b, s, hkv, g, d, window):
    gen_ = gen()
    qkv = torch.randn(b, 3, hkv * g, d, generator=gen_).to(dev, dtype)  # q, k, v as views of one projection
    q, k, v = qkv[:, 0], qkv[:, 1, :hkv], qkv[:, 2, :hkv]
    kc, vc = (torch.randn(b, s, hkv, d, generator=gen_).to(dev, dtype) for _ in range(2))
    want = _decode_reference(q, kc, vc, k, v, window)
    got = attention_decode(q, kc, vc, k, v, window=window)
    assert got.dtype == dtype and got.shape == q.shape
    assert verify.rel_error(got.double(), want) <= 8e-3  # the output's rounding (bf16: 2^-8)
    if window and s >= window:  # keys outside the window are not read
        kc2 = kc.clone()
        kc2[:, : s - window + 1] = float("nan")
        assert torch.equal(attention_decode(q, kc2, vc, k, v, window=window), got)
