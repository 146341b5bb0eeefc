"""Rows split over several programs that combine their partial sums (coop kernels): the device side.
The host side, the launch plan that sizes the grid to what the GPU holds, is kernels/_host/coop.py."""
from __future__ import annotations

import triton
import triton.language as tl


# ---------------------------------------------------------------------------------------------
# Wide rows split over programs, finished by the last to arrive. A row of S segments is handled by
# S consecutive programs of a 1-D grid (consecutive so that they are scheduled together): each
# loads its segment once, reduces it, stores its partial and then counts itself in on the row's
# counter; the one that counts last (sees S - 1) combines the S partials and writes the whole
# row, re-reading it from L2, where the others' loads just put it. Nobody waits for anybody (so
# any grid works, also under the CPU interpreter, which runs programs one after the other), and x
# crosses HBM once. (The scheme after this one waits instead, on a grid that the GPU holds whole.)
# Counters: int32, zeroed before the launch.


@triton.jit
def last_to_arrive(count_ptr, S):
    """True in the program that brings the counter at count_ptr to S. One thread does the atomic:
    the barrier before it makes the stores of all the program's threads (its partial,
    add_rms_norm's h) part of what its release publishes; acq_rel makes everything the others
    published visible to the last one; the barrier after it (the CUTLASS semaphore pattern) puts
    all of its threads' later loads after that acquire."""
    tl.debug_barrier()
    last = tl.atomic_add(count_ptr, 1, sem="acq_rel") == S - 1
    tl.debug_barrier()
    return last


# ---------------------------------------------------------------------------------------------
# Wide rows split over co-resident programs that wait for each other. A row of S segments is
# held by S programs, each in its own registers; each publishes its partial of the row's reduction
# and waits until all S have; then every one of them sums the S partials (in the same order: the
# same total in all, deterministic) and finishes its own segment from registers: x crosses HBM once
# and nobody re-reads a row. A partial is published as one 64-bit word, (row + 1) << 32 | the fp32's
# bits, in slot [row, segment] of a zeroed int64 buffer: a naturally aligned 64-bit store is seen
# whole or not at all, so a reader that finds all S tags of its row has the S values, with no
# counter, atomic or fence: one store to publish, one load of the row's S slots per poll.
# Waiting is only safe when all of the grid's programs are resident at once (the launchers size the
# grid to what the GPU holds, see resident_programs) and on a GPU: the CPU interpreter
# runs programs one after the other, so there S must be 1. The wait is bounded: if a group's
# programs cannot all be resident (a GPU whose SMs are shared out, as with MPS limits), after
# MAX_SPINS polls the total is NaN, a wrong answer the correctness gate reports, rather than a hang.
# (A counter polled instead of the S slots, and waiting for a row's total right after publishing
# it, both measured slower on the H200.)

MAX_SPINS = tl.constexpr(1 << 20)


@triton.jit
def coop_program(S, SEG: tl.constexpr):
    """(G, g, seg, cols) of a coop program: rows g, g+G, g+2G, ... of its group (G groups of S
    programs), and the columns [seg*SEG, (seg+1)*SEG) of them it holds."""
    pid = tl.program_id(0)
    seg = pid % S
    return tl.num_programs(0) // S, pid // S, seg, seg * SEG + tl.arange(0, SEG)


@triton.jit
def publish(slot_ptr, row, seg, S, value):
    """Give the row's other programs this program's partial `value` (an fp32 scalar)."""
    tl.store(slot_ptr + row * S + seg, ((row + 1).to(tl.int64) << 32) |
             (value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF))


@triton.jit
def wait_total(slot_ptr, row, S, S_BLOCK: tl.constexpr):
    """The sum of the row's S published partials, once all are there (NaN after MAX_SPINS polls)."""
    j = tl.arange(0, S_BLOCK)
    slots = slot_ptr + row * S + j
    tag = (row + 1).to(tl.int64) << 32
    v = tl.load(slots, mask=j < S, other=tag, volatile=True)  # masked lanes: ready, value 0.0
    ready = tl.min(((v >> 32) == row + 1).to(tl.int32), axis=0)
    spins = 0
    while (ready == 0) & (spins < MAX_SPINS):
        v = tl.load(slots, mask=j < S, other=tag, volatile=True)
        ready = tl.min(((v >> 32) == row + 1).to(tl.int32), axis=0)
        spins += 1
    total = tl.sum(v.to(tl.int32).to(tl.float32, bitcast=True), axis=0)
    return tl.where(ready == 0, float("nan"), total)


@triton.jit
def publish2(slot_ptr, row, seg, S, a, b):
    """publish for two partials: slots [rows, 2, S] (the a's of a row, then its b's)."""
    tag = (row + 1).to(tl.int64) << 32
    tl.store(slot_ptr + row * 2 * S + seg, tag | (a.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF))
    tl.store(slot_ptr + row * 2 * S + S + seg, tag | (b.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF))


@triton.jit
def _poll2(slot_ptr, row, S, S_BLOCK: tl.constexpr):
    """(a's, b's, ready) of a row's two sets of S published partials: the slots as two int64
    [S_BLOCK] vectors, polled in one round trip until all 2S tags are the row's (ready = 1) or
    MAX_SPINS polls have passed (ready = 0). (Polled as one [S, 2] block instead, the totals came
    out wrong at S = 32 on the H200, cause not found.)"""
    j = tl.arange(0, S_BLOCK)
    slots_a = slot_ptr + row * 2 * S + j
    tag = (row + 1).to(tl.int64) << 32
    va = tl.load(slots_a, mask=j < S, other=tag, volatile=True)  # masked lanes: ready, value 0.0
    vb = tl.load(slots_a + S, mask=j < S, other=tag, volatile=True)
    ready = tl.min(((va >> 32) == row + 1).to(tl.int32) * ((vb >> 32) == row + 1).to(tl.int32), axis=0)
    spins = 0
    while (ready == 0) & (spins < MAX_SPINS):
        va = tl.load(slots_a, mask=j < S, other=tag, volatile=True)
        vb = tl.load(slots_a + S, mask=j < S, other=tag, volatile=True)
        ready = tl.min(((va >> 32) == row + 1).to(tl.int32) * ((vb >> 32) == row + 1).to(tl.int32), axis=0)
        spins += 1
    return va.to(tl.int32).to(tl.float32, bitcast=True), vb.to(tl.int32).to(tl.float32, bitcast=True), ready


@triton.jit
def wait_total2(slot_ptr, row, S, S_BLOCK: tl.constexpr):
    """wait_total for two partials (publish2): (sum of the a's, sum of the b's)."""
    a, b, ready = _poll2(slot_ptr, row, S, S_BLOCK)
    return (tl.where(ready == 0, float("nan"), tl.sum(a, axis=0)),
            tl.where(ready == 0, float("nan"), tl.sum(b, axis=0)))


@triton.jit
def wait_slots2(slot_ptr, row, S, S_BLOCK: tl.constexpr):
    """The row's two sets of S published partials themselves (publish2), as two fp32 [S_BLOCK]
    vectors (0.0 past S), for a combination other than a sum; all NaN after MAX_SPINS polls."""
    a, b, ready = _poll2(slot_ptr, row, S, S_BLOCK)
    return tl.where(ready == 0, float("nan"), a), tl.where(ready == 0, float("nan"), b)
