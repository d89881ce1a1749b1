#!/usr/bin/env bash
# The GPU end-to-end run, one device call. On the device machine, from the repository root, with the carry
# built here by `.venv/bin/python -m eval.gpu.e2e.make_carry` (device `run` with carry [".gpu_e2e"]):
#   set -o pipefail; bash eval/gpu/e2e/run.sh --smoke      # mepic alone, 16 requests: 187 s on an H200 (timeout_s 240)
#   set -o pipefail; bash eval/gpu/e2e/run.sh --part 1     # vanilla, mepic (timeout_s 570)
#   set -o pipefail; bash eval/gpu/e2e/run.sh --part 2     # full, epic-16, recompute-all (timeout_s 570)
#   set -o pipefail; bash eval/gpu/e2e/run.sh --part 4     # issue 69: vanilla, mepic, sync check, graphs vs eager,
#                                                           # decode profile, TTFT parts (timeout_s 590)
#   set -o pipefail; bash eval/gpu/e2e/run.sh capacity --part 1   # issue 71: capacity, SQuAD at 2,048 pages, vanilla
#                                                           # and mepic (capacity.py: parts 1-4; timeout_s 590)
# Other arguments go to drive.py (--rates, --requests, --budget, ...), or after `capacity` to capacity.py.
# Everything lands in $OUT: log.txt, results.json, table.md, logs.tar.gz, install.txt (capacity: capacity-*/).
# Here, without CUDA, the dry run of the same steps (the .venv has everything; no install):
#   bash eval/gpu/e2e/run.sh --cpu --smoke
#   bash eval/gpu/e2e/run.sh capacity --cpu --part 1 --requests 12 --max-probes 1
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/e2e_out}
CARRY=${CARRY:-.gpu_e2e}
SITE=${SITE:-/tmp/mepic-site}
# The script's own settings, passed on as arguments: kept out of the servers' environment (under the test
# suite's fork server a server whose environment differs starts cold).
export -n OUT CARRY SITE PY 2>/dev/null || true
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
MODULE=eval.gpu.e2e.drive
if [ "${1:-}" = capacity ]; then MODULE=eval.gpu.e2e.capacity; shift; fi
CPU=0
for arg in "$@"; do [ "$arg" = --cpu ] && CPU=1; done
if [ "$CPU" = 1 ]; then
  PY=${PY:-.venv/bin/python}
else
  PY=${PY:-python3}
  [ -d "$CARRY/wheels" ] || { echo "no $CARRY/wheels: build the carry here first (python -m eval.gpu.e2e.make_carry)"; exit 2; }
  echo "=== [$SECONDS s] install $(ls "$CARRY"/wheels/*.whl | wc -l) wheels into $SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$CARRY"/wheels/*.whl > "$OUT/install.txt" 2>&1 || { cat "$OUT/install.txt"; exit 3; }
  export PYTHONPATH="$SITE:$PWD"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  echo "nvcc: $(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1 || echo none); /dev/shm: $(df -h /dev/shm | tail -1)"
  "$PY" -c 'import importlib.util as u; print("importable:", {m: bool(u.find_spec(m)) for m in ("tvm_ffi", "cutlass", "flashinfer", "sgl_kernel")})'
fi
echo "=== [$SECONDS s] imports"
"$PY" -c 'import sglang, sgl_kernel, sglang_mepic, torch, triton
print("sglang", sglang.__version__, "| sgl_kernel", getattr(sgl_kernel, "__version__", "?"), sgl_kernel.__file__,
      "| sglang_mepic", sglang_mepic.__version__, "| torch", torch.__version__, "| triton", triton.__version__)' \
  || exit 4
echo "=== [$SECONDS s] $MODULE $*"
"$PY" -m "$MODULE" --carry "$CARRY" --out "$OUT" "$@" 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
echo "=== [$SECONDS s] done, rc $rc"
exit "$rc"
