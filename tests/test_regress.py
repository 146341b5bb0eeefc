"""Regression detection (kcollect.regress, kcollect.noise) on small hand-made and seeded series."""
from datetime import datetime, timedelta

import numpy as np
import pytest

from kcollect import noise, regress
from kcollect.regress import Flag, Point, SeriesKey, analyse, detect, detect_all, points_from_rows

T0 = datetime(2025, 1, 1)
QUIET = 0.003  # a prior for the tests' series: 0.3% run-to-run noise, like most real series


def points(levels, spread=0.01, envs=None):
    return [Point(commit=f"c{i}", commit_time=T0 + timedelta(hours=i), median_ms=float(m),
                  p20_ms=float(m) * (1 - spread), p80_ms=float(m) * (1 + spread), runs=1,
                  env=(("torch", envs[i]),) if envs else None)
            for i, m in enumerate(levels)]


def noisy(n, sigma, seed, steps=()):
    """n levels of 1.0 times lognormal noise; steps: (index, factor) applied from index on."""
    level = np.ones(n)
    for at, factor in steps:
        level[at:] *= factor
    return level * np.exp(np.random.default_rng(seed).normal(0, sigma, n))


def row(commit, ms, hour, run, status="ok", kernel="swiglu", gpu="NVIDIA H100", device_kind="cuda", provider="triton",
        shape="M=4096,N=14336", timing="cuda-graph", machine=None, torch="2.11.0"):
    return dict(kernel=kernel, mode="fwd", provider=provider, shape=shape, dtype="bfloat16", status=status,
                git_commit=commit, commit_time=T0 + timedelta(hours=hour),
                started_at=T0 + timedelta(hours=hour, minutes=run), run_id=f"{commit}-{run}",
                median_ms=ms, p20_ms=ms * 0.99, p80_ms=ms * 1.01, gpu_name=gpu, device_kind=device_kind,
                timing=timing, machine=machine, torch=torch, triton="3.6.0", driver=None, cuda=None, peers=None)


@pytest.mark.parametrize("seed", range(5))
def test_planted_step_found_at_its_index_within_two_commits(seed):
    pts = points(noisy(50, 0.003, seed, steps=[(23, 1.10)]))
    (f,) = detect(pts, prior=QUIET)
    assert (f.kind, f.index, f.before_commit, f.after_commit) == ("regression", 23, "c22", "c23")
    assert f.decided_index == 24  # the commit after the step: two points are a step, one is an outlier
    assert f.change == pytest.approx(0.10, abs=0.02) and f.after_ms / f.before_ms - 1 == pytest.approx(f.change)
    assert f.noise_sigmas >= regress.MIN_Z and f.status == "open" and f.cause is None


def test_improvement_and_regression_have_their_signs():
    (down,) = detect(points(noisy(40, 0.003, 1, steps=[(20, 1 / 1.12)])), prior=QUIET)
    assert down.kind == "improvement" and down.change < -0.08 and down.after_ms < down.before_ms
    (up,) = detect(points(noisy(40, 0.003, 1, steps=[(20, 1.12)])), prior=QUIET)
    assert up.kind == "regression" and up.change > 0.08 and up.after_ms > up.before_ms


def test_single_outliers_are_not_steps():
    for at in (5, 20, 37, 38, 39):  # in the middle, and among the last commits
        levels = noisy(40, 0.003, 2)
        levels[at] *= 1.5
        assert detect(points(levels), prior=QUIET) == [], at
    levels = noisy(40, 0.003, 3)
    levels[[10, 30]] *= 1.4  # two outliers far apart are two outliers
    assert detect(points(levels), prior=QUIET) == []


@pytest.mark.parametrize("length", [2, 3])
def test_short_plateau_stays_flagged_as_recovered(length):
    levels = noisy(40, 0.003, 4, steps=[(20, 1.2), (20 + length, 1 / 1.2)])
    flags = detect(points(levels), prior=QUIET)
    assert [(f.kind, f.index) for f in flags] == [("regression", 20), ("improvement", 20 + length)]
    assert flags[0].status == "recovered" and flags[0].recovered_commit == f"c{20 + length}"
    assert flags[0].recovered_index == 20 + length


