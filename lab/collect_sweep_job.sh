#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh): OP's full grid collected at commit SHA (ISO time T) from a cold
# cache, then the awkward sweep (issue 40) of FAMILY at SEED for LIMIT seconds (EXTRA: more lab.awkward
# options, e.g. --ops mlstm).
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/collect_sweep_job.sh OP SHA T FAMILY SEED LIMIT [EXTRA...]'
set -uo pipefail
op=$1 sha=$2 t=$3 family=$4 seed=$5 limit=$6
shift 6
log=${JOB_OUT:-.}
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
timeout 280 kcollect run "$op" --full -v --commit "$sha" --commit-time "$t" --db "$KC_DB" > "$log/$op.log" 2>&1
echo "$op end $(date +%T) rc $?"
timeout $((limit + 40)) python3 -m lab.awkward --family "$family" "$@" --cases 3000 --seed "$seed" --device cuda \
  --workers 15 --time-limit "$limit" --grace 20 --out "$log/awkward_$family" > "$log/awkward_$family.txt" 2>&1
echo "$family end $(date +%T) rc $?"
