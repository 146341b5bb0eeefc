"""Regression detection (kcollect.regress) on small hand-made and seeded series."""
from datetime import datetime, timedelta

import numpy as np
import pytest

from kcollect.regress import Flag, Point, detect, detect_all, points_from_rows

T0 = datetime(2025, 1, 1)


def points(levels, spread=0.01):
    return [Point(commit=f"c{i}", commit_time=T0 + timedelta(hours=i), median_ms=float(m),
                  p20_ms=float(m) * (1 - spread), p80_ms=float(m) * (1 + spread), runs=1)
            for i, m in enumerate(levels)]


def noisy(n, sigma, seed, steps=()):
    """n levels of 1.0 times lognormal noise; steps: (index, factor) applied from index on."""
    level = np.ones(n)
    for at, factor in steps:
        level[at:] *= factor
    return level * np.exp(np.random.default_rng(seed).normal(0, sigma, n))


def row(commit, ms, hour, run, status="ok", kernel="swiglu", gpu="NVIDIA H100", device_kind="cuda", spread=0.01):
    return dict(kernel=kernel, mode="fwd", provider="triton", shape="4096x14336", dtype="bf16", status=status,
                git_commit=commit, commit_time=T0 + timedelta(hours=hour), started_at=T0 + timedelta(hours=hour, minutes=run),
                run_id=f"{commit}-{run}", median_ms=ms if status == "ok" else None,
                p20_ms=ms * (1 - spread) if status == "ok" else None, p80_ms=ms * (1 + spread) if status == "ok" else None,
                gpu_name=gpu, device_kind=device_kind)


@pytest.mark.parametrize("seed", range(5))
def test_planted_step_found_at_its_index(seed):
    pts = points(noisy(50, 0.01, seed, steps=[(23, 1.10)]))
    flags = detect(pts)
    assert len(flags) == 1, flags
    f = flags[0]
    assert (f.kind, f.index, f.before_commit, f.after_commit) == ("regression", 23, "c22", "c23")
    assert f.change == pytest.approx(0.10, abs=0.02)
    assert f.after_ms / f.before_ms - 1 == pytest.approx(f.change)
    assert f.noise_sigmas >= 3.5


def test_improvement_and_regression_have_their_signs():
    (down,) = detect(points(noisy(40, 0.01, 1, steps=[(20, 1 / 1.12)])))
    assert down.kind == "improvement" and down.change < -0.08 and down.after_ms < down.before_ms
    (up,) = detect(points(noisy(40, 0.01, 1, steps=[(20, 1.12)])))
    assert up.kind == "regression" and up.change > 0.08 and up.after_ms > up.before_ms


def test_single_outliers_are_not_steps():
    for at in (5, 20, 37, 38, 39):  # in the middle, and among the last commits
        levels = noisy(40, 0.01, 2)
        levels[at] *= 1.5
        assert detect(points(levels)) == [], at
    levels = noisy(40, 0.01, 3)
    levels[[10, 30]] *= 1.4  # two outliers far apart are two outliers
    assert detect(points(levels)) == []


def test_regression_and_its_fix_both_found():
    flags = detect(points(noisy(45, 0.01, 4, steps=[(20, 1.2), (26, 1 / 1.2)])))
    assert [(f.kind, f.index) for f in flags] == [("regression", 20), ("improvement", 26)]


def test_threshold_respected():
    pts = points(noisy(40, 0.002, 5, steps=[(20, 1.04)]), spread=0.002)  # a clean 4% step
    assert detect(pts) == []  # default 5%
    (f,) = detect(pts, threshold=0.03)
    assert f.index == 20 and f.kind == "regression"
    assert detect(pts, threshold=0.10) == []


def test_step_within_the_series_noise_not_flagged():
    # 7% is over the threshold, but the series' points scatter by 6%: not distinguishable from noise.
    pts = points(noisy(40, 0.06, 6, steps=[(20, 1.07)]))
    assert detect(pts) == []
    # the same step on a quiet series is found
    assert [f.index for f in detect(points(noisy(40, 0.005, 6, steps=[(20, 1.07)])))] == [20]


