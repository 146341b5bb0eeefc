"""The selective scan's lanes forward variants on one GPU (issue 42), and the RTU lanes backward's
segments: every candidate is checked against the float64 reference (the collector's gate; the
error is in each row) and timed in interleaved rounds by lab/scans_ab.py's harness (CUDA-graph
replays, L2 flushed, the median of the rounds' medians, % of the copy bandwidth measured here).

    python -m lab.ss_variants --out $OUT        # every shape, about 6 minutes on an H200
    python -m lab.ss_variants --only selective_scan:target
    python -m lab.ss_variants --device cpu      # a dry run on the interpreter at tiny shapes

Selective scan (forward, bf16), at the target B8 T2048 D2048 N16 and the grid's other shapes:
config.pick's choice ("pick"), and the lanes forward with a channel's states over `split` lanes
(1, 2, 4; block_d channels a program of `warps` warps), softplus(delta) on each of a channel's
lanes or once a channel (`share`), tiles of `steps` (4, 8), 1/`poly` of the decays by the
FMA-pipe polynomial (0: none), time whole and in the segments that bring the grid to 8 warps an
SM. RTU backward (bf16): config.pick's, and 32/64/128 channels on 1/2/4 warps, each
over the pick's segments (rescaled to the layout's warps), half, 1.5x and twice that: whether the
backward's 8 warps an SM should be more (B8 T8192 H1024 with resets: 10 segments beat 5 by 7%;
without resets 5 beat 10 by 15%, lab/results/scans_ab_h200.txt).

The last block: per shape the pick and the best row (ms, % of copy); per variant family (split,
steps, poly) its time over the pick's at every selective-scan shape and their geometric mean,
which is what a default (config.lanes) should follow.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys

from kcollect.common import ALLOC_CONF

from .scans_ab import SHAPES as AB_SHAPES
from .scans_ab import by_case, sweep, unique
from .scans_tune import _rtu

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # as `kcollect run` does, before CUDA starts

_AB = {(op, label): dims for op, label, dims, _ in AB_SHAPES}
SS = ("target", "mamba-130m", "wide", "long", "realtime-B32", "awkward", "realtime-B1")  # the target first
RTU_BWD = ("target", "no-resets", "cortex-B8", "awkward", "T1024", "wide")
SHAPES = [("selective_scan", s, _AB["selective_scan", s], "fwd") for s in SS[:1]] + \
         [("rtu", s, _AB["rtu", s], "bwd") for s in RTU_BWD[:2]] + \
         [("selective_scan", s, _AB["selective_scan", s], "fwd") for s in SS[1:]] + \
         [("rtu", s, _AB["rtu", s], "bwd") for s in RTU_BWD[2:]]
CPU_SHAPES = [("selective_scan", "tiny", {"B": 2, "T": 24, "D": 16, "N": 16}, "fwd"),
              ("rtu", "tiny", _rtu(2, 40, 16, "diag", 0.1), "bwd")]

# (split, block_d, warps): 32 lanes a warp, a channel's states over `split` of them
_LAYOUTS = ((1, 32, 1), (2, 16, 1), (2, 32, 2), (4, 8, 1), (4, 16, 2))
_CPU_LAYOUTS = ((1, 8, 1), (2, 8, 1), (4, 4, 1))


def _segments(batch: int, steps: int, channels: int, block_d: int, warps: int, tile: int, sms: int) -> int:
    """config.lanes's rule for a layout: time whole once the grid holds 2 warps an SM, otherwise
    the segments that bring it to 8 (at most one a tile)."""
    total = max(1, batch * -(-channels // block_d)) * warps
    want = 1 if total >= 2 * sms else -(-8 * sms // total)
    return max(1, min(want, -(-steps // tile)))


def ss_candidates(label: str, dims: dict, device: str) -> list[tuple[str, object]]:
    from kcollect.kernels._host.device import sm_count
    from kcollect.kernels.selective_scan import config

    B, T, D, N = dims["B"], dims["T"], dims["D"], dims["N"]
    pick = config.pick(B, T, D, N, device)
    base = dataclasses.replace(config.lanes(B, T, D, device), split=1, poly=0)
    sms = sm_count(device)
    cpu = device != "cuda"
    target = label == "target"
    layouts = _CPU_LAYOUTS if cpu else _LAYOUTS if target else _LAYOUTS[:2] + _LAYOUTS[3:4]
    polys = (0, 4) if cpu or not target else (0, 4, 2)
    out = [("pick", pick)]
    for split, block_d, warps in layouts:
        # softplus on each of a channel's lanes or once (share); elsewhere than the target only once
        for share in ((False,) if split == 1 else (False, True) if target or cpu else (True,)):
            for steps in ((4,) if cpu else (4, 8)):
                for poly in polys:
                    # at the target also 2 segments (the grid's warps doubled, an ends pass over half of time)
                    extra = {2} if target and split > 1 and share and not poly else set()
                    for segs in sorted({1, _segments(B, T, D, block_d, warps, steps, sms)} | extra):
                        c = dataclasses.replace(base, block_d=block_d, warps=warps, steps=steps, segments=segs,
                                                split=split, poly=poly, share=share)
                        out.append((f"s{split} t{steps} p{poly}{' sh' * share}", c))
    return unique(out)


def rtu_bwd_candidates(label: str, dims: dict, device: str) -> list[tuple[str, object]]:
    from kcollect.kernels.rtu import config

    B, T, H = dims["B"], dims["T"], dims["H"]
    pick = config.pick(B, T, H, device)
    out = [("pick", pick)]
    top = -(-T // pick.chunk)
    for block_h, warps in ((32, 1), (64, 2), (128, 4)):
        # the pick's segments rescaled to this layout's warps, then half, 1.5x and twice that
        segs = max(1, min(top, pick.bwd_segments * pick.bwd_block_h * warps // (block_h * pick.bwd_warps)))
        for s in sorted({max(1, segs // 2), segs, min(top, (3 * segs + 1) // 2), min(top, 2 * segs)}):
            out.append(("grid", dataclasses.replace(pick, bwd_block_h=block_h, bwd_warps=warps, bwd_segments=s)))
    return unique(out)


def summary(rows: list[dict]) -> None:
    print("\n== per shape: the pick and the best row (ms, % of copy)")
    for (op, shape, mode), rs in by_case(rows).items():
        print_shape(f"{op:<15} {shape:<13} {mode} ", rs, "best")
    print_families([r for r in rows if r["op"] == "selective_scan"], 12,
                   "selective scan: each family's best row over the pick's")


def print_shape(label: str, rs: list[dict], best_label: str, others_only: bool = False, err: bool = False) -> None:
    """One shape's pick and best timed row (of the rows not the pick's with others_only), with the
    best row's config (and error, with err)."""
    timed = [r for r in rs if r["ms"]]
    pick = next((r for r in timed if r["kind"] == "pick"), None)
    best = min((r for r in timed if not others_only or r["kind"] != "pick"), key=lambda r: r["ms"], default=None)
    cell = lambda r: f"{r['ms']:.4f} ({r.get('pct_copy') or float('nan'):.1f}%)" if r else "-"  # noqa: E731
    gain = f"  best/pick {best['ms'] / pick['ms']:.3f}" if best and pick else ""
    print(f"  {label} pick {cell(pick)}  {best_label} {cell(best)}{gain}")
    if best:
        tail = f"  err {best['err']:.1e}" if err else ""
        print(f"      best: {' '.join(f'{k}={v}' for k, v in best['config'].items())}{tail}")


