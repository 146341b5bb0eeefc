"""backbone: every provider of every backbone against the float64 eager modules (window and stream,
bf16 and fp32), a streamed frame against the window it continues, compile's tracing, the cost
model against PyTorch's FLOP counter, and the shape checks. On the GPU
(TRITON_INTERPRET=0 pytest tests/test_backbone.py -k gpu): the agent's shapes through the gate and
through the collector's CUDA-graph capture."""
import os
import random

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import opcheck
from kcollect import timing, verify
from kcollect.kernels.backbone import common as arch, naive as eager
from kcollect.kernels.backbone.spec import SPEC, make_inputs
from kcollect.spec import Unavailable

QUICK = [s.dims for s in SPEC.grid("quick")]
# Triton's interpreter casts fp32 to bf16 by truncation (toward zero; torch and the GPU round to
# nearest): twice the error of each store, all of it one way. Through a streamed frame's layers that
# bias reaches the carried SSM state, whose dt = softplus(w . u + b) cancels at rank 1-2: our bf16
# error there, over 40 seeds, reached 0.037 (jamba) and 0.022 (mamba) where the tolerance is 0.02
# (median 0.008; every other backbone at most 0.0075). Interpreted, our bf16 streamed frames with
# an SSM state get this factor; every other case, and compiled on a GPU (the "gpu" tests), the
# spec's tolerance.
INTERPRETED_BF16_FACTOR = 2.5


def _id(dims):
    return opcheck.shape_id(dims)


def _cases():
    for dims in QUICK:
        yield pytest.param("eager", torch.float32, dims, id=f"eager-fp32-{_id(dims)}")
        for dtype in (torch.bfloat16, torch.float32):
            yield pytest.param("kcollect", dtype, dims, id=f"kcollect-{str(dtype)[6:]}-{_id(dims)}")
    # eager bf16 on two shapes: its bf16 error is what the tolerance was set from (H 512 on the CPU)
    for dims in QUICK[2:4]:
        yield pytest.param("eager", torch.bfloat16, dims, id=f"eager-bf16-{_id(dims)}")


@pytest.mark.parametrize("provider, dtype, dims", _cases())
def test_matches_reference(provider, dtype, dims):
    if provider == "kcollect" and dtype == torch.float32 and "attention" in arch.Arch.of(dims).layout:
        with pytest.raises(Unavailable, match="bfloat16 and float16"):
            opcheck.check_case(SPEC, provider, "fwd", dtype, dims)
        return
    ssm_state = dims["stream"] and "mamba" in arch.Arch.of(dims).layout
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    factor = INTERPRETED_BF16_FACTOR if provider == "kcollect" and dtype == torch.bfloat16 and ssm_state and interpreted else 1.0
    opcheck.check_case(SPEC, provider, "fwd", dtype, dims, factor)