def test_step_inside_the_p20_p80_band_not_flagged():
    # medians scatter little, but each run's own spread is +-10%: a 6% move stays inside the band
    pts = points(noisy(40, 0.002, 7, steps=[(20, 1.06)]), spread=0.10)
    assert detect(pts) == []
    assert len(detect(points(noisy(40, 0.002, 7, steps=[(20, 1.06)]), spread=0.01))) == 1


def test_short_and_flat_series():
    assert detect(points([1.0, 1.0, 2.0, 2.0, 2.0])) == []  # too short for a step with persistence
    assert detect(points([1.0] * 30)) == []
    (f,) = detect(points([1.0] * 15 + [1.2] * 15))  # identical values: no noise, the step is real
    assert f.index == 15 and f.change == pytest.approx(0.2) and np.isfinite(f.noise_sigmas)


def test_points_group_repeated_runs_of_one_commit():
    rows = [row("b", 2.0, 2, 0), row("a", 1.0, 1, 0), row("b", 3.0, 2, 1), row("b", 2.2, 2, 2),
            row("c", 0.0, 3, 0, status="failed"), row("a", 1.1, 1, 1)]
    pts = points_from_rows(rows)
    assert [(p.commit, p.runs) for p in pts] == [("a", 2), ("b", 3)]  # commit order; failed rows carry no time
    b = pts[1]
    assert b.median_ms == pytest.approx(2.2)  # median of the runs' medians
    assert b.p20_ms == pytest.approx(2.0) and b.p80_ms == pytest.approx(3.0)  # band holds every run's median
    assert b.commit_time == T0 + timedelta(hours=2)


def test_points_ordered_by_commit_time_then_start():
    rows = [row("late", 1.0, 5, 0), row("early", 1.0, 1, 0)]
    rows.append({**row("same-time", 1.0, 5, 0), "started_at": T0})  # same commit time, measured earlier
    assert [p.commit for p in points_from_rows(rows)] == ["early", "same-time", "late"]


def test_aa_repeated_runs_raise_no_flag():
    # 40 commits, each measured three times with the runs scattered by 4%: grouped, nothing moves.
    rng = np.random.default_rng(8)
    rows = [row(f"c{i:02d}", float(np.exp(rng.normal(0, 0.04))), i, k) for i in range(40) for k in range(3)]
    assert detect_all(rows) == {}
    # and one commit rerun five times, wildly, is still one point
    rows += [row("c20", ms, 20, 10 + k) for k, ms in enumerate([1.5, 1.6, 1.4, 1.5, 1.7])]
    assert detect_all(rows) == {}


def test_detect_all_keys_thresholds_and_cpu_kept_apart():
    levels = noisy(40, 0.002, 9, steps=[(20, 1.04)])
    rows = [row(f"c{i:02d}", float(m), i, 0) for i, m in enumerate(levels)]
    rows += [row(f"c{i:02d}", float(m), i, 0, kernel="gelu") for i, m in enumerate(levels)]
    # CPU rows of the same series, 100x slower, only from commit 10 on: mixed with the GPU rows they
    # would be a huge step; kept apart they are a flat series of their own.
    rows += [row(f"c{i:02d}", 100.0, i, 1, gpu=None, device_kind="cpu") for i in range(10, 40)]
    assert detect_all(rows) == {}
    flags = detect_all(rows, thresholds={"gelu": 0.03})
    key = ("gelu", "fwd", "triton", "4096x14336", "bf16", "NVIDIA H100")
    assert list(flags) == [key]
    assert isinstance(flags[key][0], Flag) and flags[key][0].index == 20
    rows += [row(f"c{i:02d}", 100.0 * (1.2 if i >= 25 else 1.0), i, 2, gpu=None, device_kind="cpu",
                 kernel="rms_norm") for i in range(10, 40)]
    assert ("rms_norm", "fwd", "triton", "4096x14336", "bf16", "cpu") in detect_all(rows)
