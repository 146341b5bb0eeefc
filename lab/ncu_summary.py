"""One line per Nsight Compute text report (lab/ncu_profile.sh's output): the kernel, its duration,
registers, active warps a scheduler, issue slots busy, the XU and FMA pipes' and DRAM's share of
peak, warp cycles an issued instruction, and the stall reasons with the most samples. What bounds a
kernel at a glance: one warp a scheduler issuing every cycle or two with the XU pipe busy (its
exponentials), or warps waiting on loads (long scoreboard) with DRAM far from busy, or barriers.

    python -m lab.ncu_summary ncu_*.txt
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

_FIELDS = [("duration", r"^\s+Duration\s+(\S+)\s+([\d.,]+)"), ("regs", r"^\s+Registers Per Thread\s+\S+\s+([\d.,]+)"),
           ("warps/s", r"^\s+Active Warps Per Scheduler\s+warp\s+([\d.,]+)"),
           ("issue%", r"^\s+Issue Slots Busy\s+%\s+([\d.,]+)"),
           ("xu%", r"sm__inst_executed_pipe_xu\.avg\.pct_of_peak_sustained_active\s+%\s+([\d.,]+)"),
           ("fma%", r"sm__pipe_fma_cycles_active\.avg\.pct_of_peak_sustained_active\s+%\s+([\d.,]+)"),
           ("dram%", r"^\s+DRAM Throughput\s+%\s+([\d.,]+)"),
           ("cyc/ins", r"^\s+Warp Cycles Per Issued Instruction\s+cycle\s+([\d.,]+)")]
_STALL = re.compile(r"Warp Stall Sampling \(All Samples\) \(smsp__pcsamp_warps_issue_stalled_(\w+)\)\s+\S+\s+([\d,]+)")


def summary(text: str) -> dict:
    """The fields above (strings as printed; absent ones '-') and `stalls`: (reason, samples), most first."""
    kernel = re.search(r"^  (\w+) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", text, re.M)
    out = {"kernel": kernel.group(1) if kernel else "?"}
    for name, pattern in _FIELDS:
        m = re.search(pattern, text, re.M)
        out[name] = "-" if not m else f"{m.group(2)} {m.group(1)}" if name == "duration" else m.group(1)
    stalls = [(r, int(n.replace(",", ""))) for r, n in _STALL.findall(text) if r != "selected"]
    out["stalls"] = sorted(stalls, key=lambda rn: -rn[1])
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip())
        return 2
    names = ["kernel"] + [n for n, _ in _FIELDS]
    print("  ".join(f"{n:>12}" for n in names) + "  stall samples (issued ones left out)")
    for path in argv:
        s = summary(Path(path).read_text(errors="replace"))
        stalls = "; ".join(f"{r} {n}" for r, n in s["stalls"][:4])
        print("  ".join(f"{s[n]:>12}" for n in names) + f"  {stalls}  ({Path(path).name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
