"""fused_linear_cross_entropy's tuned config: the tokens per chunk (the cross-entropy of each chunk
runs with cross_entropy's config for the chunk's shape, counted=True)."""
from __future__ import annotations

from dataclasses import dataclass

# Logits chunk budget: 256 MiB keeps the peak at vocab 128256, hidden 4096 (dW 1 GB bf16) under a
# quarter of eager's, while chunks of >= 1024 tokens keep dW += dlogits.T @ x_c compute-bound
# (K = C: 2 C flops per byte of dW read and written, against a ridge near 300 on Hopper). Larger
# chunks, within that quarter of eager's peak memory (at most ~1700 tokens at 8192x4096x128256),
# measured within +-3% of 1024 on the H200, with no trend.
# Against torch.compile (all the logits at once, 3 GiB over the inputs) it stays 3-7% behind at
# 8192x4096x128256 on the H200, though not from idle time: in one CUDA-graph replay (36.9 ms for
# both, kernels back to back) our cuBLAS calls take 35.4 ms against compile's 33.9, the difference
# being the dW passes (each chunk after the first reads and writes the 1 GB dW again), while our
# cross-entropy kernel takes 1.4 ms against compile's 3.0; replayed back to back, every provider
# sits at the 700 W power cap (median SM clock 1485-1515 MHz instead of 1980), where time follows
# the energy of the call (our reading, not measured directly).
CHUNK_BYTES = 256 << 20


@dataclass(frozen=True)
class FLCEConfig:
    """`chunk` tokens per chunk: x_c @ W.T of [chunk, V] logits at a time."""

    chunk: int


def pick(T: int, V: int, dtype) -> FLCEConfig:
    c = max(128, (CHUNK_BYTES // (V * dtype.itemsize)) // 128 * 128)  # multiples of 128: whole GEMM tiles
    return FLCEConfig(min(T, c))
