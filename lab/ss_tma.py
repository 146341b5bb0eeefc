"""The selective scan's lanes forward with its tiles loaded by TMA (config.tma: the x, delta and z
tiles by tensor descriptor in a software-pipelined loop of `tma` stages, B_t and C_t a tile ahead
in registers) against the register loop that loads one tile ahead (tma 0), on one GPU (issue 42):
every candidate checked against the float64 reference and timed in interleaved rounds by
lab/scans_ab.py's harness (CUDA-graph replays, L2 flushed, % of the copy bandwidth measured here).

Why: at B8 T2048 D2048 N16 the pick's grid is 512 one-warp programs, one a scheduler, and each
keeps one tile of 8 steps (1.5 KB of x, delta and z) in flight: about 6 KB an SM, far from what
the memory's latency asks for at full bandwidth. TMA stages hold tiles in shared memory, not in
the registers the 16 states of 8 steps already fill.

    python -m lab.ss_tma --out $OUT            # every selective-scan shape, forward, bf16
    python -m lab.ss_tma --device cpu          # a dry run on the interpreter at a tiny shape
"""
from __future__ import annotations

import dataclasses
import sys

from .scans_ab import SHAPES as AB_SHAPES
from .scans_ab import sweep, unique
from .ss_variants import print_families, print_shape

SHAPES = [(op, label, dims, "fwd") for op, label, dims, _ in AB_SHAPES if op == "selective_scan"]
CPU_SHAPES = [("selective_scan", "tiny", {"B": 2, "T": 24, "D": 16, "N": 16}, "fwd")]


def candidates(op: str, label: str, dims: dict, device: str) -> list[tuple[str, object]]:
    from kcollect.kernels.selective_scan import config

    B, T, D, N = dims["B"], dims["T"], dims["D"], dims["N"]
    pick = config.pick(B, T, D, N, device)
    base = pick if pick.path == "lanes" else config.lanes(B, T, D, device)  # (the interpreter's tiny shape)
    out = [("pick", pick), ("lanes", base)]
    for steps in (8, 4):
        for stages in (2, 3, 4, 6, 8):
            out.append((f"t{steps} tma{stages}", dataclasses.replace(base, steps=steps, tma=stages)))
    return unique(out)


def summary(rows: list[dict]) -> None:
    print("\n== per shape: the pick and the best TMA row (ms, % of copy)")
    by_shape: dict[tuple, list[dict]] = {}
    for r in rows:
        by_shape.setdefault((r["op"], r["shape"], r["mode"]), []).append(r)
    for (op, shape, mode), rs in by_shape.items():
        print_shape(f"{op:<15} {shape:<13} {mode} ", rs, "best", others_only=True)
    print_families(rows, 12, "each TMA variant over the pick")


def main(argv: list[str] | None = None) -> int:
    return sweep("ss_tma", __doc__, SHAPES, CPU_SHAPES, 400.0, argv, summary, candidates)


if __name__ == "__main__":
    sys.exit(main())
