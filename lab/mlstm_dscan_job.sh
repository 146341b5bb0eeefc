#!/usr/bin/env bash
# The job that measured d18de01 (the mLSTM backward's state gradients split into a chunk-parallel
# kernel and an element-wise scan over chunks; lab/results/mlstm_bwd_dscan_h200_d18de01.txt): now
# lab/mlstm_bwd_job.sh with the A/B of the state-gradient kernel's warps, 4 (l4) against 8 (l8). At
# d18de01 it timed four of the grid's shapes, without B16 NH8 T2048, under time limits 10-20 s longer.
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/mlstm_dscan_job.sh SHA T OLD SEED'
exec bash lab/mlstm_bwd_job.sh "$1" "$2" "$3" "$4" 'l4=changed(MLSTMConfig, state_warps_bwd=4)' \
  'l8=changed(MLSTMConfig, state_warps_bwd=8)'
