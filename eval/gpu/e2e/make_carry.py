"""Build the carry of the GPU end-to-end run: what the device machine lacks, in `.gpu_e2e/` (git-ignored).

    .venv/bin/python -m eval.gpu.e2e.make_carry [--out .gpu_e2e] [--wheels-cache DIR]
    .venv/bin/python -m eval.gpu.e2e.make_carry --discover      # re-derive carry_requirements.txt's list
    .venv/bin/python -m eval.gpu.e2e.make_carry --python-version 3.11 --out /tmp/carry311   # emulate.sh's

The device has Python 3.12, torch, triton, transformers and the rest of its list (DEVICE_DISTS) but no SGLang,
no sgl_kernel, no web stack and no network; the device tool copies the working tree (tracked files and
untracked files git does not ignore) plus the carry, 64 MiB in all. The carry:

  wheels/         SGLang 0.5.23's cp312 wheel, trimmed of what a text-model HTTP server never imports (TRIM;
                  RECORD rewritten); each dependency of carry_requirements.txt as a cp312 manylinux or pure
                  wheel; the sgl_kernel stand-in (sgl_kernel_standin/) and this project's wheel, both built here.
  model/          SmolLM2's tokenizer files (not its weights: drive.py writes its own config and weights).
  workload.json   the requests (`python -m eval.gpu.e2e.workload`).
  capacity.json.xz  the capacity runs' prompts, per workload and seed (the same command; eval/gpu/e2e/capacity.py).
  COMMIT          the project commit, `+dirty` if sglang_mepic/ or eval/ differ from it.
  MANIFEST.txt    every wheel with version, size and sha256; what was trimmed and why; the totals.

It refuses (exit status 1) a carry over 60 MiB or a travelling total (tree + carry) over 64 MiB.

`--discover` derives the dependency list: it starts real CPU servers (mepic, and vanilla SGLang) on the tiny
model with a sitecustomize that records every process's sys.modules, serves a few requests, maps the imported
top-level modules to distributions and subtracts the device's; then it scans the sources of the SGLang modules
so imported for imports that only the CUDA path reaches (not run here), for a reader to decide on. The reviewed
result is carry_requirements.txt (NAME==VERSION  # why), which the builder reads.
"""

import argparse
import ast
import base64
import csv
import datetime
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
MiB = 2 ** 20
CARRY_LIMIT = 60 * MiB  # the carry alone
TRAVEL_LIMIT = 64 * MiB  # tree + carry: what the device tool copies
EXCLUDE_LINE = "/.gpu_e2e/"
DEFAULT_OUT = ROOT / ".gpu_e2e"
DEFAULT_CACHE = Path.home() / ".cache" / "sglang-mepic" / "gpu-carry-wheels"
REQUIREMENTS = HERE / "carry_requirements.txt"
STANDIN = HERE / "sgl_kernel_standin"
LOCK = ROOT / "requirements" / "cpu.lock"
TOKENIZER = ROOT / "models" / "smollm2-135m"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                   "special_tokens_map.json")
# Where the project wheel is built from (copied to a temporary folder first: no build/ in the checkout).
PROJECT_FILES = ("pyproject.toml", "README.md", "sglang_mepic")
DIRTY_PATHS = ("sglang_mepic", "eval")

SGLANG = ("sglang", "0.5.23")
PYTHON = "3.12"  # the device's; --python-version builds for another (emulate.sh: 3.11, this machine's)
# pip download's platforms: the common ones first; the second set only where a package has none of those
# (pip matches manylinux_2_N exactly, so each N is named).
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
MORE_PLATFORMS = ["manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
                  "manylinux_2_35_x86_64"]

# The device's Python distributions (2026-11-17), and the versions seen of a few.
DEVICE_DISTS = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub
humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping
jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx
onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
DEVICE_VERSIONS = {"numpy": "2.5.2", "torch": "2.11.0", "transformers": "5.17.0", "triton": "3.6.0",
                   "tokenizers": "0.23.2", "safetensors": "0.8.0", "huggingface-hub": "1.33.0"}
# Distributions the carry brings as something other than a PyPI wheel of carry_requirements.txt.
BUILT_HERE = {"sglang": "SGLang's wheel, trimmed", "sglang-mepic": "this project's wheel",
              "sglang-mepic-sgl-kernel-stub": "the sgl_kernel stand-in replaces the CPU stub",
              "sglang-mepic-torchvision-stub": "the device has torchvision"}

