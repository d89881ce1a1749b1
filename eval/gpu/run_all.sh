#!/usr/bin/env bash
# Everything in one device call, most valuable first; each step has a time limit so the later ones still run.
# On the device machine, from the repository root, with .gpu_carry carried:
#   bash .gpu_carry/run_all.sh [BUDGET_SECONDS]          (default 500; logs and JSON under $OUT)
# Steps: versions; correctness (bf16, fp16, fp32 in three parallel processes); the timing table (do_bench);
# registers/spills/grid; ncu (SpeedOfLight, Occupancy, LaunchStats) on decode B=8 and B=64 and two extends, with
# cos/sin on chip and from the table;
# the timing table again with CUDA graphs (--quick grid), if time is left.
# DEVICE=cpu bash .gpu_carry/run_all.sh: the same steps on tiny shapes under the Triton interpreter (no ncu, no
# graphs), to check the scripts here before spending device time. PY picks the python (default python3).
set -uo pipefail
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
CPU_ARGS=""; [ "$DEVICE" = cpu ] && CPU_ARGS="--device cpu --tiny"
BUDGET=${1:-500}
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
cd "$(dirname "$0")"
export PYTHONPATH=proj:sgl PYTHONUNBUFFERED=1
END=$((SECONDS + BUDGET))
SCALE=1; [ "$DEVICE" = cpu ] && SCALE=5  # the interpreter is slow: the steps' limits x5 there
left() { local want=$(($1 * SCALE)) l=$((END - SECONDS)); if [ "$l" -gt "$want" ]; then echo "$want"; else echo $((l > 5 ? l : 5)); fi; }
step() { echo; echo "=== [$SECONDS s] $*"; }

step "device and versions (project commit $(cat proj/COMMIT))"
if [ "$DEVICE" = cuda ]; then
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  command -v ncu && ncu --version | tail -1
fi
$PY -c 'import torch,triton;print("torch",torch.__version__,"triton",triton.__version__);torch.cuda.is_available() and print(torch.cuda.get_device_name(),torch.cuda.get_device_properties(0).multi_processor_count,"SMs")'

step "correctness: bf16 (and fp8 KV), fp16, fp32 in parallel"
t=$(left 200)
rm -f /tmp/ck_bf16.json /tmp/ck_fp16.json /tmp/ck_fp32.json
for dt in bf16 fp16 fp32; do
  dts=$dt; [ $dt = bf16 ] && dts=bf16,fp8  # fp8: an e4m3 pool with scales, its hidden slots NaN (issue 73)
  timeout "$t" $PY check_kernels.py $CPU_ARGS --dtypes $dts --json /tmp/ck_$dt.json 2>&1 | sed -u "s/^/[ck $dt] /" &
done
wait
$PY - "$OUT/check_kernels.json" <<'EOF'
import json, os, sys
rows, infos = [], []
for dt in ("bf16", "fp16", "fp32"):
    p = f"/tmp/ck_{dt}.json"
    if os.path.exists(p):
        d = json.load(open(p)); rows += d["rows"]; infos.append(d["info"])
    else:
        print(f"correctness {dt}: no result (timed out or crashed)")
bad = [r for r in rows if not r["ok"]]
print(f"CORRECTNESS: {len(rows) - len(bad)}/{len(rows)} ok")
for r in bad:
    print("FAILED", json.dumps(r))
json.dump(dict(info=infos, rows=rows), open(sys.argv[1], "w"), indent=1)
EOF

step "timing table: ours vs SGLang triton vs flash (do_bench)"
timeout "$(left 170)" $PY bench_peers.py $CPU_ARGS 2>&1

step "registers, spills, grid"
timeout "$(left 60)" $PY profile_kernels.py --rope both ${CPU_ARGS%--tiny} 2>&1
[ "$DEVICE" = cpu ] && { step "done (cpu: no ncu, no graphs)"; exit 0; }

step "ncu: SpeedOfLight, Occupancy, LaunchStats on _mepic_ kernels (decode B8, decode B64, extend 181/2197, extend 512/8192; cos/sin on chip, then from the table)"
NCU="ncu --section SpeedOfLight --section Occupancy --section LaunchStats -k regex:_mepic_ --launch-count 8"
timeout "$(left 100)" $NCU python3 profile_kernels.py --once --rope both > "$OUT/ncu.txt" 2>&1
rc=$?
if [ $rc -ne 0 ] || ! grep -q "Achieved Occupancy" "$OUT/ncu.txt"; then
  echo "ncu (default clock control) rc=$rc; tail:"; tail -5 "$OUT/ncu.txt"
  mv "$OUT/ncu.txt" /tmp/ncu_default.txt
  step "ncu again with --clock-control none"
  timeout "$(left 100)" $NCU --clock-control none python3 profile_kernels.py --once --rope both > "$OUT/ncu.txt" 2>&1
  echo "rc=$?"
fi
grep -E "^  _|^    (SM Frequency|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Grid Size|Registers Per|Waves Per SM|Theoretical Occ|Achieved Occ|Block Limit Reg)" "$OUT/ncu.txt" | head -120

step "timing table with CUDA graphs (--quick grid)"
timeout "$(left 200)" python3 bench_peers.py --graph --quick 2>&1

step "done"
