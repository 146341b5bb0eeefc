"""Errors of one op's kernels on a seeded draw of small awkward cases, for an A/B of two checkouts
on the interpreter: run it in each (each its own `kcollect`), then compare the two JSON files.

    TRITON_INTERPRET=1 python -m lab.cells_draw_ab OUT.json --seed 7 --cases 120 [--op lstm]
    python -m lab.cells_draw_ab --compare A.json B.json

Each case is checked as the awkward sweep checks it (lab/awkward/cells.py: ours and eager against
float64); the draw cycles the op's gate modes over small shapes and bf16/fp16."""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics

SHAPES = {"lstm": ({"B": 1, "H": 1, "I": 1, "T": 5}, {"B": 2, "H": 3, "I": 2, "T": 9}, {"B": 1, "H": 8, "I": 3, "T": 17})}
GATES = {"lstm": ("tiny", "saturated", "typical", "large_state")}


def draw(op: str, seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        dims = rng.choice(SHAPES[op])
        dtype = rng.choice(["bfloat16", "float16"])
        options = {"resets": rng.choice(["none", "first", "edges"]), "gates": GATES[op][i % len(GATES[op])],
                   "x_scale": 1.0, "layout": "contiguous", "grad_layout": "contiguous"}
        out.append({"op": op, "dtype": dtype, "dims": dims, "options": options, "refusal": None,
                    "seed": rng.randrange(2**31)})
    return out


def compare(a: list[dict], b: list[dict]) -> None:
    pairs = [(x, y) for x, y in zip(a, b) if x.get("error") and y.get("error")]
    for gates in sorted({x["case"]["options"]["gates"] for x, _ in pairs}):
        ea = sorted(x["error"] for x, _ in pairs if x["case"]["options"]["gates"] == gates)
        eb = sorted(y["error"] for x, y in pairs if x["case"]["options"]["gates"] == gates)
        print(f"{gates:12s} {len(ea):4d} cases  error median {ea[len(ea) // 2]:.2e} -> {eb[len(eb) // 2]:.2e}, "
              f"max {ea[-1]:.2e} -> {eb[-1]:.2e}")
    ratio = math.exp(statistics.mean(math.log(y["error"] / x["error"]) for x, y in pairs))
    print(f"geometric mean of B/A errors {ratio:.3f}; B smaller in {sum(y['error'] < x['error'] for x, y in pairs)} "
          f"of {len(pairs)}; status A {[x['status'] for x in a].count('ok')} ok, B {[y['status'] for y in b].count('ok')} ok")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--op", default="lstm", choices=sorted(SHAPES))
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--cases", type=int, default=120)
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = p.parse_args(argv)
    if args.compare:
        compare(*(json.load(open(f)) for f in args.compare))
        return 0
    from lab.awkward import cells

    rows = []
    for case in draw(args.op, args.seed, args.cases):
        v = cells.check(case, "cpu")
        rows.append({"case": case, "status": v["status"], "error": v.get("error"), "eager": v.get("eager_error")})
    json.dump(rows, open(args.out, "w"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
