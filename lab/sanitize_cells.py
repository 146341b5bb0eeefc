"""Cells cases of issue 40 run once each on the GPU, for compute-sanitizer (memcheck) to watch:

    compute-sanitizer --tool memcheck python3 -m lab.sanitize_cells [--dot ieee|tf32x3] '<case json>' ...
    compute-sanitizer --tool memcheck python3 -m lab.sanitize_cells --draw N SEED DTYPE

Each argument is one case as lab.awkward's summaries print it; each is judged as the sweep judges
it (lab.awkward.cells.check) and its verdict printed. An illegal access in a kernel is reported by
the sanitizer with the kernel's name, where the sweep only saw the CUDA context break. --dot forces
every cell kernel's fp32 tl.dot into one mode (lab.repro_cells_fp32's switch), to tell the modes
apart. --draw screens N cases of lab.awkward's cells generator (seed SEED) of one dtype in one
process: the sanitizer names the first kernel that strays (the cases after a broken context crash)."""
from __future__ import annotations

import json
import sys

from lab.awkward import cells
from lab.repro_cells_fp32 import _force_dot


def main(argv: list[str]) -> int:
    if argv[:1] == ["--dot"]:
        _force_dot({"ieee": 1, "tf32x3": 3}[argv[1]])
        argv = argv[2:]
    if argv[:1] == ["--draw"]:
        from lab.awkward.sweep import draw_cases

        n, seed, dtype = int(argv[1]), int(argv[2]), argv[3]
        cases = [c for c in draw_cases("cells", 4 * n, seed, "cuda") if c["dtype"] == dtype][:n]
        argv = [json.dumps(c) for c in cases]
    for text in argv:
        case = json.loads(text)
        verdict = cells.check(case, "cuda")
        print(case["op"], case["dtype"], case["dims"], case["options"], "->", verdict["status"],
              verdict.get("message", "")[:300], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
