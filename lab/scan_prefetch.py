"""The scans' lanes kernels with prefetches against the pick (none), on one GPU (issue 42): the
selective scan's backward (config bwd_ahead, bwd_level: each tile asks for the inputs of the tile
bwd_ahead tiles on, and the state kept before its chunk, into L1 or L2 by PTX prefetch) and RTU's
forward and backward (ahead, bwd_ahead, level: x, and in the backward dy and the kept state, of the
tile or chunk that many on). Every candidate is checked against the float64 reference and timed in
interleaved rounds by lab/scans_ab.py's harness (CUDA-graph replays, L2 flushed, % of the copy
bandwidth measured here).

Why: Nsight Compute on the pick's backward at B8 T2048 D2048 N16 (H200): 55% of the warps' stall
samples wait on a global load (long scoreboard), two one-warp programs a scheduler (255 registers),
DRAM 11.8% busy. Each tile loads its inputs and uses them at once; a prefetch holds no register.

    python -m lab.scan_prefetch --out $OUT     # every selective-scan shape's backward, RTU's both ways
    python -m lab.scan_prefetch --device cpu   # a dry run on the interpreter (no prefetch there)
"""
from __future__ import annotations

import dataclasses
import sys

from .scans_ab import SHAPES as AB_SHAPES
from .scans_ab import sweep, unique
from .scans_tune import _rtu
from .ss_variants import print_families, print_shape

SHAPES = ([(op, label, dims, "bwd") for op, label, dims, _ in AB_SHAPES if op == "selective_scan"]
          + [(op, label, dims, modes) for op, label, dims, modes in AB_SHAPES if op == "rtu"])
CPU_SHAPES = [("selective_scan", "tiny", {"B": 2, "T": 24, "D": 16, "N": 16}, "bwd"),
              ("rtu", "tiny", _rtu(2, 40, 16, "diag", 0.1), ("fwd", "bwd"))]


def candidates(op: str, label: str, dims: dict, device: str) -> list[tuple[str, object]]:
    if op == "rtu":
        return rtu_candidates(dims, device)
    from kcollect.kernels.selective_scan import config

    B, T, D, N = dims["B"], dims["T"], dims["D"], dims["N"]
    pick = config.pick(B, T, D, N, device)
    base = pick if pick.path == "lanes" else config.lanes(B, T, D, device)  # (the interpreter's tiny shape)
    out = [("pick", pick), ("lanes", base)]
    for level in (1, 2):
        for ahead in (1, 2, 4):
            out.append((f"L{level} a{ahead}", dataclasses.replace(base, bwd_ahead=ahead, bwd_level=level)))
    for segs in {1, 2 * base.bwd_segments} - {base.bwd_segments}:
        out.append((f"L1 a2 s{segs}", dataclasses.replace(base, bwd_ahead=2, bwd_level=1, bwd_segments=segs)))
    return unique(out)


def rtu_candidates(dims: dict, device: str) -> list[tuple[str, object]]:
    from kcollect.kernels.rtu import config

    B, T, H = dims["B"], dims["T"], dims["H"]
    pick = config.pick(B, T, H, device, resets=bool(dims.get("resets")))
    base = pick if pick.path == "lanes" else config.lanes(B, T, H, device)
    out = [("pick", pick), ("lanes", base)]
    for level in (1, 2):
        for ahead in (1, 2, 4):
            out.append((f"L{level} a{ahead}", dataclasses.replace(base, ahead=ahead, bwd_ahead=ahead, level=level)))
    return unique(out)


def summary(rows: list[dict]) -> None:
    print("\n== per shape: the pick and the best prefetching row (ms, % of copy)")
    by_shape: dict[tuple, list[dict]] = {}
    for r in rows:
        by_shape.setdefault((r["op"], r["shape"], r["mode"]), []).append(r)
    for (op, shape, mode), rs in by_shape.items():
        print_shape(f"{op:<15} {shape:<13} {mode} ", rs, "best", others_only=True)
    print_families(rows, 12, "each variant over the pick")


def main(argv: list[str] | None = None) -> int:
    return sweep("scan_prefetch", __doc__, SHAPES, CPU_SHAPES, 400.0, argv, summary, candidates)


if __name__ == "__main__":
    sys.exit(main())
