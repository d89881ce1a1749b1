#!/usr/bin/env bash
# Build .gpu_carry/ in the project checkout: what the GPU harness in eval/gpu needs on a device machine that
# has torch and triton but no SGLang and no project install.
#   eval/gpu/make_carry.sh [--worktree]     (once `make venv` has built .venv)
# By default the project files are taken as committed at HEAD (`git show`), so what is measured is a commit;
# --worktree takes the working tree's files instead, and COMMIT then says "+dirty" if they differ from HEAD.
# .gpu_carry/proj: the project's kernels (as sglang_mepic.kernels) and the torch modules they are checked
#                  against (sglang_mepic.{attention,rope,layout}: torch + triton only), COMMIT.
# .gpu_carry/sgl:  SGLang's own Triton attention kernels, copied unmodified from .venv, with stubs for the
#                  sglang.srt helpers they import (SOURCE says from where).
# .gpu_carry/*.py, run_all.sh: this folder's scripts. `.gpu_carry/` is git-ignored (.git/info/exclude).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
sgl=$(ls -d "$root"/.venv/lib/python3*/site-packages/sglang | head -1)
out=$root/.gpu_carry
rm -rf "$out" && mkdir -p "$out/proj/sglang_mepic/kernels" "$out/sgl/sglang/kernels/ops/attention" "$out/sgl/sglang/srt"
files="sglang_mepic/kernels/__init__.py sglang_mepic/kernels/attention.py sglang_mepic/kernels/aot.py sglang_mepic/kernels/occupancy.py sglang_mepic/__init__.py sglang_mepic/attention/reference.py
       sglang_mepic/attention/rope.py sglang_mepic/wire/layout.py sglang_mepic/config.py sglang_mepic/modes.py"
commit=$(git -C "$root" rev-parse --short HEAD)
for f in $files; do
  dest="$out/proj/sglang_mepic/${f#sglang_mepic/}"
  mkdir -p "$(dirname "$dest")"  # the package's parts are folders (attention/, wire/, kernels/)
  if [ "${1:-}" = --worktree ]; then cp "$root/$f" "$dest"; else git -C "$root" show "HEAD:$f" > "$dest"; fi
done
if [ "${1:-}" = --worktree ] && ! git -C "$root" diff --quiet HEAD -- $files; then
  commit="$commit+dirty"  # never pin a measurement to a commit it did not run
fi
echo "$commit" > "$out/proj/COMMIT"
for f in decode_attention extend_attention score_mod metadata; do
  cp "$sgl/kernels/ops/attention/$f.py" "$out/sgl/sglang/kernels/ops/attention/"
done
cp "$here/stubs/"*.py "$out/sgl/sglang/srt/"
for d in sglang sglang/kernels sglang/kernels/ops sglang/kernels/ops/attention sglang/srt; do touch "$out/sgl/$d/__init__.py"; done
"$root/.venv/bin/python" -c "import sglang; print('sglang', sglang.__version__, sglang.__file__)" > "$out/sgl/SOURCE"
cp "$here/"*.py "$here/run_all.sh" "$out/"
exclude=$(git -C "$root" rev-parse --absolute-git-dir)/info/exclude
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu_carry/' "$exclude" 2>/dev/null || echo '/.gpu_carry/' >> "$exclude"
echo "carry: $(du -sh "$out" | cut -f1), project commit $commit"