def print_families(rows: list[dict], width: int, title: str) -> None:
    """Each candidate family's (kind's) best row over the pick's, per shape, and their geomean."""
    print(f"\n== {title}, per shape (below 1: faster), and geomean")
    fams: dict[str, dict[str, float]] = {}
    picks = {r["shape"]: r["ms"] for r in rows if r["kind"] == "pick" and r["ms"]}
    for r in rows:
        if r["kind"] != "pick" and r["ms"] and r["shape"] in picks:
            fam = fams.setdefault(r["kind"], {})
            fam[r["shape"]] = min(fam.get(r["shape"], math.inf), r["ms"] / picks[r["shape"]])
    for kind, per in sorted(fams.items(), key=lambda kv: _geomean(kv[1].values())):
        cells = "  ".join(f"{s} {v:.3f}" for s, v in per.items())
        print(f"  {kind:<{width}} geomean {_geomean(per.values()):.3f} over {len(per)}:  {cells}")


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def _candidates(op, label, dims, device):
    return (ss_candidates if op == "selective_scan" else rtu_bwd_candidates)(label, dims, device)


def main(argv: list[str] | None = None) -> int:
    return sweep("ss_variants", __doc__, SHAPES, CPU_SHAPES, 300.0, argv, summary, _candidates)


if __name__ == "__main__":
    sys.exit(main())
