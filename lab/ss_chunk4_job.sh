#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh): the selective scan's states kept every 4 steps (the lanes
# forward in tiles of 4 with it) against the pick's 8, lab.ab, 5 interleaved rounds, bf16, at the
# grid's seven shapes, backward alone and forward+backward.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/ss_chunk4_job.sh'
set -uo pipefail
log=${JOB_OUT:-.}
SS="--shape B=1,T=60,D=512,N=16 --shape B=32,T=60,D=512,N=16 --shape B=3,T=1000,D=1000,N=16
    --shape B=16,T=1024,D=1536,N=16 --shape B=8,T=2048,D=2048,N=16 --shape B=4,T=4096,D=2048,N=16
    --shape B=8,T=2048,D=4096,N=16"
for mode in fwd+bwd bwd; do
  # shellcheck disable=SC2086
  python3 -m lab.ab selective_scan $SS --mode $mode --variant "c4=changed(SelectiveScanConfig, chunk=4, steps=4)" \
    --db "$log/lab.duckdb"
done > "$log/ss_chunk4_ab.txt" 2>&1
