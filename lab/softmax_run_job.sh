#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh) at commit SHA (ISO time T):
#   1. softmax's full grid (the forward's 8192-slot rows in 8 warps since 76d15b4);
#   2. rms_norm's latency-bound forwards, where Liger led at 11076cc (H200, run 54b380fd): M1 N4096
#      (0.920x; the pick: one program of 4 warps, FWD_WARPS' choice for 4096-wide rows at 32768 rows)
#      and M1024 N2048 (0.942x; a persistent grid of 4-warp programs capped at 48 registers):
#      lab.ab, 5 interleaved rounds, more warps, one tile a program, two rows a program;
#   3. the cells' awkward sweep (issue 40), seed 144.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/softmax_run_job.sh SHA T'
set -uo pipefail
sha=$1 t=$2
log=${JOB_OUT:-.}
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
timeout 240 kcollect run softmax --full -v --measure-timeout 60 --commit "$sha" --commit-time "$t" --db "$KC_DB" \
  > "$log/softmax.log" 2>&1
echo "softmax end $(date +%T) rc $?"
C="changed(RowsConfig"
{ python3 -m lab.ab rms_norm --mode fwd --db "$log/lab.duckdb" --shape M=1,N=4096 --variant "w8=$C, warps=8)" \
    --variant "w16=$C, warps=16)" --variant "w32=$C, warps=32)"
  python3 -m lab.ab rms_norm --mode fwd --db "$log/lab.duckdb" --shape M=1024,N=2048 \
    --variant "tile=$C, persistent=False)" --variant "w8=$C, warps=8, maxnreg=None)" \
    --variant "tile_w8=$C, persistent=False, warps=8, maxnreg=None)" --variant "r2=$C, rows=2, warps=8, maxnreg=None)"
} > "$log/rms_ab.txt" 2>&1
echo "ab end $(date +%T)"
timeout 190 python3 -m lab.awkward --family cells --cases 2000 --seed 144 --device cuda --workers 15 --time-limit 150 \
  --grace 20 --out "$log/awkward_cells" > "$log/awkward_cells.txt" 2>&1
echo "cells end $(date +%T)"
