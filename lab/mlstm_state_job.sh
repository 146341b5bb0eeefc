#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh) at commit SHA (ISO time T), after the mLSTM's products of the
# queries with the chunk-start state were split (chunk.dot_state, forward and backward): mlstm's full
# grid from a cold cache (judged by `kcollect compare` against 3e54491's run), an A/B of the backward's
# chunk kernel in 8 warps where the pick gives 4 (its stack grew with the split), then the cells'
# awkward sweep of mlstm alone (issue 40), seed 167, never drawn before.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/mlstm_state_job.sh SHA T'
set -uo pipefail
sha=$1 t=$2
log=${JOB_OUT:-.}
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
timeout 260 kcollect run mlstm --full -v --commit "$sha" --commit-time "$t" --db "$KC_DB" > "$log/mlstm.log" 2>&1
echo "mlstm end $(date +%T) rc $?"
timeout 90 python3 -m lab.ab mlstm --mode bwd --rounds 5 --shape B=8,NH=8,T=1024,DH=64,resets=0 \
  --shape B=16,NH=8,T=2048,DH=64,resets=0 --shape B=64,NH=8,T=1024,DH=64,resets=0.1 \
  --variant 'w8=changed(MLSTMConfig, warps_bwd=8)' --db "$log/lab.duckdb" > "$log/ab.txt" 2>&1
echo "ab end $(date +%T) rc $?"
timeout 120 python3 -m lab.awkward --family cells --ops mlstm --cases 3000 --seed 167 --device cuda --workers 15 \
  --time-limit 80 --grace 20 --out "$log/awk" > "$log/awk.txt" 2>&1
echo "awkward end $(date +%T) rc $?"
