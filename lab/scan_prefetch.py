"""The selective scan's lanes backward with prefetches (config bwd_ahead, bwd_level: each tile asks
for the inputs of the tile bwd_ahead tiles on, and the state kept before its chunk, into L1 or L2 by
PTX prefetch) against none and the pick, on one GPU (issue 42): every candidate checked against the
float64 reference and timed in interleaved rounds by lab/scans_ab.py's harness (CUDA-graph replays,
L2 flushed, % of the copy bandwidth measured here). (At d3e7e33 it also timed RTU's lanes kernels
with prefetches, since taken out: lab/results/scan_prefetch_h200_d3e7e33.txt.)

Why: Nsight Compute on the pick's backward at B8 T2048 D2048 N16 (H200): 55% of the warps' stall
samples wait on a global load (long scoreboard), two one-warp programs a scheduler (255 registers),
DRAM 11.8% busy. Each tile loads its inputs and uses them at once; a prefetch holds no register.

    python -m lab.scan_prefetch --out $OUT     # every selective-scan shape's backward
    python -m lab.scan_prefetch --device cpu   # a dry run on the interpreter (no prefetch there)
"""
from __future__ import annotations

import dataclasses
import sys

from .scans_ab import SHAPES as AB_SHAPES
from .scans_ab import by_case, sweep, unique
from .ss_variants import print_families, print_shape

SHAPES = [(op, label, dims, "bwd") for op, label, dims, _ in AB_SHAPES if op == "selective_scan"]
CPU_SHAPES = [("selective_scan", "tiny", {"B": 2, "T": 24, "D": 16, "N": 16}, "bwd")]


def candidates(op: str, label: str, dims: dict, device: str) -> list[tuple[str, object]]:
    from kcollect.kernels.selective_scan import config

    B, T, D, N = dims["B"], dims["T"], dims["D"], dims["N"]
    pick = config.pick(B, T, D, N, device)
    base = pick if pick.path == "lanes" else config.lanes(B, T, D, device)  # (the interpreter's tiny shape)
    out = [("pick", pick), ("none", dataclasses.replace(base, bwd_ahead=0))]
    for level in (1, 2):
        for ahead in (1, 2, 4):
            out.append((f"L{level} a{ahead}", dataclasses.replace(base, bwd_ahead=ahead, bwd_level=level)))
    for segs in {1, 2 * base.bwd_segments, max(1, base.bwd_segments // 2)} - {base.bwd_segments}:
        out.append((f"L2 a1 s{segs}", dataclasses.replace(base, bwd_ahead=1, bwd_level=2, bwd_segments=segs)))
    return unique(out)


def summary(rows: list[dict]) -> None:
    print("\n== per shape: the pick and the best prefetching row (ms, % of copy)")
    for (op, shape, mode), rs in by_case(rows).items():
        print_shape(f"{op:<15} {shape:<13} {mode} ", rs, "best", others_only=True)
    print_families(rows, 12, "each variant over the pick")


def main(argv: list[str] | None = None) -> int:
    return sweep("scan_prefetch", __doc__, SHAPES, CPU_SHAPES, 400.0, argv, summary, candidates)


if __name__ == "__main__":
    sys.exit(main())
