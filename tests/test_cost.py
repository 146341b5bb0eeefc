"""The cost model (collector/cost.py): its fit, the order in which a measurement takes a term, and
the rows' seconds it is fitted on (a case's shared work spread over its rows)."""
import random
import textwrap
from dataclasses import replace

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


def test_recent_fits_a_kernel_s_terms_on_its_newest_runs_and_the_general_ones_on_all():
    # a provider's first use once took 30 s in its rows (fla's autotuning, since moved into the
    # precompile pass): a kernel's own terms follow its newest run, the provider's terms every run
    old = [dict(_row(kernel="mlstm", provider="fla", seconds=30.0), run_id=f"old{i}", started_at=f"2026-11-2{i}")
           for i in range(3) for _ in range(3)]
    new = [dict(_row(kernel="mlstm", provider="fla", seconds=0.5), run_id="new", started_at="2026-11-29")] * 3
    other = [dict(_row(kernel="rtu", provider="fla", seconds=1.0), run_id="old0", started_at="2026-11-20")] * 3
    rows = random.sample(old + new + other, len(old + new + other))  # the order rows come in does not matter
    recent = cost.Model(cost.fit(rows, recent=cost.RECENT_RUNS))
    assert cost.RECENT_RUNS == 1
    assert recent.seconds("cuda", "mlstm", "fla", "fwd", 0.0) == pytest.approx(0.5)
    assert recent.seconds("cuda", "rtu", "fla", "fwd", 0.0) == pytest.approx(1.0)
    every = (9 * 30.0 + 3 * 0.5 + 3 * 1.0) / 15
    assert recent.seconds("cuda", "new_kernel", "fla", "fwd", 0.0) == pytest.approx(every)
    assert cost.Model(cost.fit(rows)).seconds("cuda", "mlstm", "fla", "fwd", 0.0) == pytest.approx((9 * 30 + 1.5) / 12)


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


def _run(wall, rows_s, precompile_s=0.0, builds=None, procs=0, device="cuda", shared_s=0.0, cases=None):
    return dict(device=device, wall=wall, rows_s=rows_s, precompile_s=precompile_s, builds=builds or {},
                procs=procs, shared_s=shared_s, cases=cases or {})


PASS_S = {"heavy": 2.0, "light": 0.2}  # seconds per build and process, beside a fixed 15 s


def _pass_runs(rng, n=30):
    """Runs whose pass takes 15 s + each kernel's cost per build and process (some runs have no
    pass: warm), and whose start-up is 6 s; one run's start-up 60 s more (its measuring process
    died and started again)."""
    runs = []
    for i in range(n):
        builds = {k: rng.randrange(20, 300) for k in PASS_S if rng.random() < 0.7} or {"light": 50}
        procs, rows_s = rng.choice((2, 4, 8)), rng.uniform(10, 200)
        pass_s = 15 + sum(PASS_S[k] * b for k, b in builds.items()) / procs + rng.gauss(0, 0.1) if i % 4 else 0.0
        runs.append(_run(6 + rows_s + pass_s + rng.gauss(0, 0.1) + (60 if i == 1 else 0), rows_s, pass_s,
                         builds, procs))
    return runs


def test_run_terms_fit_the_start_up_and_each_kernel_s_pass():
    seed = random.randrange(2**31)
    runs = _pass_runs(random.Random(seed)) + [_run(16, 10, device="cpu")]
    terms = cost.fit_runs(runs)
    model = cost.Model({}, terms)
    assert model.startup("cuda") == pytest.approx(6.0, abs=0.5), seed  # the median: the dead process's run left out
    fit = terms["cuda"]["precompile"]
    per = {k: c for k, (c, _) in fit["per"].items()}
    # each kernel its own cost; the light one drawn up toward the common cost (one run's pull): over
    # 20000 seeds heavy's fit spanned 1.67-2.01 and light's 0.195-0.52 (bounds of 1.8 and 0.5 failed 0.3%)
    assert 1.6 < per["heavy"] <= 2.05 and 0.19 < per["light"] < 0.6, (seed, fit)
    assert per["light"] < per["*"] < per["heavy"], (seed, fit)
    assert model.precompile("cuda", {"heavy": 400, "light": 80}, 4) == pytest.approx(
        fit["fixed"] + (per["heavy"] * 400 + per["light"] * 80) / 4), seed
    assert model.precompile("cuda", {"new": 400}, 4) == pytest.approx(fit["fixed"] + per["*"] * 100)  # never built
    assert model.precompile("cuda", {}, 4) == 0.0 and model.precompile("cuda", {"heavy": 400}, 0) == 0.0  # no pass
    assert model.startup("cpu") is None and model.precompile("cpu", {"heavy": 400}, 4) is None  # one run: no term