def test_flags_never_disappear_as_commits_accumulate():
    levels = noisy(45, 0.004, 5, steps=[(8, 1.15), (10, 1 / 1.15), (25, 1.06), (35, 0.9)])
    full = detect(points(levels), prior=QUIET)
    assert len(full) == 4
    for n in range(3, len(levels) + 1):
        prefix = detect(points(levels[:n]), prior=QUIET)
        key = lambda f: (f.kind, f.index, f.noise_sigmas, f.decided_index)  # noqa: E731
        assert [key(f) for f in prefix] == [key(f) for f in full if f.decided_index < n], n


def test_short_histories_lean_on_the_pooled_noise():
    # 3 to 5 points: a 20% step is found with a quiet pool, not with a noisy one
    for levels in ([1.0, 1.2, 1.2], [1.0, 1.0, 1.2, 1.2], [1.0, 1.0, 1.0, 1.2, 1.2]):
        (f,) = detect(points(levels), prior=QUIET)
        assert f.index == len(levels) - 2 and f.kind == "regression"
        assert detect(points(levels), prior=0.10) == []
    assert detect(points([1.0, 1.2])) == []  # two points: nothing persists yet


def test_threshold_respected():
    pts = points(noisy(40, 0.002, 5, steps=[(20, 1.02)]), spread=0.002)  # a clean 2% step
    assert detect(pts, prior=QUIET) == []  # default 3%
    (f,) = detect(pts, threshold=0.01, prior=QUIET)
    assert f.index == 20 and f.kind == "regression"


def test_step_within_the_series_noise_not_flagged():
    # 7% is over the threshold, but the series' points scatter by 6%
    assert detect(points(noisy(40, 0.06, 6, steps=[(20, 1.07)])), prior=QUIET) == []
    assert [f.index for f in detect(points(noisy(40, 0.005, 6, steps=[(20, 1.07)])), prior=QUIET)] == [20]


def test_environment_change_is_its_own_cause():
    levels = noisy(30, 0.003, 7, steps=[(15, 1.2)])
    flags = detect(points(levels, envs=["2.11"] * 15 + ["2.12"] * 15), prior=QUIET)
    assert [(f.index, f.cause) for f in flags] == [(15, "environment: torch 2.11 -> 2.12")]


def test_noise_from_differences_and_reruns():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 0.01 * np.sqrt(2), 2000)  # differences of two measurements of 1% noise
    assert noise.sigma_of_differences(d) == pytest.approx(0.01, rel=0.1)
    d[::10] = 0.5  # outliers and steps barely move it
    assert noise.sigma_of_differences(d) == pytest.approx(0.011, rel=0.15)
    assert noise.combine(None, 0, None).sigma == noise.DEFAULT_SIGMA
    assert noise.combine(0.02, 4, 0.01).sigma == pytest.approx(np.sqrt((4 * 0.02 ** 2 + 4 * 0.01 ** 2) / 8))
    assert noise.combine(0.0, 100, 0.0).sigma == noise.SIGMA_FLOOR
    running = noise.RunningDifferences()
    for x in (0.01, -0.03, 0.02, 0.5):
        running.add(x)
    own, n = running.sigma(without=0.5)
    assert n == 3 and own == pytest.approx(noise.sigma_of_differences([0.01, -0.03, 0.02]))


def test_points_group_repeated_runs_of_one_commit():
    rows = [row("b", 2.0, 2, 0), row("a", 1.0, 1, 0), row("b", 3.0, 2, 1), row("b", 2.2, 2, 2),
            row("c", 0.0, 3, 0, status="failed"), row("c", 9.0, 3, 1, status="unstable"), row("a", 1.1, 1, 1)]
    pts = points_from_rows(rows)
    assert [(p.commit, p.runs) for p in pts] == [("a", 2), ("b", 3)]  # failed and unstable rows carry no time
    b = pts[1]
    assert b.median_ms == pytest.approx(2.2) and b.runs_ms == (2.0, 3.0, 2.2)
    assert b.p20_ms == pytest.approx(2.0) and b.p80_ms == pytest.approx(3.0)  # band holds every run's median
    assert b.commit_time == T0 + timedelta(hours=2) and dict(b.env)["torch"] == "2.11.0"


