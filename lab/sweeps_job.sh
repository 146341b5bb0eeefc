#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh): the awkward sweeps (issue 40) of the families whose kernels
# did not change in this session, at seeds no earlier sweep drew: attention (4066), the scans (170),
# and the cells but mlstm (168; mlstm has its own in lab/mlstm_state_job.sh). No runs are stored.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/sweeps_job.sh'
set -uo pipefail
log=${JOB_OUT:-.}
sweep() {  # FAMILY SEED TIME_LIMIT [--ops OPS]
  local family=$1 seed=$2 limit=$3
  shift 3
  timeout $((limit + 40)) python3 -m lab.awkward --family "$family" "$@" --cases 2000 --seed "$seed" --device cuda \
    --workers 15 --time-limit "$limit" --grace 20 --out "$log/awkward_$family" > "$log/awkward_$family.txt" 2>&1
  echo "$family end $(date +%T) rc $?"
}
sweep attention 4066 170
sweep scans 170 100
sweep cells 168 120 --ops lstm,slstm,axon
