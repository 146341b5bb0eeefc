"""The grid-wide step barrier of a persistent recurrence (lstm)."""
from __future__ import annotations

import triton
import triton.language as tl

# ---------------------------------------------------------------------------------------------
# Grid-wide step barrier. The programs of one recurrence (the hidden units of a batch group, split
# over SMs) each publish their slice of step t's state, `arrive` on the group's counter, and before
# step t + 1 `wait` until all of them have: the counter only grows (program count x steps), so no
# reset is needed between steps. Only safe when all programs of a group are resident at once (the
# launchers check the occupancy); the wait is bounded: after MAX_WAIT polls a program gives up,
# stops waiting for good and reports it (the launcher then writes NaN, which the gate reports),
# rather than hanging the collection. Zeroed int32 counters, one per group. The CPU interpreter
# runs programs one after the other, so there a group is one program (which never waits).

MAX_WAIT = tl.constexpr(1 << 18)


@triton.jit
def arrive(count_ptr):
    """Count this program in, after all of its threads' stores (the barrier before the release
    makes them part of what it publishes; one thread does a scalar atomic)."""
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release")


@triton.jit
def wait(count_ptr, target, ok):
    """Wait until the counter reaches `target`; returns ok and-ed with whether it did. A program
    that already failed (ok False) does not wait again."""
    n = tl.load(count_ptr, volatile=True)
    spins = 0
    limit = tl.where(ok, MAX_WAIT, 0)
    while (n < target) & (spins < limit):
        n = tl.load(count_ptr, volatile=True)
        spins += 1
    tl.atomic_add(count_ptr, 0, sem="acquire")  # what the others published is visible from here on
    tl.debug_barrier()
    return ok & (n >= target)
