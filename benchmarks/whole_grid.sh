#!/usr/bin/env bash
# The job for lab/gpu_detached.sh (issue 43): the whole full grid at one commit, cold and then warm,
# on the machine's one GPU. Cold only as the first job of a fresh machine: gpu_detached.sh keeps the
# caches in /tmp/kcache0, which a machine kept warm still holds.
#   1. which peers import here (QuACK and FlashAttention-4 need the CuTe DSL's packages: gpu_env.sh);
#   2. the committed history is imported first, so that a series' last time can vouch for a row
#      (as in the benchmark workflow);
#   3. cold with PROCS processes in the precompile pass (default: precompile.default_procs, 16 on
#      a one-GPU host of 16 cores, where the pass took 243.5 s of a 17m01s run at 11076cc; 8 took
#      327 s at 3c3d5d4; on a host of four H200s 30 processes made the grid's 2111 builds in 150 s),
#      then warm where DEADLINE (epoch seconds) leaves 600 s for it.
#   OUT_DIR=$OUT bash lab/gpu_detached.sh start 'bash benchmarks/whole_grid.sh SHA TIME DEADLINE [PROCS]'
set -uo pipefail
sha=$1 t=$2 deadline=$3 procs=${4:-auto}
log=${JOB_OUT:-.}
python3 -m lab.peers > "$log/peers.txt" 2>&1
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
common="--all --full -v --measure-timeout 60 --commit $sha --commit-time $t --db $KC_DB"
for step in cold warm; do
  if [ "$step" = warm ] && [ $(($(date +%s) + 600)) -gt "$deadline" ]; then echo "warm: skipped (deadline)"; break; fi
  echo "$step start $(date +%T)"
  extra=""
  [ "$step" = cold ] && extra="--precompile $procs"
  # shellcheck disable=SC2086
  kcollect run $common $extra > "$log/$step.log" 2>&1
  echo "$step end $(date +%T) rc $?"
  tail -n 1 "$log/$step.log"
done
