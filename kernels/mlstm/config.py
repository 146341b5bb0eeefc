"""The mLSTM's launch config: the chunk length (the intra-chunk part is an L x L attention-like
block per chunk, the inter-chunk part a DH x DH state carried from chunk to chunk), the width of the
value blocks a program handles at a time, and warps."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from . import chunk
from .._host.config import arch, tunable
from .._host.device import sm_count


@dataclass(frozen=True)
class MLSTMConfig:
    chunk: int = 64  # timesteps a chunk (16 at least: the sides of tl.dot)
    bv: int = 64  # value columns a block (the state is DH x bv per program in the state scans)
    warps: int = 8  # the forward's chunk kernel
    state_warps: int = 4  # the forward's scan over chunks
    # the forward's scan loads chunk c+1's inputs before chunk c's product (H200, bf16: 1.2-9.5% faster
    # at every shape of lab/results/mlstm_scan_prefetch_h200_d5c1472.txt; not measured on an H100)
    prefetch: bool = True
    warps_bwd: int = 0  # the backward's chunk kernel; 0: warps
    state_warps_bwd: int = 0  # the backward's state gradients (_mlstm_dlocal); 0: state_warps
    # the backward's state gradients a program a chunk, then a scan over chunks (True), or a program a
    # row taking its chunks one by one (False: no scan, whose memory traffic costs where rows are many)
    dstates_by_chunk: bool = True


@tunable
def pick(T: int, DH: int, device, rows: int = 1, dtype: torch.dtype | None = None) -> MLSTMConfig:
    """Chunks of 64 (Cortex's and TFLA's inner block), value blocks of 64; on the CPU interpreter
    chunks of 16, so that the tests cross chunk boundaries on short sequences. `rows`: B * NH.
    The forward's chunk kernel in 16-bit dtypes, as the backward's, in 4 warps where its programs
    are more than two waves of the SMs, 8 where fewer; in fp32 in 8 (lab/results/
    mlstm_fwd_warps_h200.txt, H200: in bf16 4 warps 14-28% faster at B8 NH8 T1024, B16 NH8 T2048 and
    B64 NH8 T1024, level at B2 NH4 T256 and B32 NH4 T60; in fp32 1.9% slower at the first two, 1.2%
    faster at the third; its scan in 8 warps 0.4-19% slower in bf16).
    The backward (lab/results/mlstm_bwd_warps_h200.txt, H200): its chunk kernel in 4 warps where its
    programs (chunks x rows) are more than two waves of the SMs, 8 where fewer. At the grid's shapes
    of T 1024 and more 4 warps made the fp32 backward 23-24% faster and, with its then scan over chunks
    in 8, the bf16 one 21-24% (B8 NH8 T1024 bf16 0.326 -> 0.257 ms); at B2 NH4 T256 (32 programs) they
    were 16% slower in fp32. Its state gradients (_mlstm_dlocal) a program a chunk, in 8 warps, where
    a program a row (times the value blocks) would leave SMs idle, else a program a row, in 4 (in 8
    17-20% faster where they fit on the SMs at one each, 37% slower at B64 NH8's 512 programs). At
    B8 NH8 T1024 (64 rows) a program a chunk took the backward from 309 to 227 us; at B64 NH8 T1024
    (512) the chunk-local kernel took what the row programs had (429 vs 426 us) and its scan over
    chunks added 78 us (kernel times, lab/results/mlstm_bwd_dscan_h200_d18de01.txt). A program a
    chunk in 8 warps was 0.7-1.6% faster than in 4 at those two, and in 4 4-5% slower at B2 NH4 T256
    and B32 NH4 T60.
    Not measured on an H100."""
    dp = chunk.padded(DH)
    if arch(device) == "cpu":
        return MLSTMConfig(chunk=16, bv=min(16, dp), warps=4, state_warps=4)
    L, bv, sms = 64, min(64, dp), sm_count(device)
    waves = triton.cdiv(T, L) * rows / sms
    warps_bwd = 4 if waves > 2 else 8
    warps = warps_bwd if dtype in (torch.bfloat16, torch.float16) else 8
    by_chunk = rows * (dp // bv) < sms
    return MLSTMConfig(chunk=L, bv=bv, warps=warps, state_warps=4, warps_bwd=warps_bwd,
                       state_warps_bwd=8 if by_chunk else 4, dstates_by_chunk=by_chunk)
