"""The selective scan's lanes backward (kernels/selective_scan/bwd_lanes.py, config bwd_path "lanes")
against the tiles backward that config.pick chooses, on one GPU (issue 42): at the target B8 T2048
D2048 N16 and the grid's other shapes, every candidate is checked against the float64 reference
(the collector's gate; the error is in each row) and the backward alone (mode bwd: the forward,
untimed, keeps the states every `chunk` steps) timed in interleaved rounds by lab/scans_ab.py's
harness (CUDA-graph replays, L2 flushed, the median of the rounds' medians, % of the copy
bandwidth measured here).

    python -m lab.ss_bwd --out $OUT             # every shape, about 5 minutes on an H200
    python -m lab.ss_bwd --only selective_scan:target
    python -m lab.ss_bwd --device cpu           # a dry run on the interpreter at a tiny shape

Lanes candidates: tiles of bwd_steps (1, 2, 4, 8) within the kept states' chunk (4 to 32: the
forward's kept states are 4 N / chunk bytes a step and channel, written by the forward and read
here; a tile shorter than the chunk advances the kept state over the chunk's earlier tiles),
bwd_block_d channels on bwd_warps warps (32 a warp: one a thread, or two with 64 on one warp),
time whole or in the segments that bring the grid to 8 warps an SM (as config.lanes's forward),
and for the first two tiles twice that; the first tile and layout also with dB and dC by one
tl.sum over the channels (bwd_scatter off, kind "... sum") rather than the warps' reduce-scatter.
The chunk also sets the forward's writes, which this backward-only timing leaves out: a chunk
other than the pick's (16) is a forward change as well.

The last block: per shape the tiles pick and the best lanes row (ms, % of copy), and per lanes
family (chunk, steps, block_d, warps) its time over the pick's at every shape and their geometric
mean, which is what a default (config.lanes's bwd_* fields) should follow.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys

from kcollect.common import ALLOC_CONF

from .scans_ab import sweep, unique
from .ss_variants import SS, _AB, _segments, print_families, print_shape

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # as `kcollect run` does, before CUDA starts

SHAPES = [("selective_scan", s, _AB["selective_scan", s], "bwd") for s in SS]  # the target first
CPU_SHAPES = [("selective_scan", "tiny", {"B": 2, "T": 24, "D": 16, "N": 16}, "bwd")]

# (chunk, bwd_steps): the target's grid; elsewhere the first three. The offline sm_90 compile (Triton
# 3.6, bf16, N 16, D 2048): 2 steps a tile 251-255 registers and no spill on 1, 2 and 4 warps; 4
# steps spill (808 bytes of stack), 8 steps more (3584); 1 step 211, no spill, but its 16 values a
# tile are too few for the reduce-scatter (a tl.sum: 160 shuffles a step against 31)
_TILES = ((16, 2), (8, 2), (4, 2), (16, 4), (32, 2), (8, 4), (16, 1), (16, 8))
_LAYOUTS = ((32, 1), (64, 2), (128, 4), (64, 1))  # (bwd_block_d, bwd_warps)
_CPU_TILES = ((8, 4), (8, 2))
_CPU_LAYOUTS = ((8, 1),)


def candidates(label: str, dims: dict, device: str) -> list[tuple[str, object]]:
    from kcollect.kernels._host.device import sm_count
    from kcollect.kernels.selective_scan import config

    B, T, D, N = dims["B"], dims["T"], dims["D"], dims["N"]
    pick = config.pick(B, T, D, N, device)
    out = [("pick", pick)]
    cpu = device != "cuda"
    target = label == "target"
    tiles = _CPU_TILES if cpu else _TILES if target else _TILES[:3]
    layouts = _CPU_LAYOUTS if cpu else _LAYOUTS if target else _LAYOUTS[:2]
    sms = sm_count(device)
    for chunk, steps in tiles:
        # the forward must keep its states at this chunk: its tile (pick.steps) a divisor of it
        fwd = dataclasses.replace(pick, chunk=chunk, steps=math.gcd(pick.steps, chunk)) if pick.path == "lanes" \
            else dataclasses.replace(pick, chunk=chunk)
        for block_d, warps in layouts:
            segs = _segments(B, T, D, block_d, warps, chunk, sms)
            doubled = min(2 * segs, -(-T // chunk)) if (chunk, steps) in tiles[:2] else segs
            for s in sorted({segs, doubled}):
                c = dataclasses.replace(fwd, bwd_path="lanes", bwd_steps=steps, bwd_block_d=block_d, bwd_warps=warps,
                                        bwd_segments=s)
                out.append((f"c{chunk} t{steps} bd{block_d} w{warps}", c))
                if (chunk, steps, block_d, warps) == (*tiles[0], *layouts[0]) and s == segs:
                    out.append((f"c{chunk} t{steps} bd{block_d} w{warps} sum",
                                dataclasses.replace(c, bwd_scatter=False)))
    return unique(out)


def summary(rows: list[dict]) -> None:
    print("\n== per shape: the tiles pick and the best lanes row (ms, % of copy)")
    by_shape: dict[str, list[dict]] = {}
    for r in rows:
        by_shape.setdefault(r["shape"], []).append(r)
    for shape, rs in by_shape.items():
        print_shape(f"{shape:<13}", rs, "lanes best", others_only=True, err=True)
    print_families(rows, 20, "lanes families: best row over the pick's")


def main(argv: list[str] | None = None) -> int:
    return sweep("ss_bwd", __doc__, SHAPES, CPU_SHAPES, 300.0, argv, summary,
                 cands=lambda op, label, dims, device: candidates(label, dims, device))

if __name__ == "__main__":
    sys.exit(main())