# What a text-model HTTP server (Llama, triton or mepic attention, no grpc, no multimodal, no router, no
# disaggregation) never imports, checked by --discover against the import closure of real servers; the
# builder lists, per rule, the kept files that still name what it removed (lazily, behind a flag).
TRIM = [
    ("sglang/srt/rust_extensions/_server.*.so",
     "the Rust HTTP front end: loaded only with SGLANG_RUST_SERVER=1 (sglang.srt.rust_server, lazily)"),
    ("sglang/srt/rust_extensions/_grpc.*.so",
     "gRPC: loaded only with --grpc-port / gRPC modes (http_server._start_native_grpc_server_for_runtime, "
     "utils.common.start_follower_grpc_server, lazily)"),
    ("sglang/srt/rust_extensions/_multimodal.*.so",
     "image preprocessing of multimodal models (srt/multimodal/processors, lazily)"),
    ("sglang/srt/rust_extensions/_bench.*.so", "bench_serving's Rust client (sglang.benchmark, lazily)"),
    ("sglang/multimodal_gen/*", "diffusion serving (`sglang generate`, sglang.cli): not imported by sglang.srt"),
    ("sglang/test/*", "SGLang's test suite: sglang.srt imports it only with SGLANG_TEST_SCRIPTED_RUNTIME or "
                      "under TYPE_CHECKING"),
    ("sglang/benchmark/*", "benchmark scripts (sglang.bench_serving et al.): not imported by sglang.srt"),
    ("sglang/bench_*.py", "benchmark entry points, wrappers of sglang.benchmark"),
]
# --no-rust-tree-core: also drop the Rust TreeCore of the default (unified) radix cache. SGLang then logs
# "Using the Python TreeCore: this installation contains neither the Rust TreeCore extension nor its sources"
# and vanilla runs the Python TreeCore; with no native code left the wheel is retagged py3-none-any.
TREE_CORE = ("sglang/srt/mem_cache/rust_tree_core/mem_cache.*.so",
             "the Rust TreeCore (--no-rust-tree-core): vanilla's unified radix cache falls back to the Python "
             "TreeCore (tree_core_registry._rust_fallback_reason)")


class CarryError(SystemExit):
    """A refused build, with one clear message (exit status 1)."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(f"make_carry: error: {message}")


def log(msg: str, file=None) -> None:
    print(f"[carry] {msg}", file=file or sys.stdout, flush=True)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB"


# ---------------------------------------------------------------- git

def git(*args: str, root: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def exclude_path(root: Path = ROOT) -> Path:
    path = Path(git("rev-parse", "--git-path", "info/exclude", root=root).strip())
    return path if path.is_absolute() else root / path


def ensure_excluded(exclude: Path, line: str = EXCLUDE_LINE) -> bool:
    """Add `line` to a git exclude file once (the file and its folder made if missing); True if added."""
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.is_file() else ""
    if line in (entry.strip() for entry in text.splitlines()):
        return False
    if text and not text.endswith("\n"):
        text += "\n"
    exclude.write_text(text + line + "\n")
    return True


def commit_id(root: Path = ROOT) -> str:
    commit = git("rev-parse", "--short", "HEAD", root=root).strip()
    dirty = git("status", "--porcelain", "--untracked-files=normal", "--", *DIRTY_PATHS, root=root).strip()
    return commit + ("+dirty" if dirty else "")


def tree_bytes(root: Path = ROOT, skip: Path | None = None) -> int:
    """What the device tool copies of the checkout: tracked files and untracked files git does not ignore
    (and shared/, where there is one), without `skip` (the carry, counted apart)."""
    names = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", root=root).split("\0")
    paths = {root / n for n in names if n}
    shared = root / "shared"
    if shared.is_dir():
        paths.update(p for p in shared.rglob("*") if p.is_file())
    total = 0
    for p in paths:
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if p.is_symlink():
            total += len(os.readlink(p))
        elif p.is_file():
            total += p.stat().st_size
    return total


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def check_limits(carry: int, travelling: int, carry_limit: int = CARRY_LIMIT,
                 travel_limit: int = TRAVEL_LIMIT) -> None:
    """Refuse a carry over 60 MiB, or a tree + carry over 64 MiB, with what to do about it."""
    problems = []
    if carry > carry_limit:
        problems.append(f"the carry is {mib(carry)}, over its limit of {mib(carry_limit)}: trim more "
                        f"(TRIM) or carry fewer wheels")
    if travelling > travel_limit:
        problems.append(f"the travelling total (working tree + carry) is {mib(travelling)}, over the device "
                        f"tool's {mib(travel_limit)}: the tree is {mib(travelling - carry)}; shrink it "
                        f"(untracked files count too) or the carry")
    if problems:
        raise CarryError("; ".join(problems))


# ---------------------------------------------------------------- wheels

def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dist_info(names) -> str:
    """The .dist-info folder of a wheel, from its member names."""
    found = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info") and n.count("/") == 1}
    if len(found) != 1:
        raise ValueError(f"a wheel has exactly one top-level .dist-info folder, not {sorted(found)}")
    return found.pop()


def trim_wheel(src: Path, dest_dir: Path, rules: list[tuple[str, str]], pure: bool = False):
    """Copy wheel `src` into `dest_dir` without the members matching `rules` (fnmatch patterns on the paths
    in the archive), RECORD rewritten for what is kept. pure: no native code may remain, and the wheel is
    retagged py3-none-any. Returns (the new wheel, {reason: [(path, size), ...]})."""
    removed: dict[str, list[tuple[str, int]]] = {}
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        info_dir = dist_info(i.filename for i in infos)
        record = f"{info_dir}/RECORD"
        signatures = {f"{info_dir}/RECORD.jws", f"{info_dir}/RECORD.p7s"}
        kept = []
        for info in infos:
            if info.is_dir():  # folder entries: pip needs none
                continue
            if info.filename in signatures:  # a signature of the old RECORD would not verify
                removed.setdefault("a signature of the original RECORD", []).append((info.filename, info.file_size))
                continue
            reason = next((why for pattern, why in rules if fnmatch.fnmatchcase(info.filename, pattern)), None)
            if reason is None:
                kept.append(info)
            else:
                removed.setdefault(reason, []).append((info.filename, info.file_size))
        name = src.name
        if pure:
            native = [i.filename for i in kept if i.filename.endswith((".so", ".pyd", ".dylib"))]
            if native:
                raise ValueError(f"cannot retag {src.name} py3-none-any: native code remains: {native[:5]}")
            name = "-".join(src.name.split("-")[:2]) + "-py3-none-any.whl"
        dest_dir.mkdir(parents=True, exist_ok=True)
        dest = dest_dir / name
        rows = []
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in kept:
                if info.filename == record:
                    continue
                data = zin.read(info)
                if pure and info.filename == f"{info_dir}/WHEEL":
                    data = retag_wheel_file(data)
                out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                out.external_attr = info.external_attr
                out.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(out, data, compresslevel=9)
                rows.append((info.filename, record_hash(data), str(len(data))))
            rows.append((record, "", ""))
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            out = zipfile.ZipInfo(record, date_time=(1980, 1, 1, 0, 0, 0))
            out.external_attr = 0o644 << 16
            zout.writestr(out, buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
    return dest, removed


def retag_wheel_file(data: bytes) -> bytes:
    lines = [line for line in data.decode().splitlines()
             if line.strip() and not line.startswith(("Tag:", "Root-Is-Purelib:"))]  # a blank line ends the headers
    lines += ["Root-Is-Purelib: true", "Tag: py3-none-any"]
    return ("\n".join(lines) + "\n").encode()


def check_record(wheel: Path) -> list[str]:
    """What is wrong with a wheel's RECORD: members missing from it, entries without a member, bad hashes."""
    problems = []
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        record = f"{dist_info(names)}/RECORD"
        rows = {row[0]: row for row in csv.reader(io.StringIO(z.read(record).decode())) if row}
        for n in names:
            if n not in rows:
                problems.append(f"{n}: not in RECORD")
            elif n != record:
                data = z.read(n)
                if rows[n][1] != record_hash(data) or rows[n][2] != str(len(data)):
                    problems.append(f"{n}: hash or size differs from RECORD")
        problems += [f"{n}: in RECORD, not in the wheel" for n in rows if n not in names]
    return problems


