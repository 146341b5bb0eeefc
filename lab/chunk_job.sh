#!/usr/bin/env bash
# One GPU session's job (lab/gpu_detached.sh), for the scans' backward chunk (issue 42) and a whole
# grid at one commit (issue 43):
#   1. which peers import here (QuACK and FlashAttention-4 need the CuTe DSL's packages: gpu_env.sh);
#   2. lab.ab A/Bs, 5 interleaved rounds: selective_scan's states kept every 8 steps (the pick at
#      commit X) against 16, and rtu's lanes backward in chunks of 8 (commit Y, X's child, whose tree
#      this runs) against 16;
#   3. rtu keeps chunks of 8 where they were faster: the geometric mean of c16/default over every
#      A/B line at least 1.02 and no line under 0.98; otherwise this tree's rtu/config.py goes back
#      to X's LANES_CHUNK = 16 and the runs below are X's;
#   4. the scans' awkward sweep (issue 40) on the chosen code;
#   5. the whole full grid from empty caches, after the committed history is imported (so that a
#      series' last time can vouch for a row, as in the workflow), then warm again where DEADLINE
#      (epoch seconds) leaves 540 s for it.
#   OUT_DIR=$OUT bash lab/gpu_detached.sh start 'bash lab/chunk_job.sh X XTIME Y YTIME DEADLINE'
# As run on 2026-12-01 (X 3c3d5d4, Y c13eeb2, whose rtu/config.py had LANES_CHUNK = 8 alone);
# lab/results/scans_chunk_ab_h200_3c3d5d4.txt and full_grid_h200_3c3d5d4.txt are what it made.
set -uo pipefail
x=$1 xt=$2 y=$3 yt=$4 deadline=$5
log=${JOB_OUT:-.}
export TRITON_CACHE_DIR=$KCOLLECT_CACHE_DIR/triton  # kcollect run's own: the A/Bs' builds serve the run
python3 -m lab.peers > "$log/peers.txt" 2>&1
ab() { python3 -m lab.ab "$@" --db "$log/lab.duckdb"; }
echo "ab start $(date +%T)"
SS="--shape B=8,T=2048,D=2048,N=16 --shape B=16,T=1024,D=1536,N=16 --shape B=8,T=2048,D=4096,N=16
    --shape B=4,T=4096,D=2048,N=16 --shape B=32,T=60,D=512,N=16 --shape B=1,T=60,D=512,N=16
    --shape B=3,T=1000,D=1000,N=16"
C16="c16=changed(SelectiveScanConfig, chunk=16)"
# shellcheck disable=SC2086
{ ab selective_scan $SS --mode bwd --variant "$C16"
  ab selective_scan --shape B=8,T=2048,D=2048,N=16 --shape B=1,T=60,D=512,N=16 --mode fwd+bwd --variant "$C16"
} > "$log/ss_ab.txt" 2>&1
RTU="--shape B=8,T=8192,H=1024,R=diag,resets=1,p=0.01 --shape B=8,T=1024,H=64,R=diag,resets=1,p=0.1
     --shape B=32,T=2048,H=2048,R=diag,resets=1,p=0.1 --shape B=16,T=4096,H=4096,R=diag,resets=1,p=0.01
     --shape B=4,T=3000,H=1000,R=diag,resets=1,p=0.01 --shape B=4,T=128,H=64,R=diag,resets=0,p=0"
R16="c16=changed(RTUConfig, chunk=16)"
# shellcheck disable=SC2086
{ ab rtu $RTU --mode bwd --variant "$R16"
  ab rtu --shape B=8,T=8192,H=1024,R=diag,resets=1,p=0.01 --shape B=8,T=1024,H=64,R=diag,resets=1,p=0.1 \
    --mode fwd+bwd --variant "$R16"
} > "$log/rtu_ab.txt" 2>&1
echo "ab end $(date +%T)"
if python3 - "$log/rtu_ab.txt" <<'EOF'
import math, re, sys
r = [float(m) for m in re.findall(r"triton\[c16\].* x([0-9.]+) of default", open(sys.argv[1]).read())]
g = math.exp(sum(map(math.log, r)) / len(r)) if r else 0.0
print(f"rtu c16/default over {len(r)} lines: geomean {g:.3f}, min {min(r, default=0):.3f}")
sys.exit(0 if r and g >= 1.02 and min(r) >= 0.98 else 1)
EOF
then sha=$y t=$yt; echo "rtu: chunks of 8 kept, runs at $sha"
else
  sed -i 's/^LANES_CHUNK = 8$/LANES_CHUNK = 16/' kernels/rtu/config.py
  grep -q '^LANES_CHUNK = 16$' kernels/rtu/config.py || { echo "rtu/config.py: LANES_CHUNK not found"; exit 1; }
  sha=$x t=$xt; echo "rtu: back to chunks of 16, runs at $sha"
fi
echo "awkward start $(date +%T)"
python3 -m lab.awkward --family scans --cases 2000 --seed 82 --device cuda --workers 15 --time-limit 110 --out "$log/awkward" \
  --grace 20 > "$log/awkward.txt" 2>&1
echo "awkward end $(date +%T) rc $?"
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
common="--all --full -v --measure-timeout 60 --commit $sha --commit-time $t --db $KC_DB"
for step in cold warm; do
  if [ "$step" = warm ] && [ $(($(date +%s) + 540)) -gt "$deadline" ]; then echo "warm: skipped (deadline)"; break; fi
  echo "$step start $(date +%T)"
  # shellcheck disable=SC2086
  kcollect run $common > "$log/$step.log" 2>&1
  echo "$step end $(date +%T) rc $?"
  tail -n 1 "$log/$step.log"
done
