#!/usr/bin/env bash
# Create or complete the pinned CPU environment in .venv (idempotent).
#   scripts/setup_venv.sh [VENV_DIR]
# sglang 0.5.23 is installed without its CUDA dependencies; the full set is pinned
# in requirements/cpu.lock. The sgl_kernel/torchvision stand-ins are installed only
# when the real module cannot be imported.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${1:-$ROOT/.venv}
LOCK=$ROOT/requirements/cpu.lock
STAMP=$VENV/.sglang-mepic-installed
PY=${PYTHON:-python3}
UV_VERSION=0.13.9

"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is required"'
start=$SECONDS
echo "[setup] installing the pinned CPU environment into $VENV (about 2.3 GB)"
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"

pip() {
    # This machine's pip config lists local index folders that may not exist; hide that noise.
    "$VENV/bin/python" -m pip --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# uv installs the ~110 pinned wheels in parallel (seconds instead of minutes);
# pip is the fallback. uv does not read pip's config, so pass on its find-links
# (where this machine keeps the torch CPU wheel).
install=(pip install -q)
if pip install -q "uv==$UV_VERSION"; then
    install=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python")
    for dir in $(pip config get global.find-links 2>/dev/null || true); do
        install+=(--find-links "$dir")
    done
else
    echo "[setup] uv unavailable; installing with pip (slower)"
fi

"${install[@]}" --no-deps -r "$LOCK"
"${install[@]}" --no-deps --no-build-isolation -e "$ROOT"

for mod in sgl_kernel torchvision; do
    if ! "$VENV/bin/python" -c "import $mod" >/dev/null 2>&1; then
        echo "[setup] $mod cannot be imported here: installing its import-only stand-in"
        "${install[@]}" --no-deps --no-build-isolation "$ROOT/shims/${mod}_stub"
    fi
done

# Mooncake Store's client (the shared chunk tier, launch_cluster) links Debian's libibverbs1.
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "[setup] installing Debian's libibverbs1 (Mooncake's client needs it)"
        apt-get install -y -q libibverbs1 >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libibverbs1 >/dev/null; }
    else
        echo "[setup] Mooncake's client needs libibverbs1, which is missing: run 'apt-get install libibverbs1' as root" >&2
    fi
fi

# Byte-compile every installed module once. uv writes no .pyc files, and where PYTHONDONTWRITEBYTECODE
# is set (this workplace's machines set it) Python never caches one either: each process then compiled
# sglang, torch and transformers from source, about 25 s more per import of SGLang's scheduler on 2 cores,
# paid by the launcher, the scheduler and the detokenizer of every server. compileall skips what is
# already compiled, so a second run costs seconds; files that are not Python 3 (templates) are skipped.
echo "[setup] byte-compiling the installed modules"
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
"$VENV/bin/python" -c 'import sglang, sglang_mepic; print("[setup] sglang", sglang.__version__, "| sglang_mepic", sglang_mepic.__version__)'
touch "$STAMP"
echo "[setup] done in $((SECONDS - start)) s"