def wheel_tags(filename: str):
    from packaging.utils import parse_wheel_filename

    name, version, _, tags = parse_wheel_filename(filename)
    return canonical(str(name)), str(version), tags


GLIBC_OF = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def cpython_tag(python: str) -> str:
    """'3.12' -> 'cp312'."""
    m = re.fullmatch(r"3\.(\d+)", python)
    if not m:
        raise ValueError(f"a Python version is 3.N, not {python!r}")
    return f"cp3{m.group(1)}"


def device_glibc(filename: str, python: str = PYTHON) -> tuple[int, int] | None:
    """The lowest glibc under which a wheel installs on the device (CPython `python`, 3.12 unless told,
    Linux x86_64): (0, 0) for a pure wheel, None if it cannot install there at all."""
    _, _, tags = wheel_tags(filename)
    cp = cpython_tag(python)
    minor = int(cp[3:])
    best = None
    for tag in tags:
        interp, abi, plat = tag.interpreter, tag.abi, tag.platform
        if abi == "none":
            ok = interp in ("py3", "py" + cp[2:], cp)
        elif abi == "abi3":
            m = re.fullmatch(r"cp3(\d+)", interp)
            ok = bool(m) and int(m.group(1)) <= minor
        else:
            ok = interp == cp and abi == cp
        if not ok:
            continue
        if plat == "any":
            glibc = (0, 0)
        else:
            m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", plat)
            legacy = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_x86_64", plat)
            if m:
                glibc = (int(m.group(1)), int(m.group(2)))
            elif legacy:
                glibc = GLIBC_OF[legacy.group(1)]
            else:
                continue
        best = glibc if best is None else min(best, glibc)
    return best


def cached_wheel(cache: Path, name: str, version: str, python: str = PYTHON) -> Path | None:
    """A cached wheel of name==version that installs on CPython `python`; one tagged for exactly that Python
    first (the cache may also hold another Python's abi3 wheel of the same release, which would do too)."""
    if not cache.is_dir():
        return None
    found = []
    for f in sorted(cache.glob("*.whl")):
        try:
            n, v, tags = wheel_tags(f.name)
        except ValueError:
            continue
        if n == canonical(name) and v == version and device_glibc(f.name, python) is not None:
            found.append((not any(t.interpreter == cpython_tag(python) for t in tags), f.name, f))
    return min(found)[2] if found else None


