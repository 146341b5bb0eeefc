#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh) at commit SHA (ISO time T), after axon's backward kept
# dy @ w_out in fp32 (cuBLAS's fp32 output of the bf16 GEMM): axon's full grid (its cost against
# the last run's rows), then the cells' awkward sweep of axon alone (issue 40), seed 145.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/axon_job.sh SHA T'
set -uo pipefail
sha=$1 t=$2
log=${JOB_OUT:-.}
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
timeout 200 kcollect run axon --full -v --measure-timeout 60 --commit "$sha" --commit-time "$t" --db "$KC_DB" \
  > "$log/axon.log" 2>&1
echo "axon end $(date +%T) rc $?"
timeout 150 python3 -m lab.awkward --family cells --ops axon --cases 2000 --seed 145 --device cuda --workers 15 \
  --time-limit 110 --grace 20 --out "$log/awkward_axon" > "$log/awkward_axon.txt" 2>&1
echo "awkward end $(date +%T)"
