#!/usr/bin/env bash
# Nsight Compute on the lent GPU (Firecracker machines read the counters; see the device notes):
# one warm launch of each case of benchmarks/ncu_cases.py (all, or those named), its report in
# $OUT/ncu_CASE.txt. The clocks are left alone (--clock-control none). Run after kcollect is
# installed there (as scripts/gpu_collect.sh does). Usage: bash scripts/ncu_profile.sh [CASE...]
set -uo pipefail
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found" >&2; exit 1; }
declare -A kernel_of  # case -> the kernel it profiles, listed once (each listing imports torch)
listed=()
while read -r c k; do kernel_of[$c]=$k; listed+=("$c"); done < <(python3 benchmarks/ncu_cases.py --list)
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=("${listed[@]}")
for c in "${cases[@]}"; do
    [ -n "${kernel_of[$c]:-}" ] || { echo "$c: no such case (python3 benchmarks/ncu_cases.py --list)" >&2; continue; }
    "$NCU" --clock-control none --kernel-name "regex:${kernel_of[$c]}" --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        python3 benchmarks/ncu_cases.py "$c" > "$OUT/ncu_$c.txt" 2>&1
    echo "$c: rc $? $(grep -E 'DRAM Throughput|Duration' "$OUT/ncu_$c.txt" | tr -s ' ' | tr '\n' ';')"
done
