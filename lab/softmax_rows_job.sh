#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh), issues 42 and 40:
#   1. softmax's one-row tiles of 8192 slots (rows of 4097-8192 elements) and 16384: lab.ab, 5
#      interleaved rounds, forward and backward, the pick's warps (16 at both) against 8 and 4 at
#      8192, 8 and 32 at 16384. lab/results/softmax_mid_h200_4fc3cf2.txt had 8 warps at 0.930x the
#      forward's time at 3000x5000, and 4 or 32 slower;
#   2. the awkward sweeps of the cells and attention families (issue 40), seeds no earlier sweep
#      used, with lab.awkward's medians over roundings for fp32 parts over their gate at one draw;
#   3. (before the sweeps) conv1d's full grid at commit SHA (ISO time T), whose width-3 backward tiles are 8 steps.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/softmax_rows_job.sh SHA T'
set -uo pipefail
sha=$1 t=$2
log=${JOB_OUT:-.}
ab() { python3 -m lab.ab softmax --db "$log/lab.duckdb" "$@"; }
K8="--shape M=3000,N=5000 --shape M=512,N=5000 --shape M=16384,N=5000 --shape M=4096,N=6000
    --shape M=1024,N=8192 --shape M=8192,N=8192"
K16="--shape M=4096,N=12000 --shape M=2048,N=16384"
C="changed(RowsConfig"
echo "ab start $(date +%T)"
# shellcheck disable=SC2086
for mode in fwd bwd; do
  ab $K8 --mode $mode --variant "w8=$C, warps=8)" --variant "w4=$C, warps=4)"
  ab $K16 --mode $mode --variant "w8=$C, warps=8)" --variant "w32=$C, warps=32)"
done > "$log/softmax_ab.txt" 2>&1
echo "ab end $(date +%T)"
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
timeout 200 kcollect run conv1d --full -v --measure-timeout 60 --commit "$sha" --commit-time "$t" --db "$KC_DB" \
  > "$log/conv1d.log" 2>&1
echo "conv1d end $(date +%T) rc $?"
timeout 150 python3 -m lab.awkward --family cells --cases 2000 --seed 142 --device cuda --workers 15 --time-limit 110 \
  --grace 20 --out "$log/awkward_cells" > "$log/awkward_cells.txt" 2>&1
echo "cells end $(date +%T)"
timeout 190 python3 -m lab.awkward --family attention --cases 2000 --seed 143 --device cuda --workers 15 \
  --time-limit 150 --grace 20 --out "$log/awkward_attention" > "$log/awkward_attention.txt" 2>&1
echo "attention end $(date +%T)"
