"""The LSTM's launch config and its heuristic.

The hidden units are split over programs (one per SM at most, all resident at once: they wait for
each other at every step), the batch rows over groups of programs that never wait for each other.
A forward program owns `hb` units (4*hb gate columns of the recurrent weights), a backward program
`hb_bwd` (its dh slice, 16 at least: the N side of tl.dot). Weights are held in registers across
the whole sequence where the slice is small (`resident`), otherwise read in `bk`-row tiles every
step, from L1 when the slice fits there and from L2 when not (H = 2048: 32 MB of bf16 weights);
the backward's tiles (of the weights and of the next step's dG) and warps may differ (`bk_bwd`,
`warps_bwd`). The backward's product over the 4H gate columns may be split over `split_bwd`
programs of each block of `hb_bwd` units (_split: from H 128 on, on the GPU)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import triton

from .._host.config import arch, gpu_model, tunable
from .._host.device import sm_count

RESIDENT_BYTES = 32 * 1024  # a slice of weights (or of h) a program keeps in registers, 8 warps


@dataclass(frozen=True)
class LSTMConfig:
    bb: int = 64  # batch rows a program (16 at least: the M side of tl.dot; rows past B masked)
    hb: int = 8  # hidden units a forward program owns
    hb_bwd: int = 16  # hidden units a backward program owns
    bk: int = 64  # rows of the weight tile a streamed step reads at a time
    bk_bwd: int = 0  # the same for the backward's weight and dG tiles; 0: bk
    resident: bool = False  # forward weights held in registers across timesteps
    resident_bwd: bool = False
    warps: int = 4
    warps_bwd: int = 0  # the backward's warps; 0: warps
    persistent: bool = True  # one launch for the whole sequence; False: one launch per step
    # backward programs a block of hb_bwd units (a power of two dividing hb_bwd): each multiplies a
    # split_bwd-th of dG's gate columns and finishes the gates of hb_bwd / split_bwd units
    split_bwd: int = 1
    # a step's inputs that no other program writes loaded a step ahead, before the wait (forward, backward)
    prefetch: bool = True
    prefetch_bwd: bool = True


def _units(H: int, groups: int, sms: int, least: int) -> int:
    """The fewest units a program (a power of two >= least) for which a group's programs, times the
    groups, fit on the SMs at one program each."""
    hb = least
    while triton.cdiv(H, hb) * groups > sms and hb < triton.next_power_of_2(H):
        hb *= 2
    return hb


def resident_backward(bb: int, hp: int, hb_bwd: int, split: int) -> bool:
    """Whether a backward program's share of the weights (4 hp / split rows of hb_bwd units) and of
    a step's dG rows fit in registers."""
    rows = 4 * hp // split
    return bb * rows * 2 <= RESIDENT_BYTES and rows * hb_bwd * 2 <= RESIDENT_BYTES


def with_split(c: LSTMConfig, H: int, hb_bwd: int, split: int) -> LSTMConfig:
    """`c` with its backward's product over hb_bwd units split `split` ways (weights resident where
    their share fits)."""
    hp = max(16, triton.next_power_of_2(H))
    return replace(c, hb_bwd=hb_bwd, split_bwd=split, resident_bwd=resident_backward(c.bb, hp, hb_bwd, split))


@tunable
def pick(B: int, H: int, device) -> LSTMConfig:
    """CPU interpreter: one program a batch group (its programs run one after the other and could
    not wait for each other). GPU: batch groups of up to 64 rows, units split so that every program
    has its own SM; weights in registers when a program's slice and its h tile fit in 32 KB each."""
    hp = max(16, triton.next_power_of_2(H))
    if arch(device) == "cpu":
        return LSTMConfig(bb=16, hb=hp, hb_bwd=hp, bk=min(hp, 64), resident=False, resident_bwd=False)
    bb = min(64, max(16, triton.next_power_of_2(B)))
    groups = triton.cdiv(B, bb)
    sms = sm_count(device)
    hb = _units(H, groups, sms, 4)
    fits = bb * hp * 2 <= RESIDENT_BYTES
    resident = fits and 4 * hb * hp * 2 <= RESIDENT_BYTES
    hb_bwd, split = _split(H, groups, sms)
    resident_bwd = resident_backward(bb, hp, hb_bwd, split)
    warps = 8 if resident else 4  # the forward's; the backward's 8 where its weights are resident
    # The next step's inputs loaded ahead: on the H200 (lab/results/lstm_prefetch_h200_06b19c6.txt)
    # the forward 2-13% faster at 4 units a program, 2.7% slower at 16 (H 2048: a [64, 64] tile of
    # inputs more a program, beside streamed weights); the backward 0.5-15% faster but at one shape
    # (B64 T2048 H512, 2.2% slower). Not measured on an H100.
    prefetch = hb < 16
    # On the H200, streamed tiles of 128 rows forward and 256 in 8 warps backward: fewer dependent
    # loads a step (lab/results/lstm_tune_h200.txt; B64 T256 H2048: fwd 4.34 -> 3.78 ms, bwd 13.25 ->
    # 8.86; B32 T60 H512 bwd 0.780 -> 0.696). Not measured on an H100, which keeps 64 rows.
    if gpu_model(device) == "h200":
        return LSTMConfig(bb=bb, hb=hb, hb_bwd=hb_bwd, bk=128, bk_bwd=256, resident=resident,
                          resident_bwd=resident_bwd, warps=warps, warps_bwd=8, split_bwd=split, prefetch=prefetch)
    return LSTMConfig(bb=bb, hb=hb, hb_bwd=hb_bwd, bk=64, resident=resident, resident_bwd=resident_bwd,
                      warps=warps, warps_bwd=8 if resident_bwd else 0, split_bwd=split, prefetch=prefetch)


def _split(H: int, groups: int, sms: int) -> tuple[int, int]:
    """(hb_bwd, split_bwd): from H 128 on, blocks of 16 units split 4 ways (to H 256), 64 units 8
    ways (to H 1024) or 128 units 8 ways, fewer ways where the programs of all batch groups would
    outnumber the SMs; below H 128, or with no split left, _units's blocks unsplit. Unsplit, every
    program read a step's whole dG [64, 4H] (1 MB at H 2048). lab.cells_tune on the H200
    (lab/results/lstm_split_h200_bb0b404.txt, lstm_split_h200_6bf9a6d.txt), bwd in ms, unsplit ->
    split (cuDNN): B64 T256 H2048 9.04 -> 6.44 (6.53); B64 T2048 H512 22.29 -> 13.86 (21.46); B32
    T60 H512 0.708 -> 0.449 (0.526); B64 T256 H512 resets 2.92 -> 1.89; B16 T256 H128 1.337 -> 1.116
    (1.388); B1 T60 H256 resets 0.390 -> 0.310. Not measured on an H100."""
    if H < 128:
        return _units(H, groups, sms, 16), 1
    hb_bwd, split = (16, 4) if H <= 256 else (64, 8) if H <= 1024 else (128, 8)
    while split > 1 and triton.cdiv(H, hb_bwd) * split * groups > sms:
        split //= 2
    if split == 1:
        return _units(H, groups, sms, 16), 1
    return hb_bwd, split
