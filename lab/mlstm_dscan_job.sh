#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh) at commit SHA (ISO time T), after the mLSTM backward's state
# gradients were split into a chunk-parallel kernel and an element-wise scan over chunks: the bf16
# backward's kernel times against the previous commit's (OLD: its collector/, kernels/, templates/,
# carried), an A/B of the chunk-local kernel's warps, mlstm's full grid from a cold cache, then the
# cells' awkward sweep of mlstm alone (issue 40) at SEED.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/mlstm_dscan_job.sh SHA T OLD SEED'
set -uo pipefail
sha=$1 t=$2 old=$3 seed=$4
log=${JOB_OUT:-.}
shapes=(--shape B=2,NH=4,T=256,DH=64,resets=0 --shape B=32,NH=4,T=60,DH=64,resets=0.1
        --shape B=8,NH=8,T=1024,DH=64,resets=0 --shape B=64,NH=8,T=1024,DH=64,resets=0.1)
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
timeout 70 python3 -m lab.kernel_profile mlstm --mode bwd "${shapes[@]}" > "$log/profile_new.txt" 2>&1
timeout 70 python3 -m lab.kernel_profile mlstm --mode bwd "${shapes[@]}" --tree "$old" > "$log/profile_old.txt" 2>&1
echo "profiles end $(date +%T)"
timeout 80 python3 -m lab.ab mlstm --mode bwd --rounds 5 "${shapes[@]}" \
  --variant 'l4=changed(MLSTMConfig, state_warps_bwd=4)' --variant 'l8=changed(MLSTMConfig, state_warps_bwd=8)' \
  --db "$log/lab.duckdb" > "$log/ab.txt" 2>&1
echo "ab end $(date +%T) rc $?"
timeout 250 kcollect run mlstm --full -v --commit "$sha" --commit-time "$t" --db "$KC_DB" > "$log/mlstm.log" 2>&1
echo "mlstm end $(date +%T) rc $?"
timeout 150 python3 -m lab.awkward --family cells --ops mlstm --cases 3000 --seed "$seed" --device cuda --workers 15 \
  --time-limit 110 --grace 20 --out "$log/awk" > "$log/awk.txt" 2>&1
echo "awkward end $(date +%T) rc $?"