@pytest.mark.parametrize("net", arch.NETS)
def test_streamed_frame_continues_the_window(net):
    # float64 throughout: the frame streamed from the state of T - 1 frames must give what the
    # window of all T frames gives at its last frame, and leave the state the T frames leave
    a = arch.Arch(net, 2, 6, 32, 3, True)
    g = torch.Generator().manual_seed(random.randrange(2**31))
    w = arch.make_weights(a, g)
    frames = torch.randn(a.B, a.T, a.H, generator=g, dtype=torch.float64)
    state = eager.prefill(a, w, frames[:, :-1])
    common = {**w, "net": net, "window": a.T}
    got = verify.as_tuple(eager.eager(**common, **state, x=frames[:, -1:], stream=1))
    window = eager.eager(**common, x=frames, stream=0)
    torch.testing.assert_close(got[0], window[:, -1:], rtol=1e-10, atol=1e-10)
    after = eager.prefill(a, w, frames)
    for name, new in zip(a.state_names(), got[1:]):
        want = after[name][:, :, -1:] if name in ("k_cache", "v_cache") else after[name]
        torch.testing.assert_close(new, want, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("stream", [0, 1])
def test_compile_traces_every_backbone(stream):
    # dynamo's tracing of the blocks (graph breaks, guards, the unrolled scan) with its "eager"
    # backend: inductor's CPU code generation would take minutes and is PyTorch's, not ours
    torch._dynamo.reset()
    fn = eager.compiled(backend="eager")
    for dims in QUICK:
        if dims["stream"] == stream:
            inputs = make_inputs(dims, torch.float32, "cpu", random.randrange(2**31))
            _, want = verify.reference_answers(SPEC, inputs, "fwd", 0)
            got = verify.build_call(SPEC, fn, verify.clone_inputs(inputs), "fwd", ())()
            assert verify.max_error(got, want) <= 1e-5, dims
    torch._dynamo.reset()


@pytest.mark.parametrize("net", arch.NETS)
@pytest.mark.parametrize("stream", [0, 1])
def test_flops_match_pytorchs_flop_counter(net, stream):
    # the eager modules' matmuls as PyTorch counts them (cuDNN-free LSTM and math SDPA on the
    # CPU, so that both decompose into counted matmuls), less the conv (elementwise in the model)
    # and the masked half of the causal scores (which math SDPA computes and the model does not)
    dims = {"net": net, "B": 2, "T": 5, "H": 32, "L": 2, "stream": stream}
    inputs = make_inputs(dims, torch.float32, "cpu", 0)
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False), sdpa_kernel(SDPBackend.MATH), \
            FlopCounterMode(display=False) as counter:
        eager.eager(**inputs)
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    a = arch.Arch.of(dims)
    masked = 0 if stream else a.count("attention") * a.B * 4 * a.H * (a.T * a.T - a.T * (a.T + 1) // 2)
    assert counter.get_total_flops() - counts.get("aten.convolution", 0) == SPEC.flops(dims, "fwd") + masked


def test_layouts_and_states():
    a = arch.Arch("jamba", 3, 60, 512, 4, True)
    assert a.layout == ("mamba", "mamba", "attention", "mamba")
    assert [s[1:] for s in a.slots()] == [(0, 0), (1, 1), (0, 2), (2, 3)]
    assert arch.state_shapes(a) == {"conv_state": (3, 3, 1024, 3), "ssm_state": (3, 3, 1024, 16),
                                    "k_cache": (1, 3, 59, 8, 64), "v_cache": (1, 3, 59, 8, 64)}
    assert a.state_names() == ("conv_state", "ssm_state", "k_cache", "v_cache")
    assert arch.Arch("mlp", 1, 60, 256, 2, False).layout == ("none", "none")
    assert "norm_mix" not in arch.weight_shapes(arch.Arch("mlp", 1, 60, 256, 2, False))


def test_grid_shapes_are_accepted_and_bad_ones_refused():
    opcheck.check_grids_accepted(SPEC)
    assert len(SPEC.grid("full")) == 30
    base = {"net": "jamba", "B": 1, "T": 60, "H": 512, "L": 4, "stream": 0}
    for change, message in [({"net": "gru"}, "one of mlp, lstm"), ({"L": 1}, "jamba needs L >= 2"),
                            ({"T": 1, "stream": 1}, "needs T >= 2"), ({"H": 200}, "multiple of 64"),
                            ({"B": 0}, "positive")]:
        assert message in SPEC.check_shape({**base, **change}), change
    assert "missing stream" in SPEC.check_shape({k: v for k, v in base.items() if k != "stream"})


def test_config_says_what_ran():
    dims = {"net": "jamba", "B": 1, "T": 5, "H": 32, "L": 2, "stream": 0}
    record = SPEC.provider("kcollect").config(make_inputs(dims, torch.bfloat16, "cpu", 0))
    assert set(record) == {"attention", "selective_scan"} and "block_m" in record["attention"]
    assert "chunk" in record["selective_scan"]
    streamed = SPEC.provider("kcollect").config(make_inputs({**dims, "stream": 1}, torch.bfloat16, "cpu", 0))
    assert not streamed  # a streamed frame runs the one-step kernels, which have no config
    lstm = SPEC.provider("kcollect").config(make_inputs({**dims, "net": "lstm"}, torch.bfloat16, "cpu", 0))
    assert set(lstm) == {"lstm"}


# -- on a GPU ----------------------------------------------------------------------------------
ON_GPU = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                            reason="needs a GPU with TRITON_INTERPRET=0")


@ON_GPU
@pytest.mark.parametrize("provider", ["eager", "kcollect"])
@pytest.mark.parametrize("dims", [s.dims for s in SPEC.grid("full") if s.dims["B"] == 32], ids=_id)
def test_gpu_agent_shapes_pass_and_capture(provider, dims):
    # the gate at the agent's batched shapes, then the collector's own timing path: one call
    # captured into a CUDA graph and replayed (the method every row is timed by). compile is left
    # to `kcollect run backbone --full`: its builds take minutes
    inputs = make_inputs(dims, torch.bfloat16, "cuda", random.randrange(2**31))
    _, want = verify.reference_answers(SPEC, inputs, "fwd", 0)
    call = verify.build_call(SPEC, SPEC.provider(provider).fn, verify.clone_inputs(inputs), "fwd", ())
    err = verify.max_error(call(), want)
    print(f"{provider} {_id(dims)}: error {err:.2e}")
    assert err <= SPEC.tolerance[torch.bfloat16]
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    t = timing.time_cuda_graph(call, timing.Budget(warmup_ms=1, rep_ms=5, min_reps=3), flush)
    assert t.method == "cuda-graph" and t.median_ms > 0
