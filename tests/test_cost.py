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


def _run(wall, rows_s, precompile_s=0.0, builds=0, procs=0, device="cuda"):
    return dict(device=device, wall=wall, rows_s=rows_s, precompile_s=precompile_s, builds=builds, procs=procs)


def test_run_terms_fit_the_start_up_and_the_precompile_pass():
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    runs = []
    for _ in range(8):  # start-up 6 s; a pass of 20 s + 0.5 s per build per process, where there was one
        builds, procs, rows_s = rng.randrange(10, 800), rng.choice((2, 4, 8)), rng.uniform(10, 200)
        pass_s = 20 + 0.5 * builds / procs + rng.gauss(0, 0.1) if rng.random() < 0.6 else 0.0
        runs.append(_run(6 + rows_s + pass_s + rng.gauss(0, 0.1), rows_s, pass_s, builds, procs))
    runs += [_run(6 + 30 + 20 + 0.5 * 100 / 4, 30, 20 + 0.5 * 100 / 4, 100, 4), _run(16, 10, device="cpu")]
    model = cost.Model({}, cost.fit_runs(runs))
    assert model.startup("cuda") == pytest.approx(6.0, abs=0.5), seed
    assert model.precompile("cuda", 400, 4) == pytest.approx(20 + 0.5 * 100, abs=2.0), seed
    assert model.precompile("cuda", 0, 4) == 0.0 and model.precompile("cuda", 400, 0) == 0.0  # no pass
    assert model.startup("cpu") is None and model.precompile("cpu", 400, 4) is None  # one run: no term


def _config(**kw):
    return RunConfig(kernels=("gelu",), grid="quick", device="cpu", unavailable=(("compile", "cpu"),), **kw)


def test_the_estimate_of_a_run_reacts_to_its_caches_being_cold_or_warm(tmp_path, monkeypatch):
    """A real cache folder: its manifest, written as the precompile pass writes it, decides the
    precompile part of the estimate; the measuring part does not depend on it."""
    from kcollect import precompile

    monkeypatch.setenv("KCOLLECT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cost, "committed", lambda: cost.Model({}, {"cpu": {"precompile": [20.0, 0.5, 3],
                                                                           "startup": [1.0, 3]}}))
    spec = builtin_spec("gelu")
    config = _config(precompile=2)
    cases = plan([spec], config)
    everything = list(range(len(cases)))
    builds = 3 * len(cases)  # fwd, bwd and fwd+bwd of triton: compile is not measured on the CPU

    def overhead(config):  # as the run reads it: the caches' manifest, then the estimate
        return schedule.overhead(config, precompile.pending(config, cases, everything)[1])

    cold = overhead(config)
    want = f"{builds} builds the caches lack, in 2 processes"
    assert cold["precompile"] == (pytest.approx(20 + 0.5 * builds / 2), want)
    assert cold["start-up"][0] == 1.0
    keys, _ = precompile.pending(config, cases, everything)
    precompile._write(precompile.manifest_path(), {k for (i, _, _), k in keys.items() if i != 0})
    part = overhead(config)["precompile"]
    assert part == (0.0, "no pass: 3 builds, made as the run meets them")  # too few for the pass's processes
    precompile._write(precompile.manifest_path(), set(keys.values()))
    assert overhead(config)["precompile"] == (0.0, "the caches hold every build")
    assert overhead(_config())["precompile"] == (0.0, "no pass")


def test_dry_run_prints_the_estimate_s_parts_from_the_cache_it_would_use(tmp_path, monkeypatch):
    monkeypatch.setenv("KCOLLECT_CACHE_DIR", str(tmp_path / "elsewhere"))
    cache = tmp_path / "cache"
    args = ["run", "gelu", "--device", "cpu", "--dry-run", "--precompile", "2", "--cache-dir", str(cache)]
    out = kc_here(*args, "--db", str(tmp_path / "k.duckdb"))
    assert out.exit_code == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert "; estimated " in line and ": measuring " in line and ", start-up " in line, line
    assert "builds the caches lack, in 2 processes" in line, line
    assert not cache.exists()  # a dry run makes no folder
    bad = kc_here("run", "gelu", "--device", "cpu", "--dry-run", "--precompile", "-1")
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "--precompile '-1': must be auto or a whole number >= 0" in bad.stderr


def test_the_plan_line_adds_the_parts_outside_the_measurements():
    from kcollect.progress import Progress, _clock

    case = plan([builtin_spec("gelu")], _config())[0]
    bare = Progress([case], "cpu")
    parts = {"precompile": (65.0, "9 builds"), "start-up": (None, "not fitted")}
    line = Progress([case], "cpu", overhead=parts).plan_line()
    assert line.startswith(f"{bare.units} measurements; estimated ")
    assert "precompile 1m05s (9 builds), start-up not estimated (not fitted)" in line
    total = line.split("estimated ")[1].split(":")[0]
    assert total == _clock(bare.total_est + 65.0)
