#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh) at commit SHA (ISO time T), after the mLSTM backward's state
# gradients took a program a chunk (then the scan) only where a program a row would leave SMs idle:
# the bf16 backward's kernel times at five grid shapes, an A/B of the two ways at the shapes either
# side of the pick's line, mlstm's full grid from a cold cache, then the cells' awkward sweep of
# mlstm alone (issue 40) at SEED.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/mlstm_hybrid_job.sh SHA T SEED'
set -uo pipefail
sha=$1 t=$2 seed=$3
log=${JOB_OUT:-.}
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
timeout 60 python3 -m lab.kernel_profile mlstm --mode bwd --shape B=2,NH=4,T=256,DH=64,resets=0 \
  --shape B=32,NH=4,T=60,DH=64,resets=0.1 --shape B=8,NH=8,T=1024,DH=64,resets=0 \
  --shape B=16,NH=8,T=2048,DH=64,resets=0 --shape B=64,NH=8,T=1024,DH=64,resets=0.1 > "$log/profile.txt" 2>&1
echo "profile end $(date +%T)"
timeout 70 python3 -m lab.ab mlstm --mode bwd --rounds 5 --shape B=16,NH=8,T=2048,DH=64,resets=0 \
  --shape B=64,NH=8,T=1024,DH=64,resets=0.1 --shape B=32,NH=8,T=1024,DH=64,resets=0 \
  --variant 'chunk=changed(MLSTMConfig, dstates_by_chunk=True, state_warps_bwd=8)' \
  --variant 'row=changed(MLSTMConfig, dstates_by_chunk=False, state_warps_bwd=4)' \
  --db "$log/lab.duckdb" > "$log/ab.txt" 2>&1
echo "ab end $(date +%T) rc $?"
timeout 240 kcollect run mlstm --full -v --commit "$sha" --commit-time "$t" --db "$KC_DB" > "$log/mlstm.log" 2>&1
echo "mlstm end $(date +%T) rc $?"
timeout 120 python3 -m lab.awkward --family cells --ops mlstm --cases 3000 --seed "$seed" --device cuda --workers 15 \
  --time-limit 80 --grace 20 --out "$log/awk" > "$log/awk.txt" 2>&1
echo "awkward end $(date +%T) rc $?"