def test_a_kernel_of_one_run_is_drawn_toward_the_common_cost():
    """Many runs fix the common cost; a kernel that one run built, alone, costs between what that
    run says and the common cost: one run is one point against the prior's one."""
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    runs = [_run(0, 0, 10 + 1.0 * b / 4 + rng.gauss(0, 0.05), {k: b}, 4)
            for k in ("a", "b", "c", "d") for b in [rng.randrange(40, 400) for _ in range(8)]]
    runs.append(_run(0, 0, 10 + 3.0 * 200 / 4, {"rare": 200}, 4))
    per = cost.fit_runs(runs)["cuda"]["precompile"]["per"]
    # the rare kernel pulls the common cost up: over 20000 seeds it spanned 1.03-1.39 (a's 0.91-1.03,
    # rare's 1.95-2.20; a bound of 1.3 failed 0.3%)
    assert per["a"][0] == pytest.approx(1.0, abs=0.1) and 0.95 < per["*"][0] < 1.5, (seed, per)
    assert 1.3 < per["rare"][0] < 2.7 and per["rare"][1] == 1, (seed, per)


def test_a_case_s_share_is_fitted_per_kernel_and_spread_over_its_rows():
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    share = {"attention": 0.7, "softmax": 0.02}
    runs = []
    for _ in range(12):
        cases = {k: rng.randrange(5, 90) for k in share if rng.random() < 0.8} or {"softmax": 9}
        runs.append(_run(0, 0, shared_s=sum(share[k] * n for k, n in cases.items()) + rng.gauss(0, 0.01), cases=cases))
    model = cost.Model({"cuda|attention|triton|fwd": [0.1, 0.0, 9]}, cost.fit_runs(runs))
    fitted = model.share("cuda", "attention")
    # each kernel its own share, drawn toward the other's by the prior's one run: over 40000 seeds
    # attention's least was 0.46 and the least ratio of the two 1.89 (one common share would give 1)
    assert 0.4 < fitted < 0.71 and model.share("cuda", "softmax") < fitted / 1.5, (seed, fitted)
    # a case of 2 measurements carries half its share in each; of 20, a twentieth
    assert model.row("cuda", "attention", "triton", "fwd", 0.0, 2) == pytest.approx(0.1 + fitted / 2)
    assert model.row("cuda", "attention", "triton", "fwd", 0.0, 20) == pytest.approx(0.1 + fitted / 20)
    assert model.row("cuda", "attention", "torch", "fwd", 0.0, 2) is None  # no term: the plan's constants
    assert cost.Model({"cuda|attention|triton|fwd": [0.1, 0.0, 9]}).row("cuda", "attention", "triton", "fwd",
                                                                        0.0, 2) == pytest.approx(0.1)  # no share fitted


def _pair_rows(rng, excess):
    """The same measurements in a warm run and in two cold ones: a cold row of a provider that
    builds takes excess[provider] more; eager rows build nothing and are the same."""
    rows = []
    for shape in range(6):
        for provider, builds in (("triton", True), ("liger", True), ("torch", False)):
            warm = rng.uniform(0.05, 1.0)
            for cold in (False, True, True, None):  # None: a run that left no breakdown
                seconds = warm + (excess[provider] if cold and builds else 0.0) + (5.0 if cold is None else 0.0)
                rows.append(dict(device="cuda", kernel="k", provider=provider, mode="fwd", shape=str(shape),
                                 dtype="float32", bytes=shape * 1e8, seconds=seconds, builds=builds, cold=cold))
    return rows


