#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh): conv1d's depthwise backward at widths 2 and 3 after its
# weights moved out of the time loop (a70e45d). An offline sm_90 compile (Triton 3.6) at width 3
# and 16-step tiles holds 174 registers a thread (166 before): 10 warps an SM where 12 fit, and the
# whole grid at 11076cc measured that shape's backward +5.1%. lab.ab, 5 interleaved rounds: the
# pick's tiles against 8 and 32 steps.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/conv1d_k3_job.sh'
set -uo pipefail
log=${JOB_OUT:-.}
C="changed(DepthwiseConfig"
python3 -m lab.ab conv1d --shape B=8,T=8192,F=2048,K=3,groups=depthwise,resets=1,p=0.01 \
  --shape B=8,T=8192,F=2048,K=2,groups=depthwise,resets=0,p=0 --mode bwd \
  --variant "t8=$C, bwd_block_t=8)" --variant "t32=$C, bwd_block_t=32)" --db "$log/lab.duckdb" > "$log/ab.txt" 2>&1
echo "ab end $(date +%T)"
