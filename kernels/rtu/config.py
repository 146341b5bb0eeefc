"""The RTU scan's tuned config: how a program tiles time and channels, and how long sequences are
split so that the whole GPU works on them.

A program owns `block_h` channels of one sequence and walks its time steps in chunks of `chunk`
(each chunk one tl.associative_scan, the state carried from chunk to chunk in registers). With few
sequences x channel blocks (Cortex's B 8 x H 64), time is also cut into `segments`: a first pass
scans each segment from a zero state and keeps its end state and transition, the main pass
starts each segment from the combined ends of those before it (one extra read of the inputs, so
it only pays where programs would otherwise leave SMs idle). The forward keeps the state at every
chunk's end for the backward, which recomputes each chunk from it instead of storing the
pre-activations: the backward's chunk is the forward's.

The sm90 values are lab/scans_tune.py's on the H100 (bf16, torch 2.11, Triton 3.6; its output is in
lab/results/scans_tune_h100.txt). The backward's chunk is the forward's, so they were chosen
together: 32-step chunks of 16 channels (one 32-byte sector a time step), 4 warps both ways. Against
the first guess (64 steps, backward 8 warps): B8 T8192 H1024 forward 0.915 -> 0.600 ms, backward
2.911 -> 2.233; B32 T2048 H2048 forward 1.278 -> 1.071, backward 5.766 -> 3.451. Splitting time
into segments lost wherever batch x channel blocks already fill the GPU (0.59 -> 1.02 ms), and won
at Cortex's B8 H64. Not tuned on the H200: there these are a guess. The CPU values are small so that
the interpreter's tests cross several chunks, segments and channel blocks."""
from __future__ import annotations

from dataclasses import dataclass

import triton

from .._lib.config import arch, tunable
from .._lib.device import sm_count


@dataclass(frozen=True)
class RTUConfig:
    chunk: int = 32  # time steps a scan (and the backward's checkpoint interval)
    block_h: int = 16  # channels a program (forward)
    warps: int = 4
    segments: int = 1  # time splits of the forward (1: one program walks the whole sequence)
    bwd_block_h: int = 16
    bwd_warps: int = 4
    bwd_segments: int = 1
    path: str = "tiles"  # the forward's kernels: "tiles" (kernels.py) or "lanes" (lanes.py)
    bwd_path: str = "tiles"  # the backward's (either reads the states either forward kept)


# programs per SM below which a split over time pays for its extra read
_FILL = 2


def split(batch: int, steps: int, channels: int, block_h: int, chunk: int, device) -> int:
    """Segments that bring batch x channel blocks up to _FILL programs an SM, at most one a chunk."""
    programs = max(1, batch * triton.cdiv(channels, block_h))  # (an empty batch: no split)
    want = triton.cdiv(_FILL * sm_count(device), programs)
    return max(1, min(want, triton.cdiv(steps, chunk)))


@tunable
def pick(batch: int, steps: int, channels: int, device) -> RTUConfig:
    """The config for B sequences of T steps and H channels on `device`'s architecture."""
    if arch(device) == "cpu":
        return RTUConfig(8, 8, 1, split(batch, steps, channels, 8, 8, device), 8, 1,
                         split(batch, steps, channels, 8, 8, device))
    c = RTUConfig()
    return RTUConfig(c.chunk, c.block_h, c.warps, split(batch, steps, channels, c.block_h, c.chunk, device),
                     c.bwd_block_h, c.bwd_warps, split(batch, steps, channels, c.bwd_block_h, c.chunk, device))
