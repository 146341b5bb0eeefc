"""A/B of the RTU lanes path's segments in one launch (config.lookback, decoupled look-back) against
its two launches (an ends pass, then the main pass), issue 42: at each shape and mode, the lanes
heuristic as it is, the same with look-back, and look-back with more segments (it no longer reads
a segment twice from memory, so more of them may pay) and other channels a program. Each
candidate is gated against the float64 reference (on the GPU: the look-back's waits under real
concurrency) and timed as lab/scans_ab.py times (interleaved rounds of CUDA-graph replays).

    python -m lab.rtu_lookback_ab --out $OUT            # every shape, a few minutes on an H200
    python -m lab.rtu_lookback_ab --only rtu:target     # one shape
    python -m lab.rtu_lookback_ab --device cpu          # a dry run on the interpreter

Acting on it: the summary's best look-back rows say whether config.lanes should turn look-back on,
and with how many segments (a multiple of the two-launch heuristic's)."""
from __future__ import annotations

import dataclasses
import importlib
import sys

from .scans_ab import CPU_SHAPES, SHAPES, sweep

RTU_SHAPES = [s for s in SHAPES if s[0] == "rtu"]
RTU_CPU_SHAPES = [s for s in CPU_SHAPES if s[0] == "rtu"]


def candidates(op: str, label: str, dims: dict, device: str) -> list[tuple[str, object]]:
    """(label, config): the heuristic, then look-back at 1, 2 and 4 times its segments, the same and
    8 times with forward tiles of 16 steps (fewer registers: the look-back forward holds two copies
    of the tiles' loop), and at twice them with other channels a program (each direction's
    segments scaled alike)."""
    cfg = importlib.import_module("kcollect.kernels.rtu.config")
    heur = cfg.lanes(dims["B"], dims["T"], dims["H"], device)
    top_f, top_b = -(-dims["T"] // (heur.steps or heur.chunk)), -(-dims["T"] // heur.chunk)

    def scaled(k: int, **kw):
        return dataclasses.replace(heur, lookback=True, segments=max(1, min(top_f, heur.segments * k)),
                                   bwd_segments=max(1, min(top_b, heur.bwd_segments * k)), **kw)

    out = [("lanes heuristic", heur)]
    out += [(f"lookback x{k}", scaled(k)) for k in (1, 2, 4)]
    out += [(f"lookback x{k} s16", scaled(k, steps=16)) for k in (1, 2, 4, 8)]
    if device == "cuda":
        out += [("lookback x2 s16 fwd128", scaled(2, steps=16, block_h=128, warps=2)),
                ("lookback x2 bwd32", scaled(2, bwd_block_h=32, bwd_warps=1))]
    seen, kept = set(), []
    for name, c in out:
        if c not in seen:
            seen.add(c)
            kept.append((name, c))
    return kept


def summary(rows: list[dict]) -> None:
    """Per shape and mode: the heuristic's time and the best look-back row's."""
    print("\n== heuristic (two launches) against the best look-back row (ms, % of copy)")
    by_key: dict[tuple, list[dict]] = {}
    for r in rows:
        by_key.setdefault((r["shape"], r["mode"]), []).append(r)
    for (shape, mode), rs in by_key.items():
        timed = [r for r in rs if r["ms"]]
        heur = next((r for r in timed if r["kind"] == "lanes heuristic"), None)
        best = min((r for r in timed if r["kind"].startswith("lookback")), key=lambda r: r["ms"], default=None)
        cell = lambda r: f"{r['kind']} {r['ms']:.4f} ({r.get('pct_copy') or float('nan'):.1f}%)" if r else "-"  # noqa: E731
        ratio = f"  ratio {best['ms'] / heur['ms']:.3f}" if heur and best else ""
        print(f"  {shape:<12} {mode}  {cell(heur)}  {cell(best)}{ratio}")
        failed = [r["kind"] for r in rs if r["note"]]
        if failed:
            print(f"      not timed: {', '.join(failed)}")


def registers() -> None:
    """Registers and spills of every variant of the lanes kernels compiled in this process."""
    from kcollect.kernels.rtu import lanes

    print("\n== compiled lanes kernels: registers, spills (the specialisation's constexprs)")
    for fn in (lanes._fwd, lanes._bwd):
        for cache in fn.device_caches.values():
            for key, k in cache[0].items():
                flags = [f for f in ("ENDS_PASS", "LOOKBACK", "STORE_CK", "BLOCK_H", "CHUNK") if f in str(key)]
                print(f"  {fn.__name__} warps {k.metadata.num_warps} regs {k.n_regs} spills {k.n_spills}  "
                      f"{str(key)[-300:] if flags else ''}")


def main(argv: list[str] | None = None) -> int:
    rc = sweep("rtu_lookback_ab", __doc__, RTU_SHAPES, RTU_CPU_SHAPES, 420.0, argv, summary, cands=candidates)
    if rc == 0 and "cpu" not in (argv or sys.argv):
        registers()
    return rc


if __name__ == "__main__":
    sys.exit(main())
