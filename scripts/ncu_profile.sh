#!/usr/bin/env bash
# Nsight Compute on the lent GPU (Firecracker machines read the counters; see the device notes):
# one warm launch of each case of benchmarks/ncu_cases.py (all, or those named), its report in
# $OUT/ncu_CASE.txt. The clocks are left alone (--clock-control none). Run after kcollect is
# installed there (as scripts/gpu_collect.sh does). Usage: bash scripts/ncu_profile.sh [CASE...]
set -uo pipefail
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found" >&2; exit 1; }
cases=("$@")
[ ${#cases[@]} -gt 0 ] || mapfile -t cases < <(python3 benchmarks/ncu_cases.py --list | cut -d' ' -f1)
for c in "${cases[@]}"; do
    kernel=$(python3 benchmarks/ncu_cases.py --list | awk -v c="$c" '$1 == c {print $2}')
    "$NCU" --clock-control none --kernel-name "regex:$kernel" --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        python3 benchmarks/ncu_cases.py "$c" > "$OUT/ncu_$c.txt" 2>&1
    echo "$c: rc $? $(grep -E 'DRAM Throughput|Duration' "$OUT/ncu_$c.txt" | tr -s ' ' | tr '\n' ';')"
done
