"""The GPU end-to-end carry (eval/gpu/e2e/make_carry.py): trimming and repacking a wheel, the size guard,
the git exclude line, the requirement list; and (slow) the real carry, built and installed as the device
installs it."""

import base64
import csv
import email.parser
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from eval.gpu.e2e import make_carry as mc  # the eval package is registered by conftest.py

ROOT = Path(__file__).resolve().parents[2]
MiB = 2 ** 20
# What pip is told the device is when installing as it does: CPython 3.12, Linux x86_64, glibc 2.34 (what
# SGLang's wheel needs; pip does not expand a --platform to the older manylinux tags, so each is named).
DEVICE_PIP = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
              *[a for abi in ("cp312", "abi3", "none") for a in ("--abi", abi)],
              *[a for n in range(34, 4, -1) for a in ("--platform", f"manylinux_2_{n}_x86_64")],
              *[a for p in ("manylinux2014", "manylinux2010", "manylinux1") for a in ("--platform", f"{p}_x86_64")]]


def make_wheel(folder: Path, files: dict[str, bytes], name="fakepkg", version="1.0",
               tag="cp312-cp312-manylinux_2_34_x86_64", record_skip=()) -> Path:
    """A wheel with a valid RECORD (less the entries in record_skip)."""
    info = f"{name}-{version}.dist-info"
    files = {**files,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n\n".encode()}
    rows = []
    for path, data in files.items():
        if path not in record_skip:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append((path, f"sha256={digest}", str(len(data))))
    rows.append((f"{info}/RECORD", "", ""))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    wheel = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{info}/RECORD", buf.getvalue())
    return wheel


FILES = {"fakepkg/__init__.py": b"from fakepkg import keep\n",
         "fakepkg/keep.py": b"VALUE = 1\n",
         "fakepkg/big/__init__.py": b"",
         "fakepkg/big/data.py": b"x = 'unused'\n" * 100,
         "fakepkg/_ext.cpython-312-x86_64-linux-gnu.so": b"\x7fELF not really" * 10}
RULES = [("fakepkg/big/*", "never imported"), ("fakepkg/_ext.*.so", "loaded only on request")]


def pip_target(target: Path, wheels, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                           "--no-deps", "--no-compile", "--target", str(target), *extra, *map(str, wheels)],
                          capture_output=True, text=True)


def test_a_trimmed_wheel_loses_what_the_rules_name_keeps_a_consistent_record_and_installs(tmp_path):
    src = make_wheel(tmp_path, FILES)
    assert mc.check_record(src) == []
    wheel, removed = mc.trim_wheel(src, tmp_path / "out", RULES)
    assert wheel.name == src.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"fakepkg/__init__.py", "fakepkg/keep.py"} <= names
    assert not any(n.startswith("fakepkg/big/") or n.endswith(".so") for n in names)
    assert sorted(removed) == sorted(why for _, why in RULES)
    assert [f for f, _ in removed["never imported"]] == ["fakepkg/big/__init__.py", "fakepkg/big/data.py"]
    assert mc.check_record(wheel) == []
    record = zipfile.ZipFile(wheel).read("fakepkg-1.0.dist-info/RECORD").decode()
    assert "fakepkg/big" not in record and "_ext" not in record
    # pip checks RECORD against the files and the tag against the interpreter it is told of: the device's
    done = pip_target(tmp_path / "site", [wheel], *DEVICE_PIP)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "fakepkg" / "keep.py").is_file()
    assert not (tmp_path / "site" / "fakepkg" / "big").exists()


def test_a_broken_record_is_caught(tmp_path):
    wheel = make_wheel(tmp_path, FILES, record_skip={"fakepkg/keep.py"})
    assert mc.check_record(wheel) == ["fakepkg/keep.py: not in RECORD"]
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("fakepkg/keep.py", b"VALUE = 2\n")  # a second member of the same name: the later one is read
    assert mc.check_record(wheel)


