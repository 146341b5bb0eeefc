"""Attention's tuned configs: blocks, warps and stages of the forward and of the two backward
kernels, and the Hopper paths (TMA tensor descriptors, a persistent grid)
as switches that stay off until a measurement says otherwise.

The sm90 entries are lab/attention_tune.py's winners on the H100 (bf16, torch 2.11, Triton 3.6;
the tune's output is in lab/results/attention_tune_h100.txt): forward at D 128, 64x64 tiles of 4
warps beat 128x64 of 8 by 9-15% (causal 4096: 452 against 415 TFLOP/s); at D 64, 128x64 of 8 warps
(380 against 295 for 128x128); backward 64x64 tiles of 4 warps in both kernels (causal 4096: 365
against 298), and for GQA 32-row query steps with TMA (338 against 328 without). Persistent grids
lost everywhere. tl.range(warp_specialize=True) is not offered: Triton 3.6 specialises warps on
Blackwell only, on sm_90 the kernel compiles as without it, and the scores of the next key block
issued before this block's softmax were 38-54% slower, as Triton waits for that dot at once
(lab/results/attention_ahead_ws_h200.txt).
On the H200 the same tune (lab/results/attention_tune_h200.txt, with a third stage count in the
search) keeps the forward's picks, but its backward wants deeper pipelines: dq programs of 128
query rows in 8 warps with 3 stages (causal 16384: 6.52 against 6.90 ms; causal 4096: 1.83
against 1.88), for GQA 3 stages in the dk/dv kernel without TMA (3.90 ms; 2 stages: 4.17), at D 64
3 stages in both kernels. Those q_stages=3 candidates were not in the H100's search, so the H100
keeps its own measured picks. The deeper dq pipeline pays only where a causal query sees many
keys: with a window of 1024 it took 1.22 ms against 1.06 for the H100's pick, causal at S 1024
0.690 against 0.685, and at S 512 0.487 against 0.464 for 64-row dq programs of 4 warps after
32-row dk/dv steps (lab/results/attention_tune_h200_short.txt); not causal, S 512 kept the deep
pick (0.617 ms against 0.689 with the short one, full-grid runs). At D 64 the causal shapes want 2
dk/dv stages (S 8192: 3.97 against 4.30 ms; S 512: 0.492 against 0.525), non-causal S 1024 3.
The CPU entries are small so that the interpreter's tests cross several blocks on tiny shapes.
Both picks are @tunable: `kcollect.kernels._host.config.forced(FwdConfig(...))` overrides them (lab/)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from .._host.config import arch, gpu_model, tunable


@dataclass(frozen=True)
class FwdConfig:
    block_m: int = 128  # query rows a program
    block_n: int = 64  # key rows a step
    warps: int = 8
    stages: int = 3
    # loads and stores through device-side tensor descriptors (sm_90+, not in the interpreter):
    # bulk copies that zero-fill past the sequence end instead of masked pointer loads
    tma: bool = False
    # a grid of `persistent` programs per SM striding over the tiles (heaviest causal tiles first);
    # 0: one program a tile
    persistent: int = 0
    # the Gluon kernel of hopper.py (FlashAttention-3's overlap of the softmax with the matmuls) where
    # the inputs are in its scope (hopper.refuses); elsewhere the Triton kernel with these tiles. Its
    # programs are one warpgroup of 64 query rows, or (block_m 128) pingpong.py's two: `warps` unread
    gluon: bool = False


@dataclass(frozen=True)
class BwdConfig:
    # dk/dv kernel: kv_n key rows a program (accumulated over every query head of its group),
    # kv_m query rows a step
    kv_n: int = 128
    kv_m: int = 64
    kv_warps: int = 8
    kv_stages: int = 2
    # dq kernel: q_m query rows a program, q_n key rows a step
    q_m: int = 128
    q_n: int = 64
    q_warps: int = 8
    q_stages: int = 2
    tma: bool = False  # as FwdConfig.tma, for both kernels
    # the accurate backward's two switches (attention's `accurate`: see the module docstring of bwd.py).
    # dq from dS times the keys less a key the row sees (bwd._dq_rows: rounding of dS
    # not amplified by the keys' common part); one more row sum of dS a key block
    dq_shift: bool = False
    # rows whose probability is all on one key (bwd.py's rows of one key): no dS into dk from that
    # key, dq shifted by it; a compare and select per element a block in both kernels
    one_key: bool = False
    # hopper_bwd.py's Gluon kernels (their own 64x64 tiles, one warpgroup, 2 stages) where the inputs
    # are in their scope (hopper_bwd.refuses); elsewhere the Triton kernels with the tiles above
    gluon: bool = False


@dataclass(frozen=True)
class AttentionConfig:
    fwd: FwdConfig = FwdConfig()
    bwd: BwdConfig = BwdConfig()


PINGPONG = FwdConfig(block_m=128, block_n=64, warps=4, stages=4, gluon=True)  # pingpong.py's tiles
_CPU = AttentionConfig(FwdConfig(16, 16, 4, 1), BwdConfig(16, 16, 4, 1, 16, 16, 4, 1))


@tunable
def pick_fwd(head_dim: int, causal: bool, max_seqlen_q: int, device, keys: int = 0) -> FwdConfig:
    """The forward's config for a head dim, mask and query length on `device`'s architecture; `keys`:
    the most keys one query sees (keys_seen; 0: unknown, taken as few)."""
    if arch(device) == "cpu":
        return _CPU.fwd
    if max_seqlen_q <= 64:  # real-time windows: one short block, no rows wasted on padding
        return FwdConfig(block_m=64, block_n=64, warps=4, stages=3)
    # the Gluon kernels where measured faster, on the H200 (lab/results/gluon_attention_ab_h200.txt,
    # gluon_attention_d64_h200.txt, gluon_pingpong_ab_h200.txt): at D 128 the ping-pong (128 rows)
    # from 4096 keys (1.04-1.14x the 64-row one there; even at 2048, 0.87-0.93x at 512), the 64-row one below; at
    # D 64 the 64-row one up to 2048 queries (S 512 causal 1.26x; at S 4096 and 8192 the Triton
    # kernel's 128-row tiles were 3-5% faster). `runnable` gives way where the inputs are out of scope
    h200 = gpu_model(device) == "h200"
    if head_dim <= 64:
        if h200 and head_dim == 64 and 512 <= max_seqlen_q <= 2048:
            return FwdConfig(block_m=64, block_n=64, warps=4, stages=3, gluon=True)
        return FwdConfig(block_m=128, block_n=64, warps=8, stages=3)
    if h200 and head_dim == 128 and keys >= 4096:
        return PINGPONG
    return FwdConfig(block_m=64, block_n=64, warps=4, stages=3, gluon=h200 and head_dim == 128)


def runnable(config: FwdConfig, picked: bool, refusal: Callable[[FwdConfig], str | None]) -> FwdConfig:
    """The config that runs, given `refusal` (why a Gluon config cannot take the inputs, or None): a
    picked ping-pong gives way to the 64-row Gluon forward, and a Gluon config to the Triton kernel
    with its tiles (a forced ping-pong keeps its 128 rows there)."""
    while config.gluon and refusal(config):
        if picked and config.block_m == 128:
            config = dataclasses.replace(config, block_m=64, stages=3)
        else:
            config = dataclasses.replace(config, gluon=False)
    return config


@tunable
def pick_bwd(head_dim: int, causal: bool, max_seqlen_q: int, device, group: int = 1, keys: int = 0) -> BwdConfig:
    """The backward's config (dk/dv kernel and dq kernel); `group`: query heads per kv head; `keys`:
    the most keys one query sees (the window, else the key length; 0: unknown, taken as many)."""
    if arch(device) == "cpu":
        return _CPU.bwd
    if gpu_model(device) == "h200":
        # the Gluon kernels at D 128 (1.08-1.37x the Triton ones' backward at S 512-16384, causal and
        # not, GQA) and at D 64 causal (1.02-1.17x; not causal at S 4096 even): gluon_attention_bwd_ab_h200.txt
        gluon = head_dim == 128 or (head_dim == 64 and causal)
        return dataclasses.replace(_h200_bwd(head_dim, causal, group, keys), gluon=gluon)
    if group > 1:  # the dk/dv program walks every query head of its group: shorter query steps
        return BwdConfig(kv_n=64, kv_m=32, kv_warps=4, q_m=64, q_n=64, q_warps=4, tma=True)
    return BwdConfig(kv_n=64, kv_m=64, kv_warps=4, q_m=64, q_n=64, q_warps=4)


def _h200_bwd(head_dim: int, causal: bool, group: int, keys: int) -> BwdConfig:
    if head_dim <= 64:
        return BwdConfig(kv_n=64, kv_m=64, kv_warps=4, kv_stages=2 if causal else 3, q_m=64, q_n=64, q_warps=4,
                         q_stages=3)
    if group > 1:
        return BwdConfig(kv_n=64, kv_m=32, kv_warps=4, kv_stages=3, q_m=128, q_n=64, q_warps=8, q_stages=3)
    if causal and 0 < keys < 2048:  # (non-causal S 512 took 0.689 ms with it against 0.617: runs at 96d2d99)
        return BwdConfig(kv_n=64, kv_m=32 if keys <= 512 else 64, kv_warps=4, q_m=64, q_n=64, q_warps=4)
    return BwdConfig(kv_n=64, kv_m=64, kv_warps=4, kv_stages=2, q_m=128, q_n=64, q_warps=8, q_stages=3)


def keys_seen(window: int, max_seqlen_k: int) -> int:
    """The most keys one query sees: the window where there is one, else the key length."""
    return min(int(window), int(max_seqlen_k)) if window else int(max_seqlen_k)


def pick(head_dim: int, causal: bool, max_seqlen_q: int, device, group: int = 1, keys: int = 0) -> AttentionConfig:
    return AttentionConfig(pick_fwd(head_dim, causal, max_seqlen_q, device, keys),
                           pick_bwd(head_dim, causal, max_seqlen_q, device, group, keys))
