#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh) for the RTU lanes forward's time segments (issue 42) and
# conv1d's held-out sweep (issue 40):
#   1. lab.ab, 5 interleaved rounds, fwd: the segments of the pick against counts whose one-warp
#      programs fit one wave. An offline sm_90 compile (Triton 3.6) of the forward's tile of 32 steps
#      holds 255 registers a thread: 8 warps an SM at most, 1056 on the H200's 132 SMs; the pick asks
#      for cdiv(8 x SMs, programs) segments, 9 at B8 T8192 H1024 (1152 warps: a second wave of 96),
#      17 at B4 T3000 H1000 (1088), 2 where 1024 programs would fit in one (2048: two waves and an
#      ends pass that reads x again);
#   2. the scans family's awkward sweep, conv1d only, on the compiled kernels (its backward's
#      weights now loaded before the time loop).
# As run at c6d5449 (lab/results/rtu_segments_h200_c6d5449.txt): one segment won where cdiv asked for 2;
# at 128 programs the pick's 9 beat 8, the second wave notwithstanding.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/rtu_segments_job.sh'
set -uo pipefail
log=${JOB_OUT:-.}
export KCOLLECT_CACHE_DIR=/tmp/kcache_ab  # not the whole grid's cold caches, should it follow on this machine
ab() { python3 -m lab.ab rtu "$@" --mode fwd --db "$log/lab.duckdb"; }
C="changed(RTUConfig"
echo "ab start $(date +%T)"
ab --shape B=8,T=8192,H=1024,R=diag,resets=1,p=0.01 --shape B=8,T=8192,H=1024,R=diag,resets=0,p=0 \
   --shape B=8,T=8192,H=1024,R=16,resets=1,p=0.01 \
   --variant "s8=$C, segments=8)" --variant "s7=$C, segments=7)" --variant "s16=$C, segments=16)" > "$log/ab_9.txt" 2>&1
echo "ab 9 end $(date +%T)"
ab --shape B=64,T=1024,H=1024,R=diag,resets=1,p=0.01 --shape B=32,T=2048,H=2048,R=diag,resets=1,p=0.1 \
   --shape B=16,T=4096,H=4096,R=diag,resets=1,p=0.01 --shape B=32,T=2048,H=2048,R=16,resets=0,p=0 \
   --variant "s1=$C, segments=1)" --variant "s3=$C, segments=3)" > "$log/ab_2.txt" 2>&1
echo "ab 2 end $(date +%T)"
ab --shape B=4,T=3000,H=1000,R=diag,resets=1,p=0.01 \
   --variant "s16=$C, segments=16)" --variant "s15=$C, segments=15)" --variant "s8=$C, segments=8)" > "$log/ab_17.txt" 2>&1
echo "ab 17 end $(date +%T)"
python3 -m lab.awkward --family scans --ops conv1d --cases 1500 --seed 96 --time-limit 120 --out "$log/awkward" \
  > "$log/awkward.txt" 2>&1
echo "awkward end $(date +%T)"