def test_a_wheel_left_without_native_code_can_be_retagged_pure(tmp_path):
    src = make_wheel(tmp_path, FILES)
    with pytest.raises(ValueError, match="native code remains"):
        mc.trim_wheel(src, tmp_path / "bad", RULES[:1], pure=True)
    wheel, _ = mc.trim_wheel(src, tmp_path / "out", RULES, pure=True)
    assert wheel.name == "fakepkg-1.0-py3-none-any.whl"
    headers = email.parser.Parser().parsestr(zipfile.ZipFile(wheel).read("fakepkg-1.0.dist-info/WHEEL").decode())
    assert headers.get_all("Tag") == ["py3-none-any"] and headers["Root-Is-Purelib"] == "true"
    assert headers["Wheel-Version"] == "1.0"
    assert mc.check_record(wheel) == []
    assert mc.device_glibc(wheel.name) == (0, 0)
    done = pip_target(tmp_path / "site", [wheel])  # this interpreter's own tags: any Python 3 takes it
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("filename, glibc", [
    ("sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl", (2, 34)),
    ("orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", (2, 17)),
    ("pydantic-2.14.3-py3-none-any.whl", (0, 0)),
    ("soundfile-0.13.1-py2.py3-none-manylinux_2_28_x86_64.whl", (2, 28)),
    ("cffi-2.1.1-cp311-abi3-manylinux_2_17_x86_64.whl", (2, 17)),
    ("orjson-3.13.0-cp311-cp311-manylinux_2_17_x86_64.whl", None),
    ("orjson-3.13.0-cp312-cp312-manylinux_2_17_aarch64.whl", None),
    ("orjson-3.13.0-cp312-cp312-macosx_11_0_arm64.whl", None),
])
def test_which_wheels_install_on_the_device(filename, glibc):
    assert mc.device_glibc(filename) == glibc


@pytest.mark.parametrize("filename, glibc", [
    ("sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", (2, 34)),
    ("sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl", None),
    ("pyzmq-27.3.0-cp310-abi3-manylinux_2_28_x86_64.whl", (2, 28)),
    ("pyzmq-27.3.0-cp312-abi3-manylinux_2_28_x86_64.whl", None),  # abi3 from 3.12 on: not on 3.11
    ("pydantic-2.14.3-py3-none-any.whl", (0, 0)),
    ("foo-1.0-py311-none-any.whl", (0, 0)),
    ("foo-1.0-py312-none-any.whl", None),
])
def test_which_wheels_install_on_another_python(filename, glibc):
    """--python-version 3.11 (emulate.sh): the same tag logic for cp311."""
    assert mc.device_glibc(filename, "3.11") == glibc


