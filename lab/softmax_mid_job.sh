#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh), issue 42 and 40 at commit SHA (ISO time T):
#   1. softmax's forward where QuACK or Liger led at 11076cc (H200, run 54b380fd): 3000x5000 (0.857x
#      QuACK; the pick: one 8192-slot row a program of 16 warps), 4096x4096 (0.964x Liger; one row of 8
#      warps) and 4096x32000 (0.946x QuACK; a persistent 32-warp row a SM): lab.ab, 5 interleaved
#      rounds, the pick against fewer or more warps, two rows a program, persistent grids, and at
#      32000 wide the coop path's segments;
#   2. the scans' awkward sweep (issue 40), a seed no earlier sweep used, with lab.awkward's spread
#      taken as the largest of SPREAD_DRAWS roundings for a part over its gate at the first;
#   3. conv1d's full grid (its width-3 backward tiles of e2c672b were measured only by an A/B).
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/softmax_mid_job.sh SHA T'
set -uo pipefail
sha=$1 t=$2
log=${JOB_OUT:-.}
ab() { python3 -m lab.ab softmax --mode fwd --db "$log/lab.duckdb" "$@"; }
echo "ab start $(date +%T)"
{ ab --shape M=3000,N=5000 --variant "w4=RowsConfig(8192, 1, 4)" --variant "w8=RowsConfig(8192, 1, 8)" \
    --variant "w32=RowsConfig(8192, 1, 32)" --variant "r2w16=RowsConfig(8192, 2, 16)" \
    --variant "p2w8=RowsConfig(8192, 1, 8, persist=2)" --variant "p4w8=RowsConfig(8192, 1, 8, persist=4)" \
    --variant "p2w16=RowsConfig(8192, 1, 16, persist=2)"
  ab --shape M=4096,N=4096 --shape M=32768,N=4096 --variant "w4=RowsConfig(4096, 1, 4)" \
    --variant "w16=RowsConfig(4096, 1, 16)" --variant "r2w8=RowsConfig(4096, 2, 8)" \
    --variant "r2w16=RowsConfig(4096, 2, 16)" --variant "p4w8=RowsConfig(4096, 1, 8, persist=4)" \
    --variant "p2w16=RowsConfig(4096, 1, 16, persist=2)"
  ab --shape M=4096,N=32000 --variant "coop16k=CoopConfig(16384, 16, l2_ahead=1)" \
    --variant "coop8k=CoopConfig(8192, 8, l2_ahead=1)" --variant "coop4k=CoopConfig(4096, 4, l2_ahead=1)" \
    --variant "p1w16=RowsConfig(32768, 1, 16, persist=1)"
} > "$log/softmax_ab.txt" 2>&1
echo "ab end $(date +%T)"
timeout 200 python3 -m lab.awkward --family scans --cases 2000 --seed 141 --device cuda --workers 15 --time-limit 140 \
  --grace 20 --out "$log/awkward" > "$log/awkward.txt" 2>&1
echo "awkward end $(date +%T)"
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
timeout 240 kcollect run conv1d --full -v --measure-timeout 60 --commit "$sha" --commit-time "$t" --db "$KC_DB" \
  > "$log/conv1d.log" 2>&1
echo "conv1d end $(date +%T) rc $?"
