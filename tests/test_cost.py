"""The cost model (collector/cost.py): its fit, the order in which a measurement takes a term, and
the rows' seconds it is fitted on (a case's shared work spread over its rows)."""
import random
import textwrap

import pytest

from kcollect import cost, schedule
from kcollect.plan import RunConfig, plan
from kcollect.registry import builtin_spec
from kcollect.store import Store
from test_collect import FAST, kc_here


def _row(kernel="k", provider="triton", mode="fwd", gb=0.0, seconds=1.0, device="cuda"):
    return dict(device=device, kernel=kernel, provider=provider, mode=mode, bytes=gb * 1e9, seconds=seconds)


def test_fit_recovers_a_fixed_cost_and_a_cost_per_gb():
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    gbs = [rng.uniform(0.01, 4.0) for _ in range(40)]
    rows = [_row(gb=g, seconds=0.3 + 0.7 * g + rng.gauss(0, 0.01)) for g in gbs]
    fixed, per_gb, n, _ = cost.fit(rows)["cuda|k|triton|fwd"]
    assert n == 40 and fixed == pytest.approx(0.3, abs=0.02) and per_gb == pytest.approx(0.7, abs=0.02), seed


def test_a_measurement_takes_the_most_specific_term_with_enough_rows():
    rows = [_row(mode="fwd", seconds=1.0)] * 3 + [_row(mode="bwd", seconds=3.0)] * 2 + [_row(kernel="j", seconds=9.0)] * 3
    model = cost.Model(cost.fit(rows))
    assert model.seconds("cuda", "k", "triton", "fwd", 0.0) == pytest.approx(1.0)
    # two bwd rows are too few for a term of their own: the kernel's term over both modes
    assert model.seconds("cuda", "k", "triton", "bwd", 0.0) == pytest.approx((3 * 1.0 + 2 * 3.0) / 5)
    # another kernel: the provider's term for the mode, over every kernel
    assert model.seconds("cuda", "new", "triton", "fwd", 0.0) == pytest.approx((3 * 1.0 + 3 * 9.0) / 6)
    assert model.seconds("cpu", "k", "triton", "fwd", 0.0) is None
    assert model.seconds("cuda", "k", "torch", "fwd", 0.0) is None


def test_a_falling_or_negative_line_never_predicts_less_than_zero():
    falling = [_row(gb=g, seconds=s) for g, s in ((0.1, 2.0), (1.0, 1.5), (2.0, 1.0))]
    fixed, per_gb, _, _ = cost.fit(falling)["cuda|k|triton|fwd"]
    assert (fixed, per_gb) == (pytest.approx(1.5), 0.0)
    steep = [_row(gb=g, seconds=s) for g, s in ((1.0, 0.1), (2.0, 2.0), (3.0, 4.0))]
    fixed, per_gb, _, _ = cost.fit(steep)["cuda|k|triton|fwd"]
    assert fixed == 0.0 and per_gb > 0


def test_the_plan_uses_the_committed_terms_and_the_constants_elsewhere(monkeypatch):
    spec = builtin_spec("rms_norm")
    case = plan([spec], RunConfig(kernels=("rms_norm",), grid="quick", device="cuda"))[0]
    gb = spec.bytes_moved(case.shape.dims, case.dtype, "fwd") / 1e9
    monkeypatch.setattr(cost, "committed", lambda: cost.Model({"cuda|rms_norm|triton|fwd": [5.0, 2.0, 9]}))
    assert schedule.unit_cost(case, "fwd", "triton", "cuda") == pytest.approx(5.0 + 2.0 * gb)
    assert schedule.unit_cost(case, "fwd", "torch", "cuda") == pytest.approx(
        schedule.BASE_S["cuda"] + schedule.PER_GB_S["cuda"] * gb)


SLOW_REFERENCE = textwrap.dedent("""
    import time
    import torch
    from kcollect.spec import KernelSpec, Provider, Shape

    def reference(x):
        time.sleep(0.3)  # a case's float64 answers: shared by all of its rows
        return x * 2.0

    SPECS = (KernelSpec(
        name="slow_ref", description="a reference that takes 0.3 s", modes=("fwd",),
        providers=(Provider("torch", lambda x: x * 2.0), Provider("add", lambda x: x + x)), baseline="torch",
        reference=reference, make_inputs=lambda dims, dtype, device, seed: {"x": torch.randn(dims["M"], dims["N"])},
        grad_inputs=("x",), grids={"quick": (Shape.rows(4, 8, "small"), Shape.rows(3, 5, "small"))},
        bytes_moved=lambda dims, dtype, mode: 8, flops=lambda dims, mode: 1.0, bound="memory",
        tolerance={torch.float32: 1e-5}, dtypes=(torch.float32,), bench_dtypes=(torch.float32,)),)
""")


def test_a_case_s_rows_carry_its_shared_work(tmp_path):
    module = tmp_path / "slow_ref.py"
    module.write_text(SLOW_REFERENCE)
    db = tmp_path / "k.duckdb"
    out = kc_here("run", "slow_ref", *FAST[:2], "--kernel-module", str(module), *FAST[4:], "--db", str(db))
    assert out.exit_code == 0, out.stderr
    with Store(db, read_only=True) as s:
        rows = s.query("SELECT shape, seconds FROM results")
    assert len(rows) == 4
    for shape in {r["shape"] for r in rows}:
        # without the spread, each row's seconds would be its few timed calls alone (milliseconds)
        assert sum(r["seconds"] for r in rows if r["shape"] == shape) >= 0.3, rows


def test_a_term_does_not_reach_far_past_the_sizes_it_was_fitted_on():
    """Three tiny shapes with a steep slope (as rtu's cortex_torch fwd rows of an interrupted run):
    their term answers near their sizes; a shape 100x larger takes the provider's wider term."""
    tiny = [_row(gb=g, seconds=s) for g, s in ((0.0002, 2.0), (0.0004, 4.0), (0.0008, 4.5))]
    wide = [_row(kernel="j", gb=g, seconds=1.0 + 0.5 * g) for g in (0.01, 0.5, 1.0)]
    model = cost.Model(cost.fit(tiny + wide))
    near = model.seconds("cuda", "k", "triton", "fwd", 0.001)
    assert near == pytest.approx(cost.fit(tiny)["cuda|k|triton|fwd"][0] + cost.fit(tiny)["cuda|k|triton|fwd"][1] * 0.001)
    far = model.seconds("cuda", "k", "triton", "fwd", 0.4)
    general = cost.fit(tiny + wide)["cuda|*|triton|fwd"]
    assert far == pytest.approx(general[0] + general[1] * 0.4) and far < 10, far
    assert model.seconds("cuda", "k", "triton", "fwd", 100.0) is None  # past every term's reach