def test_the_python_version_option_reaches_pip_and_the_cache_prefers_that_pythons_wheel(tmp_path, monkeypatch):
    assert mc.cpython_tag("3.11") == "cp311" and mc.cpython_tag(mc.PYTHON) == "cp312"
    with pytest.raises(ValueError):
        mc.cpython_tag("311")
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("pyzmq-27.3.0-cp310-abi3-manylinux_2_28_x86_64.whl",
                 "pyzmq-27.3.0-cp312-abi3-manylinux_2_28_x86_64.whl", "orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.whl"):
        (cache / name).write_bytes(b"")
    # the default build keeps taking the cp312 wheel though a 3.11 build left an older abi3 one beside it
    assert mc.cached_wheel(cache, "pyzmq", "27.3.0").name.startswith("pyzmq-27.3.0-cp312-abi3")
    assert mc.cached_wheel(cache, "pyzmq", "27.3.0", "3.11").name.startswith("pyzmq-27.3.0-cp310-abi3")
    assert mc.cached_wheel(cache, "orjson", "3.13.0", "3.11") is None
    calls = []

    def download(cmd, **kwargs):
        calls.append(cmd)
        (cache / "orjson-3.13.0-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(mc.subprocess, "run", download)
    assert mc.fetch_wheel("orjson", "3.13.0", cache, "3.11").name.startswith("orjson-3.13.0-cp311-cp311")
    cmd = calls[0]
    assert cmd[cmd.index("--python-version") + 1] == "3.11"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--abi"] == ["cp311", "abi3", "none"]
    assert mc.fetch_wheel("orjson", "3.13.0", cache).name.startswith("orjson-3.13.0-cp312")  # cached, no pip
    assert len(calls) == 1
    with pytest.raises(mc.CarryError, match="3.N"):
        mc.build(tmp_path / "carry", cache, python="3")


def test_the_size_guard_refuses_a_carry_over_60_mib_or_a_journey_over_64_mib():
    mc.check_limits(59 * MiB, 63 * MiB)
    mc.check_limits(60 * MiB, 64 * MiB)  # at the limits: allowed
    with pytest.raises(mc.CarryError, match=r"the carry is 60\.01 MiB, over its limit of 60\.00 MiB") as e:
        mc.check_limits(60 * MiB + 10 * 1024, 62 * MiB)
    assert "travelling" not in e.value.message
    with pytest.raises(mc.CarryError, match=r"travelling total .* is 64\.50 MiB, over the device tool's 64\.00 MiB: "
                                            r"the tree is 14\.50 MiB") as e:
        mc.check_limits(50 * MiB, 64 * MiB + MiB // 2)
    assert "the carry is" not in e.value.message
    with pytest.raises(mc.CarryError) as e:
        mc.check_limits(61 * MiB, 70 * MiB)
    assert "the carry is" in e.value.message and "travelling total" in e.value.message


def test_a_refused_build_exits_1_with_its_message(monkeypatch, capsys):
    def refuse(*args, **kwargs):
        mc.check_limits(61 * MiB, 62 * MiB)

    monkeypatch.setattr(mc, "build", refuse)
    with pytest.raises(SystemExit) as e:
        mc.main(["--out", "/nonexistent/carry"])
    assert e.value.code == 1
    assert "make_carry: error: the carry is 61.00 MiB, over its limit" in capsys.readouterr().err


def test_a_missing_stand_in_is_refused_before_anything_is_built(tmp_path):
    with pytest.raises(mc.CarryError, match="the sgl_kernel stand-in is missing"):
        mc.build(tmp_path / "carry", tmp_path / "cache", standin=tmp_path / "no-standin")
    assert not (tmp_path / "carry").exists() and not (tmp_path / "cache").exists()


def test_the_exclude_line_is_added_once_and_the_file_made_if_missing(tmp_path):
    exclude = tmp_path / "git" / "info" / "exclude"
    assert mc.ensure_excluded(exclude) is True
    assert exclude.read_text() == "/.gpu_e2e/\n"
    assert mc.ensure_excluded(exclude) is False
    assert exclude.read_text() == "/.gpu_e2e/\n"
    exclude.write_text("# git ls-files --others --exclude-from=.git/info/exclude\n/.gpu_carry/")  # no final newline
    assert mc.ensure_excluded(exclude) is True
    assert exclude.read_text().splitlines() == ["# git ls-files --others --exclude-from=.git/info/exclude",
                                                "/.gpu_carry/", "/.gpu_e2e/"]
    exclude.write_text("  /.gpu_e2e/  \n")
    assert mc.ensure_excluded(exclude) is False


def test_the_travelling_tree_is_tracked_and_untracked_files_not_ignored_ones(tmp_path):
    def run(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    run("init", "-q")
    (tmp_path / ".gitignore").write_text("ignored/\n")  # 9 bytes
    (tmp_path / "tracked.txt").write_bytes(b"x" * 100)
    run("add", ".gitignore", "tracked.txt")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "t")
    (tmp_path / "untracked.txt").write_bytes(b"y" * 10)
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "big.bin").write_bytes(b"z" * 10000)
    (tmp_path / "carry").mkdir()
    (tmp_path / "carry" / "w.whl").write_bytes(b"w" * 1000)
    assert mc.tree_bytes(tmp_path) == 9 + 100 + 10 + 1000
    assert mc.tree_bytes(tmp_path, skip=tmp_path / "carry") == 9 + 100 + 10
    mc.ensure_excluded(mc.exclude_path(tmp_path), "/carry/")
    assert mc.tree_bytes(tmp_path) == 9 + 100 + 10


def test_the_requirement_list_parses_and_agrees_with_the_lock(tmp_path):
    reqs = mc.read_requirements()
    assert reqs and all(why for _, _, why in reqs), "every carried package says why"
    pins = mc.lock_versions()
    names = [mc.canonical(n) for n, _, _ in reqs]
    assert len(set(names)) == len(names)
    for name, version, _ in reqs:
        assert pins.get(mc.canonical(name), version) == version, name
        assert mc.canonical(name) not in {mc.canonical(d) for d in mc.DEVICE_DISTS}, f"the device has {name}"
    assert not {"flashinfer-python", "sglang", "sglang-kernel", "torch"} & set(names)
    bad = tmp_path / "r.txt"
    bad.write_text("orjson>=3  # a range\n")
    with pytest.raises(mc.CarryError, match="r.txt:1: expected NAME==VERSION"):
        mc.read_requirements(bad)


def test_the_module_recorder_sees_every_process_spawned_children_too(tmp_path):
    """--discover's sitecustomize: each process (a spawned child included) leaves the modules it imported."""
    site, dump = tmp_path / "site", tmp_path / "dump"
    site.mkdir()
    dump.mkdir()
    (site / "sitecustomize.py").write_text(mc.SITECUSTOMIZE)
    script = ("import multiprocessing as mp\n"
              "def child():\n    import csv\n"
              "if __name__ == '__main__':\n"
              "    import fractions\n"
              "    p = mp.get_context('spawn').Process(target=child); p.start(); p.join()\n")
    (tmp_path / "main.py").write_text(script)
    env = {"PYTHONPATH": str(site), "MEPIC_MODULE_DUMP": str(dump), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(tmp_path / "main.py")], env=env, check=True, timeout=120)
    dumps = [json.loads(f.read_text())["modules"] for f in dump.glob("*.json")]
    assert len(dumps) >= 2  # the parent, the child (and a resource tracker, where one starts)
    assert any("fractions" in d and "csv" not in d for d in dumps)
    assert any("csv" in d for d in dumps)


