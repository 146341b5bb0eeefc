"""The rule that makes a row `ok` or `unstable`: was it measured in steady conditions?

A number taken while the device was disturbed (another process, memory pressure that sends the
allocator into retries, a clock that dropped) looks like any other and would be reported as a
speedup or a regression. So every timed row is measured twice, apart in time:

1. the measurement (T1), when the provider's turn comes;
2. a short re-measurement (R) at the end of its case, after the other providers ran: the same
   device work timed again, the same way (each replay after an L2 flush): a fresh call on fresh
   copies of the inputs captured for it, or the call measured for T1 where it was kept until then
   (memory.KEEP_SHARE, memory.KEEP_ON_GPU). Either way it times new replays: what a disturbance did
   to T1's samples is not in R's.

The row is `ok` when T1 and R agree: the ratio of their medians is within 1 + max(FLOOR[device],
2 x the narrower of their p20-p80 spreads relative to the median, at most 2 x MAX_SPREAD) either
way, and the allocator did not have to retry (free its caches and call cudaMalloc again, which
synchronises the device) during either. The narrower spread, because a disturbance widens the
spread of the measurement it hits: with the wider one, a disturbed measurement vouched for itself.
On four H100s, a 7.4 us RMSNorm forward whose samples a disturbance spread from 23 to 142 us
(p20-p80) was stored `ok` at a median of 69 us beside its recheck's 7.4 us, 9x off; in that grid's
two runs 22 rows were stored `ok` 1.5-9x away from their rechecks. A ratio, not a difference
relative to T1: relative to a disturbed (slow) T1 no recheck ever differs by more than 100%.
And at most MAX_SPREAD of spread counts, so that two disturbed measurements cannot vouch for each
other by being wide alike; on a GPU a measurement spread wider than that agrees with nothing.
Otherwise the provider is measured once more in full (T2), at once (R's graph, replayed again);
the row is `ok` with T2's numbers when T2 agrees with T1 or with R (two of three measurements tell
the same story), and `unstable` with T2's numbers otherwise, the error saying what disagreed. An unstable row has no
rate in results_v and is never shown as a speedup or a regression.

A first measurement of a provider not of ours needs no recheck where the series' last stored time
on the same GPU model vouches for it (`vouched`): T1 undisturbed by its own account (no allocator
retry, a p20-p80 spread within FLOOR) and within VOUCH of that time, measured the same way. That
time is an independent measurement of the same work, as R would be, only taken in an earlier run;
what a disturbance could have added to T1 unseen is less than half of any change a verdict names.
Our own rows, the lines the gate decides, are always rechecked: a point's recheck is part of its
series' noise (verdicts, regress), and without them the verdicts lose small steps on quiet series.
Planted in the H200's real noise with every vouched row's recheck dropped from the history
(lab/vouch_history.py, benchmarks/regress_eval.py --calibration-only, 1000 series, seed 1), 5%
steps were found by the next commit 70.4% of the time against 76.3%, 10% steps 90.8% against
92.4% (lab/results/vouch_eval.txt). `run --recheck-all` rechecks every row.

Rows stored before this rule (the committed history has 75 of them `ok` beside a recheck that
disagrees) are judged by the same rule when they are analysed (`disagrees`, with the one spread a
row keeps: its own), and never count as a time.

The SM clock and the free device memory are recorded with each row as evidence, but do not decide:
a clock sample is a moment (NVML's last period), and a clock that moved without moving the time
did not matter. The times are the evidence that does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the analysis reads this rule without importing torch
    from .timing import Timing

# Smallest relative disagreement that counts as a disturbance. On a GPU, graph replays of one call
# repeat within about 1%, and two runs of one commit within 2% at the median row: 5% is beyond
# what steady conditions give. The CPU interpreter shares its cores with everything else on the
# machine; its rows are never compared with GPU rows and only a gross disturbance is flagged.
FLOOR = {"cuda": 0.05, "cpu": 0.25}
# The widest p20-p80 spread (relative to the median) that widens the tolerance: beyond it the
# measurement was disturbed itself, and two such measurements may agree by accident.
MAX_SPREAD = 0.5
# How close T1 must come to its series' last stored time for that time to vouch for it: half the
# smallest change the verdicts name (regress.DEFAULT_THRESHOLD, 3%)
VOUCH = 0.015


@dataclass(frozen=True)
class Measured:
    timing: Timing
    retries: int = 0  # allocator retries while it was taken

    @property
    def spread(self) -> float:
        t = self.timing
        return (t.p80_ms - t.p20_ms) / t.median_ms if t.median_ms > 0 else float("inf")


def tolerance(spread: float, device: str) -> float:
    """The largest log ratio of two medians that still agree, given the narrower spread."""
    return math.log1p(max(FLOOR.get(device, FLOOR["cpu"]), 2 * min(spread, MAX_SPREAD)))


def steady(spread: float, device: str) -> bool:
    """On a GPU, a measurement whose p20-p80 spread passes MAX_SPREAD was disturbed itself, whatever
    it agrees with: two runs of one commit on an H200 stored rms_norm's 12.8 us forward at 25.4 us,
    its samples spread from 13.4 to 32.3 us and its recheck (28.8 us) as disturbed, and the pair
    failed the A/A gate at +91%. (The interpreter's rows on a shared CPU spread wider in steady
    conditions: there only the ratio decides.)"""
    return device != "cuda" or spread <= MAX_SPREAD


def agree(a: Measured, b: Measured, device: str) -> bool:
    if a.retries or b.retries or not (steady(a.spread, device) and steady(b.spread, device)):
        return False
    ratio = b.timing.median_ms / a.timing.median_ms if a.timing.median_ms > 0 else math.inf
    return ratio > 0 and abs(math.log(ratio)) <= tolerance(min(a.spread, b.spread), device)


def disagrees(row: dict) -> bool:
    """Whether a stored `ok` row and its recheck disagree by the rule above, judged with the row's
    own spread (the recheck's is not stored; the narrower one can only be narrower): such a row was
    disturbed and is no time. Rows without a recheck cannot be judged and pass."""
    return disagree(row.get("median_ms"), row.get("recheck_ms"), row.get("p20_ms"), row.get("p80_ms"),
                    row.get("device_kind"))


def disagree(ms: float | None, recheck: float | None, p20: float | None, p80: float | None,
             device_kind: str | None) -> bool:
    """disagrees() of a row's values (the history's loader asks it of every row with a recheck)."""
    if not ms or not recheck or ms <= 0 or recheck <= 0:
        return False
    spread = (p80 - p20) / ms if p20 is not None and p80 is not None else 0.0
    device = "cuda" if device_kind == "cuda" else "cpu"
    return not steady(spread, device) or abs(math.log(ms / recheck)) > tolerance(spread, device)


@dataclass(frozen=True)
class Verdict:
    status: str  # 'ok' or 'unstable'
    timing: Timing  # the numbers the row stores
    recheck_ms: float  # the median of the measurement that confirmed (or contradicted) it
    error: str | None = None


def vouched(t1: Measured, previous: tuple | None) -> bool:
    """Whether `previous`, the series' last stored time on this GPU model (median, p20, p80, timing
    method: previous.previous_times), vouches for T1 in place of a recheck (see the docstring)."""
    if previous is None or t1.retries:
        return False
    median, _p20, _p80, method = previous
    t = t1.timing
    if method != t.method or not median or median <= 0 or t.median_ms <= 0 or t1.spread > FLOOR["cuda"]:
        return False
    return abs(math.log(t.median_ms / median)) <= math.log1p(VOUCH)


def first_verdict(t1: Measured, r: Measured, device: str) -> Verdict | None:
    """ok when T1 and its recheck agree; None when a full re-measurement must decide."""
    if agree(t1, r, device):
        return Verdict("ok", t1.timing, r.timing.median_ms)
    return None


def second_verdict(t1: Measured, r: Measured, t2: Measured, device: str) -> Verdict:
    for other in (t1, r):
        if agree(t2, other, device):
            return Verdict("ok", t2.timing, other.timing.median_ms)
    why = (f"unstable: {t1.timing.median_ms:.4g} ms, recheck {r.timing.median_ms:.4g} ms, "
           f"re-measured {t2.timing.median_ms:.4g} ms")
    retries = t1.retries + r.retries + t2.retries
    if retries:
        why += f"; the allocator retried {retries} time(s) (memory pressure)"
    return Verdict("unstable", t2.timing, r.timing.median_ms, why)
