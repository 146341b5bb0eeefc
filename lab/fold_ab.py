"""A/B of the lanes backwards' folded state-before (the default for bf16 and fp16; issue 42) against
the exact path, for the RTU (lanes.FOLD_SUMS: its lambda sums from d_t = c_t - u_t) and the
selective scan (bwd_lanes.FOLD_SUMS: h_{t-1}'s term from h_t - inj_t), where the exact path
carries the state before each step through the scan. Folding halves the scan's values, so the
registers drop: folded rows also try what that frees (RTU: chunks of 32 steps, two channels a
thread, more segments; selective scan: tiles of 4 steps). Each candidate is gated against the
float64 reference and timed as lab/scans_ab.py times (interleaved rounds of CUDA-graph replays).

    python -m lab.fold_ab --out $OUT              # every RTU and selective-scan backward shape, minutes on an H200
    python -m lab.fold_ab --only rtu:target       # one shape
    python -m lab.fold_ab --device cpu            # a dry run on the interpreter

Acting on it: where a folded row with another config beats the folded heuristic at every shape,
the op's config.lanes is the place to follow it."""
from __future__ import annotations

import dataclasses
import sys

from kcollect.kernels._host import config as host_config
from kcollect.kernels.rtu import config as rtu_config
from kcollect.kernels.rtu import lanes as rtu_lanes
from kcollect.kernels.selective_scan import bwd_lanes as ss_lanes
from kcollect.kernels.selective_scan import config as ss_config

from .scans_ab import CPU_SHAPES, SHAPES, sweep

BWD_SHAPES = [(op, label, dims, ("bwd",)) for op, label, dims, _ in SHAPES]
BWD_CPU_SHAPES = [(op, label, dims, ("bwd",)) for op, label, dims, _ in CPU_SHAPES]


@dataclasses.dataclass(frozen=True)
class RTUFolded(rtu_config.RTUConfig):
    fold: bool = True


@dataclasses.dataclass(frozen=True)
class SSFolded(ss_config.SelectiveScanConfig):
    fold: bool = True


def _forcing(module):
    """module.backward with its FOLD_SUMS set from the config's fold (the config: its second-last
    argument in both ops)."""
    inner = module.backward

    def backward(*args, **kwargs):
        module.FOLD_SUMS = getattr(args[-2], "fold", None)
        try:
            return inner(*args, **kwargs)
        finally:
            module.FOLD_SUMS = None
    return backward


# in this process and the precompile workers (which import this module to unpickle a config): the
# backwards read the forced config's fold, and a folded config is forced in place of its op's pick
rtu_lanes.backward = _forcing(rtu_lanes)
ss_lanes.backward = _forcing(ss_lanes)
_kind_of = host_config.kind_of
host_config.kind_of = lambda c: (rtu_config.RTUConfig if isinstance(c, RTUFolded) else
                                 ss_config.SelectiveScanConfig if isinstance(c, SSFolded) else _kind_of(c))


def candidates(op: str, label: str, dims: dict, device: str) -> list[tuple[str, object]]:
    if op == "rtu":
        heur, kind, top = rtu_config.lanes(dims["B"], dims["T"], dims["H"], device), RTUFolded, -(-dims["T"] // 32)
    else:
        heur, kind = ss_config.lanes(dims["B"], dims["T"], dims["D"], device), SSFolded
        top = -(-dims["T"] // heur.chunk)

    def v(fold: bool, **kw):
        return kind(**{**dataclasses.asdict(heur), **kw}, fold=fold)

    out = [("exact heuristic", v(False)), ("fold heuristic", v(True))]
    if device == "cuda" and op == "rtu":
        out += [("fold chunk32", v(True, chunk=32, bwd_segments=max(1, min(heur.bwd_segments, top)))),
                ("fold 2ch", v(True, bwd_block_h=128)),
                ("fold 1warp", v(True, bwd_block_h=32, bwd_warps=1)),
                ("fold segs x2", v(True, bwd_segments=min(2 * heur.bwd_segments, 2 * top))),
                ("fold 2ch segs x2", v(True, bwd_block_h=128, bwd_segments=min(2 * heur.bwd_segments, 2 * top))),
                ("fold 4warps", v(True, bwd_block_h=128, bwd_warps=4))]
    elif device == "cuda":
        out += [("fold steps4", v(True, bwd_steps=4)),
                ("fold segs x2", v(True, bwd_segments=min(2 * heur.bwd_segments, top))),
                ("fold steps4 segs x2", v(True, bwd_steps=4, bwd_segments=min(2 * heur.bwd_segments, top))),
                ("fold 2warps", v(True, bwd_block_d=64, bwd_warps=2))]
    seen, kept = set(), []
    for name, c in out:
        if c not in seen:
            seen.add(c)
            kept.append((name, c))
    return kept


def summary(rows: list[dict]) -> None:
    print("\n== exact heuristic, folded heuristic, best folded row (ms, % of copy)")
    by_key: dict[tuple, list[dict]] = {}
    for r in rows:
        by_key.setdefault((r["op"], r["shape"], r["mode"]), []).append(r)
    for (op, shape, mode), rs in by_key.items():
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
    for fn in (rtu_lanes._bwd, ss_lanes._ss_bwd_lanes):
        for cache in fn.device_caches.values():
            for key, k in cache[0].items():
                print(f"  {fn.__name__} warps {k.metadata.num_warps} regs {k.n_regs} spills {k.n_spills}  {str(key)[-220:]}")


def main(argv: list[str] | None = None) -> int:
    rc = sweep("fold_ab", __doc__, BWD_SHAPES, BWD_CPU_SHAPES, 420.0, argv, summary, cands=candidates)
    if rc == 0 and "cpu" not in (argv or sys.argv):
        registers()
    return rc


if __name__ == "__main__":
    sys.exit(main())
