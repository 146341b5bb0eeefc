rm -rf .git
OUT_DIR=$OUT bash lab/gpu_call.sh "
timeout 150 kcollect run lstm --provider triton --provider cudnn --provider eager --db \$KC_DB --commit 1bfb3eecbc5c14cd8b3b9c676e7efd0ad19f5d03 --commit-time 2026-11-29T09:32:33+00:00 > \$JOB_OUT/collect.txt 2>&1; tail -3 \$JOB_OUT/collect.txt;
timeout 90 python -m lab.cells_tune --ops lstm --modes fwd,bwd --only default,unsplit,split=4,hb_bwd=64 --peers cudnn --shape B=64,T=256,H=2048,resets=0 > \$JOB_OUT/tune.txt 2>&1;
timeout 130 python -m lab.awkward --family cells --ops lstm --cases 2000 --seed 14 --device cuda --workers 14 --time-limit 100 --grace 20 --out \$JOB_OUT/aw14 > \$JOB_OUT/aw14.log 2>&1; tail -9 \$JOB_OUT/aw14.log;
timeout 130 python -m lab.awkward --family cells --ops lstm --cases 2000 --seed 13 --device cuda --workers 14 --time-limit 100 --grace 20 --out \$JOB_OUT/aw13 > \$JOB_OUT/aw13.log 2>&1; tail -9 \$JOB_OUT/aw13.log
"
