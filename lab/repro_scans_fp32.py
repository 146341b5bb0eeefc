"""The fp32 scans cases the H200 sweep found over 2x eager's error (issue 40), rerun on the GPU: the
listed worst cases of lab/results/awkward_h200_attention_scans_bcd216a.txt with their seeds, then a
fresh draw of fp32 scans cases (rtu, selective_scan, conv1d), each through lab/awkward's harness
(ours and eager against float64, forward and every gradient). Prints, per case, each part's error
against eager's and the gate, and a summary per op; writes the same to OUT/repro_scans_fp32.txt and
the verdicts to OUT/repro_scans_fp32.jsonl.

    python -m lab.repro_scans_fp32 --out $OUT [--fresh 150] [--seed 7] [--time-limit 180]

Some of these classes are GPU-only (ex2.approx behind tl.exp, div.full behind `/`, the GPU's
configs: chunks of 32 steps, time split into segments), so the CPU interpreter cannot stand in."""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from lab.awkward import scans
from lab.awkward.sweep import worst_cases

SWEEP = Path(__file__).resolve().parent / "results" / "awkward_h200_attention_scans_bcd216a.txt"


def listed_cases(path: Path = SWEEP) -> list[dict]:
    """The scans cases of a sweep summary's worst cases, as drawn (dtype, dims, options, seed)."""
    return [c for c in worst_cases(path) if c["op"] in scans.OPS]


def fresh_cases(n: int, seed: int) -> list[dict]:
    """n fp32 cases of the sweep's own draw (GPU shapes), from seed."""
    rng = random.Random(f"repro-scans-fp32-{seed}")
    out = []
    while len(out) < n:
        case = scans.draw(rng, "cuda")
        if case["dtype"] == "float32":
            out.append(case)
    return sorted(out, key=scans.variant)  # neighbours share compiled kernels


def describe(case: dict, verdict: dict) -> str:
    head = f"{verdict['status']:14s} {case['op']} {json.dumps(case['dims'])} {json.dumps(case['options'])} " \
           f"seed {case['seed']}"
    if "parts" not in verdict:
        return f"{head}\n    {verdict.get('message', '')}"
    rows = []
    for p in verdict["parts"]:
        eager = "none" if p["eager"] is None else f"{p['eager']:.3g}"
        ratio = p["ours"] / p["eager"] if p["eager"] else float("inf")
        rows.append(f"    {p['name']:11s} ours {p['ours']:.3g}  eager {eager}  ratio {ratio:.2f}  gate {p['gate']:.3g}"
                    + ("  OVER" if p["ours"] > p["gate"] else ""))
    return "\n".join([head, *rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.repro_scans_fp32", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for repro_scans_fp32.txt and .jsonl")
    ap.add_argument("--fresh", type=int, default=150, help="fresh fp32 cases after the listed ones")
    ap.add_argument("--seed", type=int, default=7, help="seed of the fresh draw")
    ap.add_argument("--time-limit", type=float, default=180.0, help="seconds after which no fresh case starts")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args(argv)
    if args.fresh < 0 or args.time_limit <= 0:
        ap.error("--fresh must be >= 0 and --time-limit > 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    lines, records = [], []
    groups = (("listed", listed_cases()), ("fresh", fresh_cases(args.fresh, args.seed)))
    for group, cases in groups:
        for case in cases:
            if group == "fresh" and time.perf_counter() - start > args.time_limit:
                left = len(cases) - sum(r["group"] == "fresh" for r in records)
                lines.append(f"(time limit: {left} fresh cases not run)")
                break
            verdict = scans.check(case, args.device)
            records.append({"group": group, "case": case, "verdict": verdict})
            text = f"[{group}] " + describe(case, verdict)
            print(text, flush=True)
            lines.append(text)
    summary = _summary(records, time.perf_counter() - start)
    print(summary)
    (out / "repro_scans_fp32.txt").write_text("\n".join(lines) + "\n\n" + summary + "\n")
    with open(out / "repro_scans_fp32.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
    return 0


def _summary(records: list[dict], seconds: float) -> str:
    """Per group and op: cases, not ok, and cases with a part over 2x eager's error."""
    rows = [f"summary ({seconds:.0f} s): group op cases not_ok over_2x_eager"]
    keys = sorted({(r["group"], r["case"]["op"]) for r in records})
    for group, op in keys:
        mine = [r for r in records if r["group"] == group and r["case"]["op"] == op]
        not_ok = sum(r["verdict"]["status"] != "ok" for r in mine)
        over2 = sum(any(p["eager"] and p["ours"] > 2 * p["eager"] for p in r["verdict"].get("parts", []))
                    for r in mine)
        rows.append(f"  {group:6s} {op:15s} {len(mine):4d} {not_ok:4d} {over2:4d}")
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