def fetch_wheel(name: str, version: str, cache: Path, python: str = PYTHON) -> Path:
    """The device-compatible wheel of name==version (for CPython `python`), from the cache or downloaded into it."""
    found = cached_wheel(cache, name, version, python)
    if found:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    errors = ""
    for platforms in (PLATFORMS, PLATFORMS + MORE_PLATFORMS):
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", "--python-version", python, "--implementation", "cp", "--abi",
               cpython_tag(python), "--abi", "abi3", "--abi", "none",
               *[a for p in platforms for a in ("--platform", p)], "-d", str(cache), f"{name}=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        found = cached_wheel(cache, name, version, python)
        if done.returncode == 0 and found:
            return found
        errors = (done.stdout + done.stderr)[-1500:]
    raise CarryError(f"no {cpython_tag(python)} manylinux x86_64 or pure wheel of {name}=={version} could be downloaded:\n{errors}")


def read_requirements(path: Path = REQUIREMENTS) -> list[tuple[str, str, str]]:
    """(name, version, why) of each `NAME==VERSION  # why` line."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        spec, _, why = line.partition("#")
        spec = spec.strip()
        if not spec:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", spec)
        if not m:
            raise CarryError(f"{path}:{number}: expected NAME==VERSION  # why, not {line!r}")
        out.append((m.group(1), m.group(2), why.strip()))
    return out


def lock_versions(path: Path = LOCK) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def build_wheel(source: Path, dest: Path, scratch: Path, names=None) -> Path:
    """`pip wheel --no-deps --no-build-isolation` of a copy of `source` (only `names` of it, if given), so
    that no build/ or .egg-info lands in the checkout."""
    copy = scratch / source.name
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", "dist")
    if names is None:
        shutil.copytree(source, copy, ignore=ignore)
    else:
        copy.mkdir(parents=True)
        for n in names:
            p = source / n
            if p.is_dir():
                shutil.copytree(p, copy / n, ignore=ignore)
            elif p.is_file():
                shutil.copy2(p, copy / n)
    out = scratch / (source.name + "-wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(copy)], capture_output=True, text=True)
    wheels = sorted(out.glob("*.whl")) if out.is_dir() else []
    if done.returncode != 0 or len(wheels) != 1:
        raise CarryError(f"pip wheel {source} failed:\n{(done.stdout + done.stderr)[-2000:]}")
    dest.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(wheels[0], dest / wheels[0].name))


# The package's parts (sglang_mepic/README.md): a wheel that lacks one fails at the first import.
# Every part of the package as the tree has it: one left out of pyproject.toml's list fails the wheel's check.
SUBPACKAGES = tuple(sorted(p.parent.relative_to(ROOT / "sglang_mepic").as_posix()
                           for p in (ROOT / "sglang_mepic").glob("*/**/__init__.py")))


def check_project_wheel(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = dist_info(names)
        entry = z.read(f"{info}/entry_points.txt").decode() if f"{info}/entry_points.txt" in names else ""
    need = ["sglang_mepic/__init__.py", "sglang_mepic/plugin.py", "sglang_mepic/kernels/__init__.py",
            "sglang_mepic/patches/__init__.py", "sglang_mepic/gate/data/calibration.json",
            *(f"sglang_mepic/{part}/__init__.py" for part in SUBPACKAGES)]
    missing = [n for n in need if n not in names]
    if not re.search(r"^\[sglang\.srt\.plugins\]\s*$", entry, re.M) or \
            not re.search(r"^mepic\s*=\s*sglang_mepic\.plugin:register\s*$", entry, re.M):
        missing.append("entry point sglang.srt.plugins: mepic = sglang_mepic.plugin:register")
    if missing:
        raise CarryError(f"the project wheel {wheel.name} lacks {missing}")


def rule_module(pattern: str) -> str:
    """The module a TRIM pattern removes, as a dotted name or a glob of one."""
    if pattern.endswith("/*"):
        return pattern[:-2].replace("/", ".")
    if pattern.endswith(".*.so"):
        return pattern[:-5].replace("/", ".")
    return pattern.removesuffix(".py").replace("/", ".")


def trimmed_module(module: str, rules) -> bool:
    for pattern, _ in rules:
        mod = rule_module(pattern)
        if fnmatch.fnmatchcase(module, mod) or (pattern.endswith("/*") and module.startswith(mod + ".")):
            return True
    return False


def references(wheel: Path, rules: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Per rule, the kept .py files of the trimmed wheel that still name a module it removed."""
    regexes = {why: re.compile(re.escape(rule_module(pattern)).replace(r"\*", r"\w*") + r"\b")
               for pattern, why in rules}
    found: dict[str, list[str]] = {why: [] for why in regexes}
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if not n.endswith(".py"):
                continue
            text = z.read(n).decode(errors="replace")
            for why, regex in regexes.items():
                if regex.search(text):
                    found[why].append(n)
    return found


