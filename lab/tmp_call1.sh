rm -rf .git
OUT_DIR=$OUT bash lab/gpu_call.sh "
timeout 90 python -m pytest -q -p no:cacheprovider tests/test_lstm.py -k 'persistent or split' > \$JOB_OUT/pytest.txt 2>&1; tail -3 \$JOB_OUT/pytest.txt;
timeout 200 python -m lab.cells_tune --ops lstm --modes bwd --only default,split --peers cudnn > \$JOB_OUT/tune.txt 2>&1; tail -5 \$JOB_OUT/tune.txt;
timeout 120 kcollect run lstm --provider triton --provider cudnn --provider eager --db \$KC_DB --commit bb0b40457921779bb95c54207c28704ebb3e6a02 --commit-time 2026-11-29T09:12:20+00:00 > \$JOB_OUT/collect.txt 2>&1; tail -5 \$JOB_OUT/collect.txt;
timeout 150 python -m lab.awkward --family cells --ops lstm --cases 2000 --seed 13 --device cuda --workers 14 --time-limit 110 --grace 25 --out \$JOB_OUT/aw13 > \$JOB_OUT/aw13.log 2>&1; tail -12 \$JOB_OUT/aw13.log;
kcollect run --all --dry-run > \$JOB_OUT/dryrun.txt 2>&1; tail -3 \$JOB_OUT/dryrun.txt
"
