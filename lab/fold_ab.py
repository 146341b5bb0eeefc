"""A/B of the RTU lanes backward's folded lambda sums (lanes.FOLD_SUMS, from d_t = c_t - u_t; the
default for bf16 and fp16; issue 42) against the exact sums, which carry the state before each
step through the scan. Folding halves the scan's values, so the registers drop: folded rows also
try what that frees (one or four warps, more segments; chunks of 32 steps and two channels a
thread lost at every shape on an H200, lab/results/fold_ab_h200.txt, which also holds the same
fold of the selective scan's backward: slower at 3 of its 4 shapes, and taken out). Each
candidate is gated against the float64 reference and timed as lab/scans_ab.py times
(interleaved rounds of CUDA-graph replays).

    python -m lab.fold_ab --out $OUT              # every RTU backward shape, 2 minutes on an H200
    python -m lab.fold_ab --only rtu:target       # one shape
    python -m lab.fold_ab --device cpu            # a dry run on the interpreter

Acting on it: where a folded row with another config beats the folded heuristic at every shape,
rtu/config.py's lanes is the place to follow it."""
from __future__ import annotations

import dataclasses
import sys

from kcollect.kernels._host import config as host_config
from kcollect.kernels.rtu import config as rtu_config
from kcollect.kernels.rtu import lanes as rtu_lanes

from .scans_ab import CPU_SHAPES, SHAPES, by_case, sweep, unique
from .scans_tune import _rtu

BWD_SHAPES = [(op, label, dims, ("bwd",)) for op, label, dims, _ in SHAPES if op == "rtu"] + [  # more of the RTU grid's
    ("rtu", "cortex-lowrank", _rtu(8, 512, 64, 16, 0.1), ("bwd",)),
    ("rtu", "cortex-H128", _rtu(8, 512, 128, "diag", 0.0), ("bwd",)),
    ("rtu", "widest", _rtu(16, 4096, 4096, "diag", 0.01), ("bwd",)),
]
BWD_CPU_SHAPES = [(op, label, dims, ("bwd",)) for op, label, dims, _ in CPU_SHAPES if op == "rtu"]


@dataclasses.dataclass(frozen=True)
class RTUFolded(rtu_config.RTUConfig):
    fold: bool = True


_backward = rtu_lanes.backward


def _forced_backward(*args, **kwargs):
    """lanes.backward with FOLD_SUMS set from the forced config's fold (its second-last argument)."""
    rtu_lanes.FOLD_SUMS = getattr(args[-2], "fold", None)
    try:
        return _backward(*args, **kwargs)
    finally:
        rtu_lanes.FOLD_SUMS = None


# in this process and the precompile workers (which import this module to unpickle a config): the
# backward reads the forced config's fold, and a folded config is forced in place of the pick
rtu_lanes.backward = _forced_backward
_kind_of = host_config.kind_of
host_config.kind_of = lambda c: rtu_config.RTUConfig if isinstance(c, RTUFolded) else _kind_of(c)


def candidates(op: str, label: str, dims: dict, device: str) -> list[tuple[str, object]]:
    heur, top = rtu_config.lanes(dims["B"], dims["T"], dims["H"], device), -(-dims["T"] // 32)

    def v(fold: bool, **kw):
        return RTUFolded(**{**dataclasses.asdict(heur), **kw}, fold=fold)

    out = [("exact heuristic", v(False)), ("fold heuristic", v(True))]
    if device == "cuda":
        out += [("exact segs x2", v(False, bwd_segments=min(2 * heur.bwd_segments, 2 * top))),
                ("exact 1warp", v(False, bwd_block_h=32, bwd_warps=1)),
                ("fold segs x2", v(True, bwd_segments=min(2 * heur.bwd_segments, 2 * top))),
                ("fold 1warp", v(True, bwd_block_h=32, bwd_warps=1)),
                ("fold 4warps", v(True, bwd_block_h=128, bwd_warps=4))]
    return unique(out)


def summary(rows: list[dict]) -> None:
    print("\n== exact heuristic, folded heuristic, best folded row (ms, % of copy)")
    for (op, shape, mode), rs in by_case(rows).items():
        kinds = {r["kind"]: r for r in rs if r["ms"]}
        best = min((r for r in kinds.values() if r["kind"].startswith("fold")), key=lambda r: r["ms"], default=None)
        cell = lambda r: f"{r['kind']} {r['ms']:.4f} ({r.get('pct_copy') or float('nan'):.1f}%)" if r else "-"  # noqa: E731
        print(f"  {op:<15} {shape:<12} {mode}  {cell(kinds.get('exact heuristic'))}  "
              f"{cell(kinds.get('fold heuristic'))}  {cell(best)}")
        failed = [r["kind"] for r in rs if r["note"]]
        if failed:
            print(f"      not timed: {', '.join(failed)}")


def registers() -> None:
    print("\n== compiled lanes backward kernels: registers, spills")
    for cache in rtu_lanes._bwd.device_caches.values():
        for k in cache[0].values():
            print(f"  _bwd warps {k.metadata.num_warps} regs {k.n_regs} spills {k.n_spills}")


def main(argv: list[str] | None = None) -> int:
    rc = sweep("fold_ab", __doc__, BWD_SHAPES, BWD_CPU_SHAPES, 420.0, argv, summary, cands=candidates)
    if rc == 0 and "cpu" not in (argv or sys.argv):
        registers()
    return rc


if __name__ == "__main__":
    sys.exit(main())
