#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh) for a change of the mLSTM backward at commit SHA (ISO time T):
# its bf16 kernel times against the previous code's (OLD: a folder with its collector/, kernels/ and
# templates/, carried), an A/B of the chunk kernel's warps (VARIANTS: lab.ab --variant arguments,
# none if empty), mlstm's full grid from a cold cache, then the cells' awkward sweep of mlstm alone at
# SEED (issue 40: a kernel change gated on the compiled code).
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/mlstm_bwd_job.sh SHA T OLD SEED [VARIANT...]'
set -uo pipefail
sha=$1 t=$2 old=$3 seed=$4
shift 4
log=${JOB_OUT:-.}
shapes=(--shape B=2,NH=4,T=256,DH=64,resets=0 --shape B=32,NH=4,T=60,DH=64,resets=0.1
        --shape B=8,NH=8,T=1024,DH=64,resets=0 --shape B=64,NH=8,T=1024,DH=64,resets=0.1
        --shape B=16,NH=8,T=2048,DH=64,resets=0)
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
timeout 80 python3 -m lab.kernel_profile mlstm --mode bwd "${shapes[@]}" > "$log/profile_new.txt" 2>&1
timeout 80 python3 -m lab.kernel_profile mlstm --mode bwd "${shapes[@]}" --tree "$old" > "$log/profile_old.txt" 2>&1
echo "profiles end $(date +%T)"
if [ $# -gt 0 ]; then
  variants=()
  for v in "$@"; do variants+=(--variant "$v"); done
  timeout 90 python3 -m lab.ab mlstm --mode bwd --rounds 5 "${shapes[@]}" "${variants[@]}" \
    --db "$log/lab.duckdb" > "$log/ab.txt" 2>&1
  echo "ab end $(date +%T) rc $?"
fi
timeout 240 kcollect run mlstm --full -v --commit "$sha" --commit-time "$t" --db "$KC_DB" > "$log/mlstm.log" 2>&1
echo "mlstm end $(date +%T) rc $?"
timeout 130 python3 -m lab.awkward --family cells --ops mlstm --cases 3000 --seed "$seed" --device cuda --workers 15 \
  --time-limit 90 --grace 20 --out "$log/awk" > "$log/awk.txt" 2>&1
echo "awkward end $(date +%T) rc $?"
