#!/usr/bin/env bash
# Emulate the device's install here, on CPU: a fresh Python 3.11 venv holding only what the device has (the
# packages of make_carry.DEVICE_DISTS that this path needs, at the device's versions where they matter), the
# carry built for cp311 and installed with run.sh's own pip command, then the CPU dry run of mepic and of
# vanilla. A dependency the carry misses shows as an ImportError in a server log (OUT/logs.tar.gz).
#   bash eval/gpu/e2e/emulate.sh            # ~6 min; leaves /tmp/devemu, /tmp/devemu-site, /tmp/devemu-out
#   KEEP_CARRY=1 bash eval/gpu/e2e/emulate.sh   # reuse /tmp/carry311 instead of rebuilding it
#   bash eval/gpu/e2e/emulate.sh --clean    # remove all four folders
# Differences from the device, all forced by this machine: Python 3.11 (no cp312 CPU torch here), torch
# 2.13.0+cpu from /opt/wheels (device 2.11 CUDA), numpy 2.4.6 (2.5 needs Python >= 3.12), and, installed
# AFTER the carry, this project's CPU shims: sgl_kernel_stub over the CUDA stand-in (on CPU SGLang calls the
# CPU sgl_kernel ops) and torchvision_stub (the device has the real torchvision).
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
PY311=${PY311:-/root/.pyenv/versions/3.11.7/bin/python3.11}
HOSTPY=${HOSTPY:-$ROOT/.venv/bin/python}  # builds the carry and reads the device list
EMU=${EMU:-/tmp/devemu}
SITE=$EMU-site
OUT=${OUT:-$EMU-out}
CARRY=${CARRY:-/tmp/carry311}
TORCH_WHEEL=${TORCH_WHEEL:-$(ls /opt/wheels/torch-*+cpu-cp311-*.whl | head -1)}
if [ "${1:-}" = --clean ]; then rm -rf "$EMU" "$SITE" "$OUT" "$CARRY"; exit 0; fi
# What this path needs of the device's list (each must be in DEVICE_DISTS; their dependencies are resolved
# below and kept only where the device has them too).
ROOTS="accelerate transformers tokenizers safetensors huggingface-hub numpy requests httpx tqdm psutil pyyaml uvloop
prometheus-client aiohttp jinja2 pillow einops packaging filelock fsspec regex sentencepiece tiktoken anyio h11
httpcore idna certifi charset-normalizer urllib3 click typing-extensions triton msgpack cloudpickle rich pygments
markdown-it-py mdurl setuptools wheel pip scipy networkx sympy mpmath xxhash attrs frozenlist multidict yarl
aiosignal propcache aiohappyeyeballs protobuf nvidia-ml-py py-cpuinfo hf-xet markupsafe"
# The device's versions where they matter (make_carry.DEVICE_VERSIONS); the rest as requirements/cpu.lock.
DEVICE_PINS="transformers==5.17.0 triton==3.6.0 tokenizers==0.23.2 safetensors==0.8.0 huggingface-hub==1.33.0"

# run.sh's install, word for word; refuse to emulate one that no longer matches it
INSTALL='-m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target'
grep -qF -- "${INSTALL#-m }" eval/gpu/e2e/run.sh || { echo "run.sh installs differently now: update emulate.sh"; exit 2; }

echo "=== [$SECONDS s] the carry for cp311 -> $CARRY"
if [ -z "${KEEP_CARRY:-}" ] || [ ! -d "$CARRY/wheels" ]; then
  "$HOSTPY" -m eval.gpu.e2e.make_carry --python-version 3.11 --out "$CARRY" | tail -2
fi

echo "=== [$SECONDS s] the device's packages -> $EMU"
rm -rf "$EMU" "$SITE" "$OUT"
mkdir -p "$OUT"
"$PY311" -m venv "$EMU"
"$EMU/bin/pip" install -q --disable-pip-version-check --no-deps "$TORCH_WHEEL"
{ grep -E '^[A-Za-z0-9]' requirements/cpu.lock | sed 's/ *[;#].*//' \
    | grep -viE "^(torch|$(echo $DEVICE_PINS | sed 's/==[^ ]*//g; s/ /|/g'))=="; tr ' ' '\n' <<< "$DEVICE_PINS"; } \
  > "$OUT/constraints.txt"
