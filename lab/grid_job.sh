#!/usr/bin/env bash
# The session's one long GPU job (lab/gpu_detached.sh): the whole full grid cold at one commit
# (benchmarks/whole_grid.sh, PROCS processes in the precompile pass; warm only where DEADLINE leaves
# it room), the host's used memory sampled every 10 s meanwhile (the pass's processes against the
# host's RAM: precompile.HOST_GIB_PER_PROC is a margin, not a measurement), then the scans family's
# awkward sweep of one op (issue 40: each kernel change gated on the compiled code).
#   OUT_DIR=$OUT bash lab/gpu_detached.sh start 'bash lab/grid_job.sh SHA TIME DEADLINE PROCS OP SEED'
set -uo pipefail
sha=$1 t=$2 deadline=$3 procs=$4 op=$5 seed=$6
log=${JOB_OUT:-.}
(while sleep 10; do echo "$(date +%T) $(free -m | awk 'NR==2 {print $3}')"; done) > "$log/mem_used_mib.txt" &
sampler=$!
bash benchmarks/whole_grid.sh "$sha" "$t" "$deadline" "$procs"
kill "$sampler"
echo "awkward start $(date +%T)"
python3 -m lab.awkward --family scans --ops "$op" --cases 1500 --seed "$seed" --time-limit 150 \
  --out "$log/awkward" > "$log/awkward.txt" 2>&1
echo "awkward end $(date +%T) rc $?"