def test_the_static_scan_tells_guarded_cuda_and_lazy_imports_apart(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import a.b\n"
                   "from . import sibling\n"
                   "try:\n    import c\nexcept ImportError:\n    c = None\n"
                   "if _is_cuda:\n    from d import x\n"
                   "def f():\n    import e\n")
    assert sorted(mc.static_imports(src)) == [("a", False, False, False), ("c", True, False, False),
                                              ("d", False, True, False), ("e", False, False, True)]


@pytest.mark.parametrize("module, trimmed", [
    ("sglang.test.test_utils", True), ("sglang.test", True), ("sglang.testing", False),
    ("sglang.multimodal_gen.runtime", True), ("sglang.benchmark.serving", True), ("sglang.bench_serving", True),
    ("sglang.srt.rust_extensions._grpc", True), ("sglang.srt.rust_extensions._server", True),
    ("sglang.srt.rust_extensions.loader", False), ("sglang.srt.rust_server.server", False),
    ("sglang.srt.mem_cache.rust_tree_core.mem_cache", False), ("sglang.srt.entrypoints.http_server", False),
])
def test_which_modules_the_trim_removes(module, trimmed):
    assert mc.trimmed_module(module, mc.TRIM) is trimmed
    assert mc.trimmed_module("sglang.srt.mem_cache.rust_tree_core.mem_cache", mc.TRIM + [mc.TREE_CORE])


@pytest.mark.parametrize("layout, kept", [("site", True), ("checkout", False)])
def test_the_launcher_keeps_the_site_it_was_installed_into_on_sys_path(tmp_path, layout, kept):
    """run.sh installs the project wheel into a --target folder on PYTHONPATH beside SGLang: the launcher's
    drop of the checkout root must not drop that folder (the emulation's first finding: every server died
    with `No module named 'sglang'`). From a checkout (pyproject.toml beside the package) it still goes."""
    import shutil

    folder = tmp_path / layout
    shutil.copytree(ROOT / "sglang_mepic", folder / "sglang_mepic", ignore=shutil.ignore_patterns("__pycache__"))
    if layout == "checkout":
        (folder / "pyproject.toml").write_text("")
    code = ("import sys; from sglang_mepic.launch import server as l; assert l.__file__.startswith(sys.argv[1]); "
            "l._drop_checkout_root_from_path(); print(sys.argv[1] in sys.path)")
    done = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(kept)


