"""The mLSTM's launch config: the chunk length (the intra-chunk part is an L x L attention-like
block per chunk, the inter-chunk part a DH x DH state carried from chunk to chunk), the width of the
value blocks a program handles at a time, and warps."""
from __future__ import annotations

from dataclasses import dataclass

from . import chunk
from .._host.config import arch, tunable


@dataclass(frozen=True)
class MLSTMConfig:
    chunk: int = 64  # timesteps a chunk (16 at least: the sides of tl.dot)
    bv: int = 64  # value columns a block (the state is DH x bv per program in the state scans)
    warps: int = 8  # chunk kernels (at 4 the backward's spills on sm_90)
    state_warps: int = 4  # the scans over chunks
    # the forward's scan loads chunk c+1's inputs before chunk c's product (H200, bf16: 1.2-9.5% faster
    # at every shape of lab/results/mlstm_scan_prefetch_h200_d5c1472.txt; not measured on an H100)
    prefetch: bool = True


@tunable
def pick(T: int, DH: int, device) -> MLSTMConfig:
    """Chunks of 64 (Cortex's and TFLA's inner block), value blocks of 64, 8 warps for the chunk
    kernels; on the CPU interpreter chunks of 16, so that the tests cross chunk boundaries on short
    sequences."""
    dp = chunk.padded(DH)
    if arch(device) == "cpu":
        return MLSTMConfig(chunk=16, bv=min(16, dp), warps=4, state_warps=4)
    return MLSTMConfig(chunk=64, bv=min(64, dp), warps=8, state_warps=4)
