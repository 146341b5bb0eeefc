#!/usr/bin/env bash
# One GPU call's job (lab/gpu_call.sh) for conv1d's depthwise backward (issue 42's recurrent family):
#   1. lab.ab, 5 interleaved rounds: the backward's tiles (time steps, channels, warps, span, the
#      programs' order) around the pick, with cuDNN and eager where they run, at the grid's depthwise
#      shapes; the forward's tiles and order at three of them;
#   2. the scans family's awkward sweep, conv1d's cases only (issue 40), on the compiled kernels.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/conv1d_job.sh'
set -uo pipefail
log=${JOB_OUT:-.}
ab() { python3 -m lab.ab conv1d "$@" --db "$log/lab.duckdb"; }
DW="--shape B=16,T=4096,F=2048,K=4,groups=depthwise,resets=1,p=0.01
    --shape B=8,T=2048,F=4096,K=4,groups=depthwise,resets=0,p=0
    --shape B=8,T=8192,F=2048,K=2,groups=depthwise,resets=0,p=0
    --shape B=8,T=8192,F=2048,K=3,groups=depthwise,resets=1,p=0.01
    --shape B=5,T=3001,F=1000,K=4,groups=depthwise,resets=1,p=0.01
    --shape B=32,T=60,F=512,K=4,groups=depthwise,resets=1,p=0.01"
C="changed(DepthwiseConfig"
echo "ab start $(date +%T)"
# shellcheck disable=SC2086
ab $DW --mode bwd --provider cudnn --provider eager \
  --variant "tf=$C, bwd_channels_first=False)" --variant "t8=$C, bwd_block_t=8)" --variant "t32=$C, bwd_block_t=32)" \
  --variant "w2f64=$C, bwd_block_f=64, bwd_warps=2)" --variant "t8w2f64=$C, bwd_block_t=8, bwd_block_f=64, bwd_warps=2)" \
  --variant "f64=$C, bwd_block_f=64)" --variant "t8f64=$C, bwd_block_t=8, bwd_block_f=64)" \
  --variant "f256w8=$C, bwd_block_f=256, bwd_warps=8)" \
  --variant "span128=$C, bwd_span=128)" --variant "span2048=$C, bwd_span=2048)" > "$log/bwd_ab.txt" 2>&1
echo "bwd ab end $(date +%T)"
ab --shape B=16,T=4096,F=2048,K=4,groups=depthwise,resets=1,p=0.01 \
   --shape B=8,T=2048,F=4096,K=4,groups=depthwise,resets=0,p=0 \
   --shape B=8,T=8192,F=2048,K=2,groups=depthwise,resets=0,p=0 --mode fwd --provider cudnn \
   --variant "cf=$C, channels_first=True)" --variant "t64=$C, block_t=64)" \
   --variant "cft64=$C, block_t=64, channels_first=True)" --variant "cff256=$C, block_f=256, channels_first=True)" \
   > "$log/fwd_ab.txt" 2>&1
echo "fwd ab end $(date +%T)"
python3 -m lab.awkward --family scans --ops conv1d --cases 1500 --seed 93 --time-limit 150 --out "$log/awkward" \
  > "$log/awkward.txt" 2>&1
echo "awkward end $(date +%T)"
