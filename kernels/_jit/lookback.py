"""Single-pass scans over time segments: decoupled look-back.

A sequence cut into segments is scanned by one program a segment, in one launch. Each program
claims its (chain, segment) from a ticket counter, so the programs a segment waits for have all
started before it: no occupancy rule is needed, any grid works. A program scans its segment from
a zero state and publishes the segment's aggregate (its transition and end); it then looks back
at the segments before it (after it, for an adjoint) for the nearest one whose inclusive state,
the state at its end from the sequence's start, is published, combines that one with the
aggregates in between, publishes its own inclusive state, and scans its segment again from the
state that enters it, writing the outputs. The second read of the segment's inputs follows the
first while they are still in L2, where two launches (all the segments' ends, then the outputs)
read them twice from memory. The first segment publishes its inclusive state after one pass.

Flags: an int32 buffer of 1 + chains x segments, zeroed before the launch: [0] is the ticket
counter, [1 + chain * n_seg + seg] the segment's state (0 nothing, 1 aggregate, 2 inclusive).
A publish is a barrier (so that every thread's stores are part of it) and one thread's release
add; the look-back polls a window of flags with volatile loads, then takes an acquire on each flag
it read and passes a barrier (so that all the threads' later loads come after it). The wait is bounded: after MAX_SPINS polls look_back returns
-1 and the caller's state is NaN, which the gate reports, rather than a hang. The CPU interpreter
runs programs one after the other in ticket order, so there a predecessor is always done."""
from __future__ import annotations

import triton
import triton.language as tl

MAX_SPINS = tl.constexpr(1 << 20)
WINDOW = tl.constexpr(32)  # predecessors polled at once
_FAR = tl.constexpr(1 << 30)


@triton.jit
def claim(FLAGS, n_seg, REVERSE: tl.constexpr):
    """(chain, segment) of this program, in the order programs start: a chain's segments from the
    first (REVERSE: from the last, for an adjoint), chain after chain."""
    t = tl.atomic_add(FLAGS, 1)
    seg = t % n_seg
    if REVERSE:
        seg = n_seg - 1 - seg
    return t // n_seg, seg


@triton.jit
def publish(FLAGS, chain, seg, n_seg, n):
    """Raise the segment's flag by n (1: its aggregate, or its inclusive state after it; 2: both at
    once) after all of the program's stores."""
    tl.debug_barrier()
    tl.atomic_add(FLAGS + 1 + chain * n_seg + seg, n, sem="release")


@triton.jit
def look_back(FLAGS, chain, seg, n_seg, STEP: tl.constexpr):
    """The distance d to the nearest predecessor (segment seg - STEP * d) whose inclusive state is
    published, once every nearer one's aggregate is: the state entering seg is that one's inclusive
    state carried through the aggregates of distances d - 1, ..., 1. -1 after MAX_SPINS polls."""
    k = tl.arange(0, WINDOW)
    flags = FLAGS + 1 + chain * n_seg
    near = 0  # the predecessors at distances 1 .. near have published their aggregates
    found = -1
    spins = 0
    while (found < 0) & (spins < MAX_SPINS):
        d = near + 1 + k
        j = seg - STEP * d
        inside = (j >= 0) & (j < n_seg)
        st = tl.load(flags + j, mask=inside, other=0, volatile=True)
        missing = tl.min(tl.where(st == 0, d, _FAR), axis=0)
        inclusive = tl.min(tl.where(st >= 2, d, _FAR), axis=0)
        if inclusive < missing:
            found = inclusive
        elif missing == _FAR:  # a window of aggregates and no inclusive state: look further back
            near += WINDOW
        spins += 1
    # what the segments read published is visible from here on: an acquire on each flag read
    # (polled with plain loads, which keep the L2's atomic units free for the programs that work)
    upto = tl.where(found > 0, found, 0)
    d = 1 + tl.arange(0, WINDOW)
    while tl.min(d, axis=0) <= upto:
        j = seg - STEP * d
        tl.atomic_add(flags + j, 0, mask=(d <= upto) & (j >= 0) & (j < n_seg), sem="acquire")
        d += WINDOW
    tl.debug_barrier()
    return found