def test_aa_repeated_runs_raise_no_flag():
    rng = np.random.default_rng(8)
    rows = [row(f"c{i:02d}", float(np.exp(rng.normal(0, 0.005))), i, k) for i in range(40) for k in range(3)]
    assert detect_all(rows) == {}
    rows += [row("c20", ms, 20, 10 + k) for k, ms in enumerate([1.5, 1.6, 1.4, 1.5, 1.7])]
    assert detect_all(rows) == {}


def references(levels_of_commit, n_refs=8, seed=0):
    """Rows of n_refs reference series (torch) following the per-commit factors, each with 0.3% noise."""
    rng = np.random.default_rng(seed)
    return [row(f"c{i:02d}", float(f * np.exp(rng.normal(0, 0.003))), i, 0, provider="torch", shape=f"M={s},N=8")
            for s in range(n_refs) for i, f in enumerate(levels_of_commit)]


def test_sticky_clock_is_the_machine_not_a_regression():
    clock = [1.0] * 12 + [1.12] * 3 + [1.0] * 10  # every series 12% slower on three commits
    ours = [row(f"c{i:02d}", float(f * m), i, 0) for i, (f, m) in enumerate(zip(clock, noisy(25, 0.003, 9)))]
    result = analyse(ours + references(clock))
    key = SeriesKey("swiglu", "fwd", "triton", "M=4096,N=14336", "bfloat16", "NVIDIA H100", None, "cuda-graph")
    assert result[key].flags == []
    assert result[key].drift[13] == pytest.approx(np.log(1.12), abs=0.01)
    assert detect_all(ours) != {}  # without references the same series shows the plateau


def test_analyse_keys_noise_and_what_stays_apart():
    levels = noisy(40, 0.002, 9, steps=[(20, 1.04)])
    rows = [row(f"c{i:02d}", float(m), i, 0) for i, m in enumerate(levels)]
    rows += [row(f"c{i:02d}", float(m), i, 0, kernel="gelu") for i, m in enumerate(levels)]
    # CPU rows of the same series, 100x slower, from commit 10 on: a series of their own
    rows += [row(f"c{i:02d}", 100.0, i, 1, gpu=None, device_kind="cpu", timing="cpu-clock") for i in range(10, 40)]
    # the same kernel timed with CUDA events, 3x slower: another series, not a step
    rows += [row(f"c{i:02d}", 3.0, i, 2, timing="cuda-events") for i in range(30, 40)]
    # the same GPU model in another machine, 10% slower: another series
    rows += [row(f"c{i:02d}", 1.1, i, 3, machine="box-2") for i in range(30, 40)]
    result = analyse(rows, thresholds={"gelu": 0.05})
    key = SeriesKey("swiglu", "fwd", "triton", "M=4096,N=14336", "bfloat16", "NVIDIA H100", None, "cuda-graph")
    assert len(result) == 5
    assert [f.index for f in result[key].flags] == [20]
    assert 0.0015 < result[key].noise.sigma < 0.0035 and result[key].noise.n == 38  # 0.2%, leaning on 0.5%
    assert result[key._replace(kernel="gelu")].flags == []  # 4% < its 5% threshold
    assert all(not r.flags for k, r in result.items() if k != key)
    assert list(detect_all(rows)) == [key, key._replace(kernel="gelu")]
    assert isinstance(detect_all(rows)[key][0], Flag)


def test_every_field_of_a_row_keeps_its_series_apart():
    # A field left out of the key would pool two series (bf16 with fp32 times, one machine with
    # another) into one history, and their difference would read as a regression.
    row = dict(kernel="swiglu", mode="fwd", provider="triton", shape="M=4096,N=14336", dtype="bfloat16",
               device_kind="cuda", gpu_name="NVIDIA H100", machine="rig-1", timing="cuda-graph")
    key = regress.series_key(row)
    assert key == SeriesKey("swiglu", "fwd", "triton", "M=4096,N=14336", "bfloat16", "NVIDIA H100", "rig-1",
                            "cuda-graph")
    others = dict(kernel="geglu", mode="bwd", provider="torch", shape="M=1,N=14336", dtype="float32",
                  gpu_name="NVIDIA H200", machine="rig-2", timing="cuda-events")
    for field, value in others.items():
        assert regress.series_key({**row, field: value}) != key, field
