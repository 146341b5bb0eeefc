#!/usr/bin/env bash
# Nsight Compute's full sections (every metric of each, the XU pipe's and every stall reason's) for
# one kernel of an op's triton provider at one shape, on a GPU machine whose runtime lets ncu read
# the counters (Firecracker: clocks left alone). The op runs under lab.kernel_profile (one call
# checked against float64, three warm, one profiled); the kernel's launch after `skip` matching
# ones is profiled.
#
#   bash lab/ncu_profile.sh OUT.txt KERNEL_REGEX SKIP OP --mode fwd --shape B=8,T=2048,D=2048,N=16 [--config ...]
#
# e.g. the selective scan's lanes forward: KERNEL_REGEX _ss_fwd_lanes, SKIP 3 (a warm call).
set -u
out=$1 kernel=$2 skip=$3
shift 3
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout "${NCU_LIMIT:-120}" "$NCU" --clock-control none --set full --print-details all \
  --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active \
  -k "regex:$kernel" -s "$skip" -c 1 python3 -m lab.kernel_profile "$@" --calls 1 > "$out" 2>&1
echo "ncu $out: exit $?"
