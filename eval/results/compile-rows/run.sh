#!/bin/bash
# Benchmarks for issue 47, run alone and in sequence. after: this checkout (run from its root);
# before: BEFORE, a checkout of 6409b92 with its own .venv. Each run writes its folder here
# (eval/results/compile-rows/<tag>; the runs of 2026-11 wrote them to a scratch folder and were copied).
set -u
AFTER=$PWD
BEFORE=${BEFORE:?set BEFORE to a checkout of 6409b92 with its own .venv}
M=$AFTER/models
R=$AFTER/eval/results/compile-rows
L=$R/run.log
run() {
  tag=$1; dir=$2; shift 2
  echo "== $tag start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $L
  (cd $dir && timeout 3600 .venv/bin/python -m "$@" > $R/$tag.out 2>&1); rc=$?
  echo "== $tag end $(date +%T) rc=$rc load $(cut -d' ' -f1-3 /proc/loadavg)" >> $L
}
Q16="eval.run --model $M/tiny-4l --dataset squad --qps 16 --chunks 7 --reuse 0.85 --requests 300 --pool-pages 16384 --repeats 3 --no-plots --new-tokens 16"
run qps16-after $AFTER $Q16 --systems mepic,epic-16 --out $R/qps16-after
run qps16-before $BEFORE $Q16 --systems mepic,epic-16 --out $R/qps16-before
SQ="eval.run --model $M/smollm2-135m --dataset squad --qps 0.3 --chunks 4 --reuse 0.88 --requests 30 --repeats 3 --no-plots"
run smol-squad-after $AFTER $SQ --systems vanilla,mepic --out $R/smol-squad-after
run smol-squad-before $BEFORE $SQ --systems mepic --out $R/smol-squad-before
run base-after $AFTER eval.run --model $M/tiny-4l --dataset squad --qps 2 --chunks 7 --reuse 0.85 --requests 300 --pool-pages 16384 --repeats 3 --no-plots --systems mepic --out $R/base-after
run profile-after $AFTER eval.scheduler_profile --systems vanilla,mepic,vanilla,mepic,vanilla,mepic --out $R/profile-after.txt
run agent-after $AFTER eval.agent --conversations 4 --turns 8 --repeats 3
echo "== all done $(date +%T)" >> $L
# Session 2 (afternoon), run alone the same way:
# run smol-hotpot-after $AFTER eval.run --model $M/smollm2-135m --dataset hotpotqa --qps 0.3 --chunks 4 --reuse 0.88 --requests 30 --repeats 3 --no-plots --systems vanilla,mepic --out $R/smol-hotpot-after
# run profile3-after $AFTER eval.scheduler_profile --systems vanilla,mepic,vanilla,mepic,vanilla,mepic --raw-dir $R/profile3-raw --out $R/profile3-after.txt