def test_a_cold_run_s_first_calls_are_fitted_on_pairs_and_left_out_of_the_terms():
    seed = random.randrange(2**31)
    rows = _pair_rows(random.Random(seed), {"triton": 0.05, "liger": 0.0, "torch": 0.3})
    terms = cost.fit_cold(rows)["cuda"]
    assert terms["triton"] == [pytest.approx(0.05), 6] and terms["liger"] == [pytest.approx(0.0), 6], terms
    assert terms["*"] == [pytest.approx(0.025), 12] and "torch" not in terms, terms
    model = cost.Model({}, {"cuda": {"cold": terms}})
    assert model.cold("cuda", {"triton": 10, "liger": 4, "fa4": 2}) == pytest.approx(10 * 0.05 + 2 * 0.025)
    assert model.cold("cuda", {}) == 0.0 and model.cold("cpu", {"triton": 1}) is None
    # the terms are the warm rows' terms: a cold row counts without its excess
    known = [r for r in rows if r["cold"] is not None]
    fitted, _ = cost.fit_all(known, [])
    warm = cost.fit([r for r in known if not r["cold"]])
    assert fitted["cuda|k|triton|fwd"][:2] == pytest.approx(warm["cuda|k|triton|fwd"][:2], abs=1e-5), seed


def _config(**kw):
    return RunConfig(kernels=("gelu",), grid="quick", device="cpu", unavailable=(("compile", "cpu"),), **kw)


def test_the_estimate_of_a_run_reacts_to_its_caches_being_cold_or_warm(tmp_path, monkeypatch):
    """A real cache folder: its manifest, written as the precompile pass writes it, decides the
    precompile part of the estimate and the cold first calls; the measuring part does not depend
    on it."""
    from kcollect import precompile

    monkeypatch.setenv("KCOLLECT_CACHE_DIR", str(tmp_path))
    pass_terms = {"fixed": 20.0, "runs": 3, "per": {"gelu": [0.5, 3], "*": [9.0, 3]}}
    cold_terms = {"triton": [0.25, 9], "*": [0.1, 9]}
    monkeypatch.setattr(cost, "committed", lambda: cost.Model({}, {"cpu": {
        "precompile": pass_terms, "cold": cold_terms, "startup": [1.0, 3]}}))
    spec = builtin_spec("gelu")
    config = _config(precompile=2)
    cases = plan([spec], config)
    everything = list(range(len(cases)))
    builds = 3 * len(cases)  # fwd, bwd and fwd+bwd of triton: compile is not measured on the CPU

    def overhead(config):  # as the run reads it: the caches' manifest, then the estimate
        return schedule.overhead(config, precompile.pending(config, cases, everything)[1], cases)

    cold = overhead(config)
    want = f"{builds} builds the caches lack, in 2 processes"
    assert cold["precompile"] == (pytest.approx(20 + 0.5 * builds / 2), want)  # gelu's own cost, not "*"
    assert cold["first calls"] == (pytest.approx(0.25 * builds), f"{builds} builds just made by the pass")
    assert cold["start-up"][0] == 1.0
    two = schedule.overhead(replace(config, workers=2), precompile.pending(config, cases, everything)[1], cases)
    assert two["first calls"][0] == pytest.approx(0.25 * builds / 2)  # the workers share the measuring
    assert two["precompile"] == cold["precompile"]  # one pass for all of them
    keys, _ = precompile.pending(config, cases, everything)
    precompile._write(precompile.manifest_path(), {k for (i, _, _), k in keys.items() if i != 0})
    part = overhead(config)
    # too few for the pass's processes
    assert part["precompile"] == (0.0, "no pass: 3 builds, made as the run meets them")
    assert part["first calls"] == (0.0, "no pass")
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