"$EMU/bin/pip" install -q --disable-pip-version-check --dry-run --ignore-installed --report "$OUT/resolved.json" \
    -c "$OUT/constraints.txt" $ROOTS 2> >(grep -v "is ignored: it is neither" >&2)
# keep what the device has; name what it does not (a dependency of a device package that the device lacks)
"$HOSTPY" - "$OUT/resolved.json" "$ROOTS" > "$OUT/device_reqs.txt" <<'EOF'
import json, sys
from eval.gpu.e2e.make_carry import DEVICE_DISTS, canonical
device = {canonical(d) for d in DEVICE_DISTS}
roots = sys.argv[2].split()
assert all(canonical(r) in device for r in roots), [r for r in roots if canonical(r) not in device]
dropped = []
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if canonical(name) == "torch":
        continue
    if canonical(name) in device:
        print(f"{name}=={version}")
    else:
        dropped.append(f"{name}=={version}")
print("not on the device, left out:", ", ".join(dropped) or "none", file=sys.stderr)
EOF
"$EMU/bin/pip" install -q --disable-pip-version-check --no-deps -r "$OUT/device_reqs.txt" \
    2> >(grep -v "is ignored: it is neither" >&2)
echo "$(wc -l < "$OUT/device_reqs.txt") packages besides torch"

echo "=== [$SECONDS s] the carry, as run.sh installs it -> $SITE"
"$EMU/bin/python" $INSTALL "$SITE" "$CARRY"/wheels/*.whl > "$OUT/install.txt" 2>&1 || { cat "$OUT/install.txt"; exit 3; }
shim() {  # a CPU shim into the site, built from a copy (no build/ in the checkout)
  local tmp; tmp=$(mktemp -d)
  cp -r "shims/$1/pyproject.toml" "shims/$1/$2" "$tmp/"
  "$EMU/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation \
      --target "$SITE" "$tmp" > /dev/null
  rm -rf "$tmp"
}
echo "=== [$SECONDS s] emulation only, not in the carry: torchvision_stub (the device has torchvision)"
shim torchvision_stub torchvision
echo "=== [$SECONDS s] the carry's CUDA stand-in for sgl_kernel imports beside SGLang's layers"
PYTHONPATH="$SITE" "$EMU/bin/python" -W ignore -c 'import sys, sgl_kernel, sglang.srt.layers.layernorm, sglang.srt.layers.activation
assert sgl_kernel.__file__.startswith(sys.argv[1]) and "cpushim" not in str(getattr(sgl_kernel, "__version__", ""))' \
  "$SITE/sgl_kernel"
echo "=== [$SECONDS s] emulation only: sgl_kernel_stub over the stand-in (on CPU SGLang calls the CPU ops)"
rm -rf "$SITE"/sgl_kernel "$SITE"/sglang_mepic_sgl_kernel_standin-*.dist-info
shim sgl_kernel_stub sgl_kernel

rc=0
for system in mepic vanilla; do
  echo "=== [$SECONDS s] dry run: $system"
  args=(--smoke); [ "$system" = vanilla ] && args=(--systems vanilla --requests 16 --rates 4)
  PY="$EMU/bin/python" PYTHONPATH="$SITE:$ROOT" OUT="$OUT/$system" CARRY="$CARRY" \
    bash eval/gpu/e2e/run.sh --cpu "${args[@]}" --checks 3 --new-tokens 4 --pool-pages 1024 \
    > "$OUT/$system.txt" 2>&1 || rc=1
  grep -E "FAILED|: up in|warm vs cold|done in" "$OUT/$system.txt" | cut -c1-400 || true
  tar -xzOf "$OUT/$system/logs.tar.gz" 2>/dev/null | grep -o "Tree Core: .*" | head -1 || true
done
echo "=== [$SECONDS s] emulation $([ $rc = 0 ] && echo passed || echo FAILED): logs in $OUT"
exit $rc