# ---------------------------------------------------------------- the build

def build(out: Path, cache: Path, standin: Path = STANDIN, requirements: Path = REQUIREMENTS,
          tokenizer: Path = TOKENIZER, no_rust_tree_core: bool = False, python: str = PYTHON) -> dict:
    started = time.perf_counter()
    try:
        cpython_tag(python)  # a bad version is refused before anything is built
    except ValueError as e:
        raise CarryError(str(e)) from None
    if not (standin / "pyproject.toml").is_file() and not (standin / "setup.py").is_file():
        raise CarryError(f"the sgl_kernel stand-in is missing: {standin} has no pyproject.toml (it is written "
                         f"beside this builder, eval/gpu/e2e/sgl_kernel_standin/); nothing was built")
    if not requirements.is_file():
        raise CarryError(f"{requirements} is missing (python -m eval.gpu.e2e.make_carry --discover derives it)")
    missing = [f for f in ("tokenizer.json", "tokenizer_config.json") if not (tokenizer / f).is_file()]
    if missing:
        raise CarryError(f"{tokenizer} lacks {missing}: build it with `python -m sglang_mepic.models smollm2-135m`")
    reqs = read_requirements(requirements)
    out = out.resolve()
    if out.exists():
        if any(out.iterdir()) and not (out / "MANIFEST.txt").is_file() and not (out / "wheels").is_dir():
            raise CarryError(f"{out} exists and is not a carry (no MANIFEST.txt, no wheels/): not overwriting it")
        shutil.rmtree(out)
    if out.parent == ROOT or ROOT in out.parents:
        if ensure_excluded(exclude_path(), "/" + out.relative_to(ROOT).as_posix() + "/"):
            log(f"added /{out.relative_to(ROOT).as_posix()}/ to {exclude_path()}")
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    manifest = {"wheels": [], "trimmed": {}, "references": {}}
    rules = TRIM + ([TREE_CORE] if no_rust_tree_core else [])

    # SGLang, trimmed
    src = fetch_wheel(*SGLANG, cache, python)
    sgl, removed = trim_wheel(src, wheels, rules, pure=no_rust_tree_core)
    problems = check_record(sgl)
    if problems:
        raise CarryError(f"the trimmed {sgl.name} has a bad RECORD: {problems[:5]}")
    manifest["sglang_source"] = (src.name, src.stat().st_size, sha256(src))
    manifest["trimmed"] = removed
    manifest["references"] = references(sgl, rules)
    manifest["wheels"].append((sgl, "SGLang itself, trimmed (below)"))
    log(f"{src.name}: {mib(src.stat().st_size)} -> {sgl.name}: {mib(sgl.stat().st_size)}")

    # the dependencies the device lacks
    pins = lock_versions()
    for name, version, why in reqs:
        pinned = pins.get(canonical(name))
        if pinned and pinned != version:
            raise CarryError(f"{requirements.name}: {name}=={version}, but {LOCK.name} pins {pinned}")
        wheel = Path(shutil.copy2(fetch_wheel(name, version, cache, python), wheels))
        manifest["wheels"].append((wheel, why))
    log(f"{len(reqs)} dependency wheels")

    with tempfile.TemporaryDirectory(prefix="mepic-carry-") as scratch:
        scratch = Path(scratch)
        kernel = build_wheel(standin, wheels, scratch)
        with zipfile.ZipFile(kernel) as z:
            if "sgl_kernel/__init__.py" not in z.namelist():
                raise CarryError(f"the stand-in wheel {kernel.name} has no sgl_kernel/__init__.py")
        manifest["wheels"].append((kernel, "the CUDA stand-in for sgl_kernel (eval/gpu/e2e/sgl_kernel_standin)"))
        project = build_wheel(ROOT, wheels, scratch, PROJECT_FILES)
        check_project_wheel(project)
        manifest["wheels"].append((project, "this project: sglang_mepic, its kernels and patches, the plugin"))

    for wheel, _ in manifest["wheels"]:
        if device_glibc(wheel.name, python) is None:
            raise CarryError(f"{wheel.name} does not install on CPython {python} / Linux x86_64")
    names = [wheel_tags(w.name)[0] for w, _ in manifest["wheels"]]
    doubles = sorted({n for n in names if names.count(n) > 1})
    if doubles:
        raise CarryError(f"two wheels of {doubles}")

    model = out / "model"
    model.mkdir()
    copied = [f for f in TOKENIZER_FILES if (tokenizer / f).is_file()]
    for f in copied:
        shutil.copy2(tokenizer / f, model / f)
    done = subprocess.run([sys.executable, "-m", "eval.gpu.e2e.workload", "--tokenizer", str(tokenizer),
                           "--out", str(out / "workload.json"), "--capacity-out", str(out / "capacity.json.xz")],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise CarryError(f"eval.gpu.e2e.workload failed:\n{(done.stdout + done.stderr)[-2000:]}")
    log(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "workload written")
    commit = commit_id()
    (out / "COMMIT").write_text(commit + "\n")

    carry = folder_bytes(out)
    tree = tree_bytes(ROOT, skip=out)
    info = {"out": out, "python": python, "commit": commit, "model": copied, "carry": carry, "tree": tree,
            "travelling": carry + tree, "seconds": round(time.perf_counter() - started, 1), **manifest}
    text = manifest_text(info, rules)
    (out / "MANIFEST.txt").write_text(text)
    info["carry"] = folder_bytes(out)  # the manifest itself counts
    info["travelling"] = info["carry"] + tree
    log(f"carry {mib(info['carry'])} (limit {mib(CARRY_LIMIT)}), tree {mib(tree)}, travelling total "
        f"{mib(info['travelling'])} (limit {mib(TRAVEL_LIMIT)}); {len(manifest['wheels'])} wheels -> {out}")
    check_limits(info["carry"], info["travelling"])
    return info


def manifest_text(info: dict, rules) -> str:
    out = info["out"]
    python = info.get("python", PYTHON)
    glibc = max((device_glibc(w.name, python), w.name) for w, _ in info["wheels"])
    lines = ["# The GPU end-to-end carry (eval/gpu/e2e/make_carry.py)",
             f"built: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
             f"commit: {info['commit']}",
             f"python: {cpython_tag(python)}, Linux x86_64; highest glibc needed: "
             f"{'.'.join(map(str, glibc[0]))} ({glibc[1]})", "",
             f"## wheels ({len(info['wheels'])}), installed with pip --no-index --no-deps --target", ""]
    for wheel, why in info["wheels"]:
        name, version, _ = wheel_tags(wheel.name)
        lines.append(f"{wheel.name}  {name} {version}  {wheel.stat().st_size} bytes  sha256 {sha256(wheel)}")
        lines.append(f"    {why}")
    src = info["sglang_source"]
    lines += ["", f"## trimmed from {src[0]} ({src[1]} bytes, sha256 {src[2]})", ""]
    order = [why for _, why in rules]
    for reason, files in sorted(info["trimmed"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
        size = sum(s for _, s in files)
        shown = ", ".join(f for f, _ in files[:3]) + (f", ... ({len(files)} files)" if len(files) > 3 else "")
        lines.append(f"- {reason}: {len(files)} files, {size} bytes uncompressed: {shown}")
        refs = info["references"].get(reason)
        if refs:
            lines.append(f"    still named (lazily) by {len(refs)} kept files: {', '.join(refs[:6])}"
                         + (", ..." if len(refs) > 6 else ""))
    lines += ["", "## other", "",
              f"model/: {', '.join(info['model'])} (SmolLM2's tokenizer; drive.py writes config and weights)",
              f"workload.json: {(out / 'workload.json').stat().st_size} bytes",
              f"capacity.json.xz: {(out / 'capacity.json.xz').stat().st_size} bytes",
              f"COMMIT: {info['commit']}", "",
              "## totals", "",
              f"wheels: {folder_bytes(out / 'wheels')} bytes",
              f"carry: {info['carry']} bytes = {mib(info['carry'])} (limit {mib(CARRY_LIMIT)}; without this file)",
              f"tree (tracked + untracked not ignored): {info['tree']} bytes = {mib(info['tree'])}",
              f"travelling total: {info['travelling']} bytes = {mib(info['travelling'])} (limit {mib(TRAVEL_LIMIT)})",
              "within the limits: " + ("yes" if info["carry"] <= CARRY_LIMIT and info["travelling"] <= TRAVEL_LIMIT
                                        else "NO: the builder refused this carry"),
              f"built in {info['seconds']} s"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- discovery

SITECUSTOMIZE = '''\
# Written by eval/gpu/e2e/make_carry.py --discover: every process records its sys.modules.
import os
_dump_dir = os.environ.get("MEPIC_MODULE_DUMP")
if _dump_dir:
    import atexit, json, sys, threading, time

    def _mepic_dump():
        try:
            names = sorted(k for k, m in list(sys.modules.items()) if m is not None)
            path = os.path.join(_dump_dir, "%d.json" % os.getpid())
            with open(path + ".tmp", "w") as f:
                json.dump({"argv": sys.argv, "modules": names}, f)
            os.replace(path + ".tmp", path)
        except Exception:
            pass

    def _mepic_loop():  # a server is stopped with a signal: atexit alone would miss it
        while True:
            time.sleep(0.5)
            _mepic_dump()

    def _mepic_start():
        threading.Thread(target=_mepic_loop, daemon=True, name="mepic-module-dump").start()

    _mepic_start()
    atexit.register(_mepic_dump)
    os.register_at_fork(after_in_child=_mepic_start)
'''
# The servers of the closure: what the device runs, as far as a CPU goes (vanilla's triton backend is
# CUDA-only: torch_native stands in, and the static scan covers triton_backend's imports).
DISCOVER_SERVERS = {"mepic": ["--dtype", "float32"],
                    "vanilla": ["--dtype", "float32", "--attention-backend", "torch_native",
                                "--radix-cache-backend", "sglang", "--sampling-backend", "pytorch"]}
# SGLang modules of the CUDA path to scan besides those the CPU servers import.
CUDA_MODULES = ["sglang.srt.layers.attention.triton_backend", "sglang.srt.model_executor.cuda_graph_runner",
                "sglang.srt.model_executor.runner.decode_cuda_graph_runner", "sglang.srt.layers.sampler",
                "sglang.srt.layers.layernorm", "sglang.srt.layers.activation", "sglang.srt.layers.rotary_embedding",
                "sglang.srt.models.llama", "sglang.srt.mem_cache.memory_pool", "sglang.srt.model_executor.model_runner"]


def serve_and_record(name: str, flags: list[str], env: dict, model: Path) -> None:
    import requests

    from sglang_mepic.process.server_process import ServerProcess

    log(f"closure: starting the {name} server ({' '.join(flags)})", sys.stderr)  # stdout: the list
    with ServerProcess(model, *flags, env=env, startup_timeout=600) as server:
        url = server.url
        r = requests.post(url + "/generate", timeout=300, json={
            "text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": 5, "logprob_start_len": -1})
        r.raise_for_status()
        with requests.post(url + "/generate", stream=True, timeout=300, json={
                "text": "Count: one, two,", "stream": True,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0}}) as r:
            r.raise_for_status()
            for _ in r.iter_lines():
                pass
        requests.post(url + "/v1/chat/completions", timeout=300, json={
            "model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).raise_for_status()
        for path in ("/metrics", "/server_info", "/health"):
            requests.get(url + path, timeout=60).raise_for_status()
        requests.post(url + "/flush_cache", timeout=60)
        time.sleep(2.0)  # two rounds of the dumps
    log(f"closure: {name} served and stopped", sys.stderr)


def import_closure(dump: Path, site: Path, model: Path) -> dict[str, set[str]]:
    """{module: {process kinds that imported it}} over the servers and the driver."""
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p),
           "MEPIC_MODULE_DUMP": str(dump), "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1"}
    seen: dict[str, set[str]] = {}

    def collect(kind: str) -> None:
        for f in dump.glob("*.json"):
            for m in json.loads(f.read_text())["modules"]:
                seen.setdefault(m, set()).add(kind)
            f.unlink()

    for name, flags in DISCOVER_SERVERS.items():
        serve_and_record(name, flags, env, model)
        collect(f"{name} server")
    # The driver (run.sh: python3 -m eval.gpu.e2e.drive, with the repository root on PYTHONPATH).
    driver_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    subprocess.run([sys.executable, "-c", "import eval.gpu.e2e.drive, sglang, sgl_kernel, sglang_mepic, torch, "
                    "triton"], cwd=ROOT, env=driver_env, check=True)
    collect("driver")
    return seen


def module_file(module: str) -> Path | None:
    """The source file of an installed or project module, without importing it."""
    import importlib.metadata as md

    parts = module.split(".")
    if parts[0] in ("sglang_mepic", "eval"):
        base = ROOT / Path(*parts)
    else:
        try:
            base = Path(md.distribution(parts[0]).locate_file(Path(*parts)))
        except md.PackageNotFoundError:
            return None
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def static_imports(path: Path):
    """(top-level name, guarded by try/except, inside an if/else that names cuda, lazy) of each absolute import."""
    tree = ast.parse(path.read_text(errors="replace"))
    out = []

    def visit(node, guarded, cuda, lazy):
        if isinstance(node, ast.Import):
            out.extend((a.name.split(".")[0], guarded, cuda, lazy) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module.split(".")[0], guarded, cuda, lazy))
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for child in children:
                if not isinstance(child, ast.AST):
                    continue
                g, c, lz = guarded, cuda, lazy
                if isinstance(node, ast.Try) and field == "body":
                    g = g or any(h.type is None or re.search(r"Error|Exception", ast.unparse(h.type))
                                 for h in node.handlers)
                if isinstance(node, ast.If) and field in ("body", "orelse"):
                    c = c or "cuda" in ast.unparse(node.test).lower()
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lz = True
                visit(child, g, c, lz)

    visit(tree, False, False, False)
    return out


def discover(keep: Path | None = None) -> str:
    import importlib.metadata as md

    from sglang_mepic.launch import models

    model = models.build(models.TEST_MODEL)
    with tempfile.TemporaryDirectory(prefix="mepic-discover-") as tmp:
        tmp = Path(tmp)
        (tmp / "dump").mkdir()
        (tmp / "site").mkdir()
        seen = import_closure(tmp / "dump", tmp / "site", model)
    if keep:
        keep.write_text(json.dumps({m: sorted(k) for m, k in sorted(seen.items())}, indent=0))
    pd = md.packages_distributions()
    std = set(sys.stdlib_module_names) | {"__main__", "__mp_main__", "sitecustomize", "builtins"}
    pins = lock_versions()
    device = {canonical(d) for d in DEVICE_DISTS}
    tops: dict[str, set[str]] = {}
    for m, kinds in seen.items():
        tops.setdefault(m.split(".")[0], set()).update(kinds)
    dists: dict[str, dict] = {}
    unmapped = []
    for top, kinds in sorted(tops.items()):
        if top in std:
            continue
        names = pd.get(top)
        if not names:
            unmapped.append(top)
            continue
        for d in names:
            e = dists.setdefault(canonical(d), {"modules": set(), "kinds": set()})
            e["modules"].add(top)
            e["kinds"].update(kinds)
    lines = ["# (a) the import closure of a mepic and a vanilla CPU server (tiny model, one of each request "
             "the driver sends) and of the driver", f"#     {len(seen)} modules, {len(tops)} top-level names, "
             f"{len(dists)} distributions; no distribution: {', '.join(unmapped)}"]
    carried, on_device = [], []
    for d, e in sorted(dists.items()):
        version = pins.get(d) or md.version(d)
        where = "; ".join(sorted(e["kinds"]))
        if d in BUILT_HERE:
            lines.append(f"#   {d}: {BUILT_HERE[d]}")
        elif d in device:
            other = DEVICE_VERSIONS.get(d)
            on_device.append(d + (f" (device {other}, here {version})" if other and other != version else ""))
        else:
            carried.append(f"{d}=={version}  # imports {', '.join(sorted(e['modules']))} ({where})")
    lines += ["#   on the device already: " + ", ".join(on_device), *carried]
    # (b) the CUDA path: what the same SGLang modules import where a CPU does not go
    modules = sorted({m for m in seen if m.split(".")[0] in ("sglang", "sglang_mepic")} | set(CUDA_MODULES))
    imported_tops = set(tops)
    candidates: dict[str, dict] = {}
    for m in modules:
        path = module_file(m)
        if path is None:
            continue
        for top, guarded, cuda, lazy in static_imports(path):
            if top in imported_tops or top in std or top.startswith("sglang"):
                continue
            e = candidates.setdefault(top, {"files": set(), "unguarded": 0, "cuda": 0, "toplevel": 0})
            e["files"].add(m)
            e["unguarded"] += not guarded
            e["cuda"] += cuda
            e["toplevel"] += not lazy
    lines += ["", f"# (b) imported by the same {len(modules)} SGLang / project modules on paths a CPU server did not "
                  "take (guarded = in try/except; cuda = under an if that names cuda; top = at module level).",
              "#     Not installed here = not on the CPU path at all. Decide by reading; add the needed ones above."]
    for top, e in sorted(candidates.items(), key=lambda kv: (-kv[1]["cuda"], kv[0])):
        dist = ", ".join(pd.get(top, [])) or "not installed here"
        status = "device has it" if any(canonical(x) in device for x in pd.get(top, [])) else dist
        files = sorted(e["files"])
        lines.append(f"#   {top:24} {status:28} unguarded {e['unguarded']:3} cuda {e['cuda']:3} top {e['toplevel']:3}  "
                     f"{', '.join(files[:3])}{', ...' if len(files) > 3 else ''}")
    # the trimmed parts must not be in the closure
    trimmed = sorted(m for m in seen if trimmed_module(m, TRIM))
    lines += ["", "# trimmed modules in the closure: " + (", ".join(trimmed) if trimmed else "none")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--wheels-cache", type=Path, default=DEFAULT_CACHE,
                    help=f"downloaded wheels, kept between builds (default {DEFAULT_CACHE})")
    ap.add_argument("--standin", type=Path, default=STANDIN, help="the sgl_kernel stand-in's source folder")
    ap.add_argument("--no-rust-tree-core", action="store_true",
                    help="also drop SGLang's Rust TreeCore (vanilla then runs the Python TreeCore); the sglang "
                         "wheel becomes py3-none-any (for a device with glibc < 2.34, or a torch it cannot load in)")
    ap.add_argument("--python-version", default=PYTHON, metavar="3.N",
                    help=f"build the wheels for this CPython (default {PYTHON}, the device's; 3.11 for "
                         f"emulate.sh on this machine): pip download's --python-version and the tag check")
    ap.add_argument("--discover", action="store_true",
                    help="derive the dependency list from real CPU servers' imports and print it")
    ap.add_argument("--keep-closure", type=Path, help="with --discover: write the modules seen to this JSON file")
    args = ap.parse_args(argv)
    if args.discover:
        print(discover(args.keep_closure), end="")
        return
    try:
        build(args.out, args.wheels_cache, standin=args.standin, no_rust_tree_core=args.no_rust_tree_core,
              python=args.python_version)
    except CarryError as e:
        print(f"make_carry: error: {e.message}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
