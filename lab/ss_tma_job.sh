#!/usr/bin/env bash
# The TMA A/B of the selective scan's lanes forward (lab/ss_tma.py) on one GPU, with Nsight Compute's
# full sections for the target shape's forward (the pick and TMA 4) and the scans' other lanes
# kernels (the selective scan's backward, RTU's forward and backward), each kernel's third launch.
# Run under lab/gpu_call.sh (JOB_OUT): ncu_*.txt and the sweep's table come back.
set -u
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
ss="--shape B=8,T=2048,D=2048,N=16"
rtu="--shape B=8,T=8192,H=1024,R=diag,resets=1,p=0.01"
prof() {  # name kernel-regex skip profile-args...
  local name=$1 kernel=$2 skip=$3 limit=${NCU_LIMIT:-100}; shift 3
  timeout "$limit" "$NCU" --clock-control none --set full -k "regex:$kernel" -s "$skip" -c 1 \
    python3 -m lab.kernel_profile "$@" --calls 1 > "$JOB_OUT/ncu_$name.txt" 2>&1
  echo "ncu $name: exit $?"
}
[ -n "${SKIP_SWEEP:-}" ] || timeout 300 python3 -m lab.ss_tma --out "$JOB_OUT" > "$JOB_OUT/ss_tma.txt" 2>&1
echo "ss_tma: exit $?"
prof ss_fwd_pick _ss_fwd_lanes 3 selective_scan --mode fwd $ss
prof ss_fwd_tma4 _ss_fwd_lanes 8 selective_scan --mode fwd $ss --config 'tma4=replace(lanes(8, 2048, 2048, "cuda"), tma=4)'
[ -n "${ONLY_SS:-}" ] && exit 0
prof ss_bwd _ss_bwd_lanes 3 selective_scan --mode bwd $ss
prof rtu_fwd '^_fwd$' 3 rtu --mode fwd $rtu
prof rtu_bwd '^_bwd$' 3 rtu --mode bwd $rtu
