"""Each tolerance is pinned by a planted error: an output off by a few roundings of its dtype must
fail the op's gate, so a tolerance loosened by mistake (rope's bf16 one raised 10x survived every
other test) fails here. The ops are those whose tolerance is a few roundings of each output (their
spec's comment says so); a correct answer rounded once to the dtype must still pass."""
import dataclasses

import pytest
import torch

from kcollect import verify
from kcollect.registry import builtin_spec
from kcollect.spec import Provider

ROUNDED_ONCE = ("gelu", "geglu", "swiglu", "rope", "rms_norm", "add_rms_norm", "softmax")
# A systematic relative error of this many units of the dtype's rounding (torch.finfo.eps: 2^-7 for
# bf16, 2^-10 for fp16) is beyond any of these ops' rounding, and must fail.
PLANTED_EPS = 2.5


def _planted(spec, off: float) -> Provider:
    """The float64 reference's answer off by a factor (1 + off), rounded to the inputs' dtype."""

    def fn(**inputs):
        dtype = next(v.dtype for v in inputs.values() if torch.is_tensor(v) and v.is_floating_point())
        out = verify.as_tuple(spec.reference(**verify.upcast(inputs)))
        got = tuple((o * (1 + off)).to(dtype) if o.is_floating_point() else o for o in out)
        return got if len(got) > 1 else got[0]

    return Provider("planted", fn, builds=False)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=("bf16", "fp16"))
@pytest.mark.parametrize("op", ROUNDED_ONCE)
def test_an_error_of_a_few_roundings_fails_and_one_rounding_passes(op, dtype):
    spec = builtin_spec(op)
    if dtype not in spec.dtypes:
        pytest.skip(f"{op} does not claim {dtype}")
    dims = spec.grids["quick"][0].dims
    off = PLANTED_EPS * torch.finfo(dtype).eps
    for planted, passes in ((_planted(spec, off), False), (_planted(spec, 0.0), True)):
        result = verify.check(dataclasses.replace(spec, providers=(*spec.providers, planted)), planted, dims,
                              dtype, "fwd", seed=0)
        assert result.ok == passes, (f"{op} {dtype} seed 0 {dims}: planted error {off if not passes else 0:.2e} "
                                     f"measured {result.error:.2e} against the tolerance {result.tolerance:.2e}")


def test_a_log_scale_is_held_to_its_absolute_error_below_one():
    """A stabiliser m (KernelSpec.log_scale) scales its state by exp(m): an error d in m is the
    state's relative error e^d - 1 whatever m's size. Near 0 (log sigmoid of a forget gate of 51 after
    a reset at the last step: -5e-23) a 1e-14 error is no error; 0.1 is, near 0 as anywhere; beyond 1
    in size the error stays relative. The mLSTM's and sLSTM's m_T are declared so, and only outputs
    are (a bwd check's values are the gradients)."""
    near0 = torch.tensor([-4.97e-23], dtype=torch.float64)
    assert verify.rel_error(near0 + 5.7e-14, near0) > 1e8  # the plain relative error: a false alarm
    assert verify.rel_error(near0 + 5.7e-14, near0, log_scale=True) < 1e-13
    assert verify.rel_error(near0 + 0.1, near0, log_scale=True) == pytest.approx(0.1)
    big = torch.tensor([40.0, -30.0], dtype=torch.float64)
    assert verify.rel_error(big * 1.01, big, log_scale=True) == pytest.approx(verify.rel_error(big * 1.01, big))
    for op in ("mlstm", "slstm"):
        spec = builtin_spec(op)
        assert spec.log_scale == (3,)
        want = (torch.ones(2), torch.ones(2), torch.ones(2), near0, torch.ones(2))
        got = tuple(w.clone() for w in want)
        got = got[:3] + (near0 + 5.7e-14,) + got[4:]
        assert max(verify.part_errors(spec, got, want, "fwd+bwd")) < 1e-13
        assert verify.part_errors(spec, got, want, "bwd")[3] > 1e8  # position 3 of a bwd check is a gradient
