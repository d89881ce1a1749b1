#!/bin/bash
# Benchmarks for issue 47, run alone and in sequence. before: /tmp/before (6409b92, own venv); after: /work/main.
set -u
M=/work/main/models
L=/tmp/bench/log
run() {
  tag=$1; dir=$2; shift 2
  echo "== $tag start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $L
  (cd $dir && timeout 3600 .venv/bin/python -m "$@" > /tmp/bench/$tag.out 2>&1); rc=$?
  echo "== $tag end $(date +%T) rc=$rc load $(cut -d' ' -f1-3 /proc/loadavg)" >> $L
}
Q16="eval.run --model $M/tiny-4l --dataset squad --qps 16 --chunks 7 --reuse 0.85 --requests 300 --pool-pages 16384 --repeats 3 --no-plots --new-tokens 16"
run qps16-after /work/main $Q16 --systems mepic,epic-16 --out /tmp/bench/qps16-after
run qps16-before /tmp/before $Q16 --systems mepic,epic-16 --out /tmp/bench/qps16-before
SQ="eval.run --model $M/smollm2-135m --dataset squad --qps 0.3 --chunks 4 --reuse 0.88 --requests 30 --repeats 3 --no-plots"
run smol-squad-after /work/main $SQ --systems vanilla,mepic --out /tmp/bench/smol-squad-after
run smol-squad-before /tmp/before $SQ --systems mepic --out /tmp/bench/smol-squad-before
run base-after /work/main eval.run --model $M/tiny-4l --dataset squad --qps 2 --chunks 7 --reuse 0.85 --requests 300 --pool-pages 16384 --repeats 3 --no-plots --systems mepic --out /tmp/bench/base-after
run profile-after /work/main eval.scheduler_profile --systems vanilla,mepic,vanilla,mepic,vanilla,mepic --out /tmp/bench/profile-after.txt
run agent-after /work/main eval.agent --conversations 4 --turns 8 --repeats 3
echo "== all done $(date +%T)" >> $L
# Session 2 (afternoon; /tmp/bench/run2.sh), run alone the same way:
# run smol-hotpot-after /work/main eval.run --model $M/smollm2-135m --dataset hotpotqa --qps 0.3 --chunks 4 --reuse 0.88 --requests 30 --repeats 3 --no-plots --systems vanilla,mepic --out /tmp/bench/smol-hotpot-after
# run profile3-after /work/main eval.scheduler_profile --systems vanilla,mepic,vanilla,mepic,vanilla,mepic --raw-dir /tmp/bench/profile3-raw --out /tmp/bench/profile3-after.txt
