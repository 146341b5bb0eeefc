"""The mLSTM's narrow heads on the GPU, judged with the kernels' columns padded to 16 or to 32.

An H200 sweep at 90e3254 (lab/results/awkward_h200_cells_attention_90e3254.txt) found fp32 (and fp16, which
runs the fp32 kernels) mLSTM cases of DH 1-16 over the gate by orders of magnitude (dq 0.16 where
eager's error was 3e-7), while the interpreter passed the same cases with the GPU's chunks of 64:
a build problem of the padded-to-16 kernels, as in lab/results/sanitize_mlstm_h200_b8e243f.txt,
or a fault of ours that only the GPU's memory shows. Each case is judged as the sweep judges it
(lab.awkward.cells.check) once per width of chunk.MIN_COLUMNS:

    python -m lab.mlstm_width_ab --listed SUMMARY --fresh 60 --seed 13 --widths 16,32 --out DIR
    compute-sanitizer --tool memcheck python3 -m lab.mlstm_width_ab --widths 16 --case '<json>'

--listed: the mLSTM cases a sweep's summary names; --fresh N: N more mLSTM cases of DH <= 16 from
the sweep's generator. Prints one line per case and width, then the counts by width, and writes
DIR/mlstm_width_ab.txt."""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path


def fresh_cases(n: int, seed: int) -> list[dict]:
    from lab.awkward import cells

    rng, out = random.Random(f"width-{seed}"), []
    while len(out) < n:
        case = cells.draw(rng, "cuda")
        if case["op"] == "mlstm" and case["dims"]["DH"] <= 16 and not case["refusal"]:
            out.append(case)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.mlstm_width_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listed", help="a sweep's summary: its listed mLSTM cases")
    ap.add_argument("--fresh", type=int, default=0)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--case", action="append", default=[], help="one case as JSON (repeatable)")
    ap.add_argument("--widths", default="16,32")
    ap.add_argument("--time-limit", type=float, default=1e9, help="no case starts after this many seconds")
    ap.add_argument("--device", default="cuda", help="cpu: the interpreter (a dry run)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from kcollect.kernels.mlstm import chunk
    from lab.awkward import cells
    from lab.awkward.sweep import worst_cases

    cases = [json.loads(c) for c in args.case]
    if args.listed:
        cases += [c for c in worst_cases(Path(args.listed)) if c.get("op") == "mlstm"]
    cases += fresh_cases(args.fresh, args.seed)
    start, lines, counts = time.time(), [], Counter()
    widths = [int(w) for w in args.widths.split(",")]
    for case in cases:  # the widths of one case side by side, so that a time limit cuts both alike
        for width in widths:
            chunk.MIN_COLUMNS = width
            if time.time() - start > args.time_limit:
                counts[(width, "not_run")] += 1
                continue
            verdict = cells.check(case, args.device)
            counts[(width, verdict["status"])] += 1
            line = (f"width {width}: {verdict['status']:<15} {case['dtype']:<9} {case['dims']} {case['options']} "
                    f"seed {case['seed']}: {verdict.get('message', '')[:160]}")
            print(line, flush=True)
            lines.append(line)
    summary = [f"width {w}: " + ", ".join(f"{s} {n}" for (w2, s), n in sorted(counts.items()) if w2 == w)
               for w in sorted({w for w, _ in counts})]
    print("\n".join(summary))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "mlstm_width_ab.txt").write_text("\n".join(lines + [""] + summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