@pytest.mark.slow
def test_the_real_carry_builds_fits_and_installs_as_on_the_device(tmp_path):
    """Builds the carry (PyPI the first time; the wheel cache after) and installs it as run.sh does."""
    from sglang_mepic.launch import models

    models.build("smollm2-135m")  # the carry takes its tokenizer; no other test need have built it first
    out = tmp_path / "carry"
    done = subprocess.run([sys.executable, "-m", "eval.gpu.e2e.make_carry", "--out", str(out),
                           "--wheels-cache", str(mc.DEFAULT_CACHE)], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "travelling total" in done.stdout
    wheels = sorted((out / "wheels").glob("*.whl"))
    assert mc.folder_bytes(out) <= mc.CARRY_LIMIT
    assert mc.folder_bytes(out) + mc.tree_bytes(ROOT, skip=out) <= mc.TRAVEL_LIMIT
    assert all(mc.device_glibc(w.name) is not None for w in wheels), [w.name for w in wheels]
    names = {mc.wheel_tags(w.name)[0] for w in wheels}
    assert {"sglang", "sglang-mepic", "sglang-mepic-sgl-kernel-standin"} <= names
    assert {mc.canonical(n) for n, _, _ in mc.read_requirements()} <= names
    assert "flashinfer-python" not in names
    for f in ("MANIFEST.txt", "COMMIT", "workload.json", "model/tokenizer.json", "model/tokenizer_config.json"):
        assert (out / f).is_file(), f
    assert not (out / "model" / "model.safetensors").exists()
    manifest = (out / "MANIFEST.txt").read_text()
    assert all(w.name in manifest for w in wheels) and "travelling total" in manifest
    site = tmp_path / "site"
    done = pip_target(site, wheels, *DEVICE_PIP)
    assert done.returncode == 0, done.stderr[-3000:]
    for f in ("sglang/srt/entrypoints/http_server.py", "sgl_kernel/__init__.py", "sglang_mepic/plugin.py",
              "sglang/srt/mem_cache/rust_tree_core/extension.py",
              # part 4 (issue 69): the served sync probe, and SGLang's breakable prefill graph runner and hooks
              "sglang_mepic/attention/sync_probe.py", "sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py",
              "sglang/srt/model_executor/runner_backend/breakable_cuda_graph_backend.py"):
        assert (site / f).is_file(), f
    assert not (site / "sglang" / "multimodal_gen").exists() and not (site / "sglang" / "test").exists()
    assert not list((site / "sglang" / "srt" / "rust_extensions").glob("_server*.so"))
    entry = next(site.glob("sglang_mepic-*.dist-info")) / "entry_points.txt"
    assert "mepic = sglang_mepic.plugin:register" in entry.read_text()


def test_the_scripts_a_device_call_runs_travel_with_the_tree():
    """What run.sh and drive.py start on the device comes with the working tree (tracked, so not left out as
    ignored): the driver, its sync check (part 4, issue 69) and the workload builder."""
    files = ["eval/gpu/e2e/run.sh", "eval/gpu/e2e/drive.py", "eval/gpu/e2e/sync_check.py", "eval/gpu/e2e/workload.py"]
    done = subprocess.run(["git", "ls-files", "--error-unmatch", *files], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    from eval.gpu.e2e import drive

    assert "eval.gpu.e2e.sync_check" in Path(drive.__file__).read_text()  # started by module name, from the tree


def test_the_kernel_harness_carry_imports_on_its_own():
    """eval/gpu/make_carry.sh (the kernel harness's carry) copies the project files its scripts import. It had
    not followed the package into parts (attention/, wire/: no folder made) nor segments' import of config, and
    the editable install here hid the second: the carry is imported with that install's finder taken out."""
    subprocess.run(["bash", str(ROOT / "eval/gpu/make_carry.sh"), "--worktree"], check=True, capture_output=True,
                   timeout=120)
    code = ("import sys\n"
            "sys.meta_path = [f for f in sys.meta_path if 'Editable' not in getattr(f, '__name__', type(f).__name__)]\n"
            "sys.path[:0] = ['proj', 'sgl']\n"
            "from sglang_mepic.attention.reference import attend\n"
            "from sglang_mepic.kernels import attention, aot, occupancy\n"
            "import sglang_mepic.wire.layout as s\n"
            "print(s.__file__, attention.__file__)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT / ".gpu_carry", capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert all("/.gpu_carry/proj/" in f for f in out.stdout.split())
