"""What the recurrent cells' tests share (test_lstm, test_slstm, test_mlstm, test_axon): one call of a
kernel against the float64 reference with random upstream gradients on every differentiable output,
for a config or a reset mask that the spec's grids do not produce."""
import pytest
import torch

import opcheck
from kcollect import verify


def errors_against_reference(reference, fn, inputs, grads, **kwargs) -> list[float]:
    """Relative errors of fn(**inputs, **kwargs)'s outputs and of the gradients of `grads`, against
    the float64 reference (outputs that carry no gradient in the reference are compared as values)."""
    ref_in = verify.upcast(inputs)
    leaves = [ref_in[n].requires_grad_(True) for n in grads]
    want = verify.as_tuple(reference(**ref_in))
    diff = [w for w in want if w.requires_grad]
    dys = [torch.randn_like(w) for w in diff]
    want = tuple(w.detach() for w in want) + torch.autograd.grad(diff, leaves, dys)
    mine = {k: v.detach().clone().requires_grad_(k in grads) if torch.is_tensor(v) else v for k, v in inputs.items()}
    got = verify.as_tuple(fn(**mine, **kwargs))
    mine_diff = [g for g in got if g.requires_grad]
    got = tuple(g.detach() for g in got) + torch.autograd.grad(mine_diff, [mine[n] for n in grads],
                                                              [d.to(g.dtype) for d, g in zip(dys, mine_diff)])
    return [verify.rel_error(g, w) for g, w in zip(got, want)]


def with_resets(inputs, B, T, device="cpu"):
    """The inputs with a reset mask that covers the edge cases: row 0 at the first step (its initial
    state never counts), row 1 at consecutive steps, the last row at the last step."""
    resets = torch.zeros(B, T, dtype=torch.bool, device=device)
    resets[0, 0] = True
    resets[1 % B, 1:3] = True
    resets[-1, T - 1] = True
    return dict(inputs, resets=resets)


def cast(inputs, dtype):
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}


def reference_cases(small, odd, extra=(), eager_dtypes=(torch.float32, torch.bfloat16)):
    """pytest params (provider, mode, dtype, dims) of the cells' gate tests: ours in fp32 forward
    alone (nothing saved: the inference path) and forward+backward, in bf16 forward and backward, on
    `small` (with resets) and forward+backward on `odd` (masked units); the PyTorch step loop in
    `eager_dtypes`; then `extra` (provider, mode, dtype, dims) cases."""
    f32, bf16 = torch.float32, torch.bfloat16
    cases = [("triton", "fwd", f32, small), ("triton", "fwd+bwd", f32, small), ("triton", "fwd", bf16, small),
             ("triton", "bwd", bf16, small), ("triton", "fwd+bwd", f32, odd),
             *[("eager", "fwd+bwd", d, small) for d in eager_dtypes], *extra]
    return [pytest.param(p, m, d, s, id=f"{p}-{m}-{str(d)[6:]}-{opcheck.shape_id(s)}") for p, m, d, s in cases]
