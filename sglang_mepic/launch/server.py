"""Launch SGLang's own HTTP server with sglang-mepic loaded.

    python -m sglang_mepic.launch_server [any sglang.launch_server flag ...]

Every flag is passed on to SGLang. What this wrapper adds:
- with no `--model-path`, the embedded default model (SmolLM2-135M-Instruct);
- `--attention-backend mepic` (NoPE keys, RoPE applied inside attention) with
  `--radix-cache-backend mepic` (chunk reuse) and `--page-size 16`
  (`--radix-cache-backend sglang` keeps SGLang's built-in cache instead);
- `--enable-metrics` (Prometheus `/metrics`, MEPIC figures included) and
  `--enable-cache-report` (cached prompt tokens in OpenAI `usage`);
- the `--mepic-*` flags (mode, recompute blocks, pad placement), which become
  environment settings read by every SGLang process;
- on a machine without CUDA, the CPU defaults (`SGLANG_USE_CPU_ENGINE=1`,
  `--device cpu`, a bounded `--max-total-tokens`, `--sleep-on-idle`, and
  `--dtype float32` where the CPU has no native bf16);
- each default only where the flag is not given;
- clear one-line errors and exit status 2, before any server process starts
  (`check_combinations`, `check_model_fits`), for a missing model folder, a
  port that is taken or out of range, tensor/pipeline/data parallelism,
  SGLang's hierarchical cache or `--disable-radix-cache` (in a reusing mode)
  with the mepic cache, HiCache or a GPU attention backend on the CPU, a
  quantized KV cache or speculative decoding with the mepic attention backend,
  a model it cannot serve (architecture, sliding window: from config.json),
  sizes below 1 (page, pool, context, chunked prefill, parallel ranks), a bad
  flag value (no usage block), and what SGLang's own argument checks refuse
  (`--log-level debug` keeps their traceback);
- a quiet start-up: SGLang's ~20 KB `server_args=` line becomes the command
  line and the effective MEPIC settings (defaults included), and on CPU its CUDA-only notices are replaced by one line saying so
  (`--log-level debug` keeps everything; quiet.py).
"""

import argparse
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from sglang_mepic import config
from sglang_mepic.frontend import auto_chunk
from sglang_mepic.gate import calibration, verdict_cache, verify
from sglang_mepic.launch import models, quiet

CPU_MAX_TOTAL_TOKENS = 65536  # SGLang would otherwise size the pool from free RAM (~14 GB)
ATTENTION_BACKEND = "mepic"  # NoPE keys with RoPE fused into attention
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
MEPIC_PAGE_SIZE = 16  # one MEPIC block = one SGLang page
SGLANG_CACHE = "sglang"  # `--radix-cache-backend sglang`: SGLang's built-in tree, no chunk reuse
PROG = "sglang_mepic.launch_server"
# backend.SUPPORTED_ARCHITECTURES, named here without importing SGLang before its environment is set
# (tests/test_launch.py checks that the two agree).
MEPIC_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# KV cache dtypes the mepic attention kernels read: the model's own, or bf16 (no k/v scales are applied).
MEPIC_KV_DTYPES = ("auto", "bf16", "bfloat16")
# Attention backends SGLang offers for a CPU (`--device cpu`), and ours; the others need a GPU or an accelerator.
CPU_ATTENTION_BACKENDS = ("mepic", "torch_native", "intel_amx", "flex_attention")


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX); None where it cannot be told.

    Without it, torch emulates bf16 matmuls: issue 17 measured a 1,784-token
    prompt on SmolLM2-135M at 21.6 s in bf16 and 3.8 s in float32 (AVX2 only).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags")
             for flag in line.split(":", 1)[1].split()}
    if not flags:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16"})


class LaunchError(SystemExit):
    """A start-up refused with a one-line reason; `main` prints it and exits with status 2 (as argparse does)."""

    def __init__(self, message: str):
        self.message = f"{PROG}: error: {message}"
        super().__init__(self.message)


class _Parser(argparse.ArgumentParser):
    """argparse, but a refused flag is one line (no usage block) and exit status 2, as `LaunchError`."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


def _known_flags(argv: list[str]) -> argparse.Namespace:
    """The few flags this wrapper reads; everything else is SGLang's business."""
    p = _Parser(add_help=False, allow_abbrev=False)
    p.add_argument("--model-path", "--model")
    p.add_argument("--host", default=DEFAULT_HOST)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--device")
    p.add_argument("--dtype")
    p.add_argument("--attention-backend")
    p.add_argument("--max-total-tokens")
    p.add_argument("--radix-cache-backend")
    p.add_argument("--page-size")
    p.add_argument("--cuda-graph-backend-decode")
    p.add_argument("--cuda-graph-backend-prefill")
    p.add_argument("--sleep-on-idle", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--log-level")
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pp-size", "--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--attn-dp-size", "--attention-data-parallel-size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--enable-hierarchical-cache", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--context-length")
    p.add_argument("--chunked-prefill-size")
    known, _ = p.parse_known_args(argv)
    return known


def quiet_start(argv: list[str]) -> bool:
    """Quiet unless the user asked for debug logs."""
    return (_known_flags(argv).log_level or "").lower() != "debug"


def _rules() -> dict[config.Setting, object]:
    """The checks that belong to another part than config (which imports nothing of the package)."""
    return {config.SEPARATOR: auto_chunk.parse_separator,
            config.VERIFY_QUESTIONS: lambda text: config.parse_questions(text, calibration.size())}


def help_fields() -> dict[str, object]:
    """What the settings' help texts name from other parts."""
    return {"min_pages": auto_chunk.MIN_PAGES, "questions": calibration.size(),
            "cache_dir_env": verdict_cache.CACHE_DIR_ENV}


def mepic_parser() -> argparse.ArgumentParser:
    """The --mepic-* flags, one per row of config.SETTINGS."""
    p = _Parser(add_help=False, allow_abbrev=False)
    g = p.add_argument_group("sglang-mepic options (consumed here, not passed to SGLang)")
    rules, fields = _rules(), help_fields()
    for setting in config.SETTINGS:
        text = setting.help.format(**fields)
        if setting.switch:
            g.add_argument(setting.flag, action="store_true", default=None, help=text)
        elif setting.choices:
            g.add_argument(setting.flag, choices=setting.choices, default=None, help=text)
        else:
            g.add_argument(setting.flag, type=_checked(rules.get(setting, setting.parse)), default=None,
                           metavar=setting.metavar, help=text)
    return p


def _shown(setting: config.Setting, backend: str | None) -> bool:
    """Whether the start-up line names a setting: the shared tier's only where one is set."""
    return {"always": True, "never": False, "file": backend == "file", "storage": backend is not None,
            "storage-set": backend is not None and bool(os.environ.get(setting.env)),
            "known": config.known_texts_on()}[setting.shown]


def _display(setting: config.Setting) -> str:
    """A setting's value on the start-up line, as a flag would give it."""
    if setting.secret:
        return "(set)"
    if setting is config.SEPARATOR:
        separator = auto_chunk.active_separator()
        return "none" if separator is None else repr(separator)
    if setting is config.KNOWN_TEXTS_MB:
        return config.raw(setting)
    if setting in (config.STORAGE_CONFIG, config.RECOMPUTE_BLOCKS):  # as given: JSON, or a count or 'all'
        return f"'{config.raw(setting)}'" if setting is config.STORAGE_CONFIG else config.raw(setting)
    value = config.read(setting)
    if isinstance(value, config.Mode):
        return value.name
    if isinstance(value, float):
        return f"{value:g}"
    return str(getattr(value, "value", value))


def mepic_settings(argv: list[str]) -> str:
    """The MEPIC settings the server runs with, defaults included, as the flags that set them.

    Read back from the environment the --mepic-* flags became (what every SGLang
    process reads), and from argv after `with_defaults`; a note says when chunks are
    not reused at all, since the flags then change nothing."""
    backend = config.storage_backend()
    shown = []
    for setting in config.SETTINGS:
        if setting is config.STORAGE_BACKEND:
            shown.append(f"{setting.flag} {backend or 'none'}")
        elif _shown(setting, backend):
            shown.append(f"{setting.flag} {_display(setting)}")
    line = " ".join(shown)
    if config.verify():
        line += f" --mepic-verify --mepic-verify-questions {verify.questions()}"
    if config.reuse_refused():
        line += f" (reuse refused: --mepic-mode {config.reuse_refused()} failed the accuracy gate on this model)"
    known = _known_flags(argv)
    if (known.attention_backend, known.radix_cache_backend) != ("mepic", "mepic"):
        line += (" (chunks are not reused: that needs --attention-backend mepic and --radix-cache-backend mepic; "
                 "markers are still removed)")
    elif not config.mode().reuses:
        line += " (full mode: chunks are computed in context, never reused)"
    return line


def _checked(parse):
    """An argparse type that keeps the text but rejects what `parse` rejects, with its message."""
    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    return check


def split_mepic_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Remove the --mepic-* flags from argv and return them as environment settings."""
    known, rest = mepic_parser().parse_known_args(argv)
    env = {}
    for setting in config.SETTINGS:
        value = getattr(known, setting.dest)
        if value is None or value is False:
            continue
        if setting is config.STORAGE_DIR:
            value = check_storage_dir(value)
        env[setting.env] = "on" if setting.switch else value
    check_storage(known.mepic_storage_backend or ("file" if known.mepic_storage_dir else None), known)
    return rest, env


def check_storage(backend: str | None, known: argparse.Namespace) -> None:
    """Refuse a shared tier that cannot work, before anything heavy loads."""
    if backend is None:
        if known.mepic_storage_config or known.mepic_storage_timeout or known.mepic_storage_secret:
            raise LaunchError("--mepic-storage-config, --mepic-storage-timeout and --mepic-storage-secret need "
                              "--mepic-storage-backend")
        return
    from sglang_mepic.tiers import backends

    usable = [b for b in backends.backends() if b not in backends.NO_BYTES]
    if backend not in usable:
        raise LaunchError(f"--mepic-storage-backend {backend}: "
                          + ("it keeps no KV bytes (a stand-in of SGLang's)" if backend in backends.NO_BYTES
                             else "SGLang has no such storage backend")
                          + f"; choose one of {', '.join(usable)}")
    try:
        backends.importable(backend)
    except ImportError as e:
        raise LaunchError(f"--mepic-storage-backend {backend}: {e}") from None
    if backend == "dynamic":
        extra = config.parse_storage_config(known.mepic_storage_config or "{}")
        missing = [f for f in ("backend_name", "module_path", "class_name") if f not in extra]
        if missing:
            raise LaunchError(f"--mepic-storage-backend dynamic needs {', '.join(missing)} in --mepic-storage-config "
                              "(the HiCacheStorage class to make, as in SGLang's dynamic backend)")
    if backend != "file" and known.mepic_storage_dir:
        raise LaunchError(f"--mepic-storage-dir is the file backend's; {backend} is set up by --mepic-storage-config")
    if backend == "file" and not known.mepic_storage_dir:
        raise LaunchError("--mepic-storage-backend file needs --mepic-storage-dir DIR")
    if backend == "mooncake":
        from sglang_mepic.process.mooncake_master import MasterError, check_client

        try:
            check_client()
        except MasterError as e:
            raise LaunchError(f"--mepic-storage-backend mooncake: {e}") from None
        extra = config.parse_storage_config(known.mepic_storage_config or "{}")
        addressed = {"master_server_address", "client_server_address"} & extra.keys() or any(
            os.environ.get(v) for v in ("MOONCAKE_MASTER", "MOONCAKE_CLIENT", "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"))
        if not addressed:
            raise LaunchError("--mepic-storage-backend mooncake needs the master's address: --mepic-storage-config "
                              "'{\"master_server_address\": \"HOST:PORT\", ...}' or MOONCAKE_MASTER "
                              "(python -m sglang_mepic.launch_cluster starts a master and passes it on)")


def check_parallelism(argv: list[str]) -> None:
    """Refuse tensor, pipeline and data parallelism with the mepic cache, before anything loads.

    Chunk keys, shared-storage entries and tier decisions are per process: TP ranks would
    write their own heads under one key and could plan one request differently, and a DP
    replica would compile a request's chunks on another replica than the request."""
    known = _known_flags(argv)
    if known.radix_cache_backend != "mepic":
        return
    given = [f"{flag} {value}" for flag, value in (("--tp-size", known.tp_size), ("--pp-size", known.pp_size),
                                                   ("--dp-size", known.dp_size), ("--attn-dp-size", known.attn_dp_size))
             if value > 1] + (["--enable-dp-attention"] if known.enable_dp_attention else [])
    if given:
        raise LaunchError(f"{', '.join(given)}: --radix-cache-backend mepic runs on one GPU per server "
                          "(chunk keys, shared-storage entries and tier decisions are not shared across tensor, "
                          "pipeline or data-parallel ranks); run one server per GPU (python -m "
                          "sglang_mepic.launch_cluster) or use --radix-cache-backend sglang")


def _token_count(flag: str, value: str | None, too_small: str, off: int | None = None) -> None:
    """A flag counting tokens is a whole number of at least 1 (or its `off` value): 0 divided by zero
    or sized an empty pool in a child process, which died with a traceback."""
    if value is None:
        return
    try:
        count = int(value)
    except ValueError:
        raise LaunchError(f"{flag} {value}: must be a whole number of tokens") from None
    if count < 1 and count != off:
        raise LaunchError(f"{flag} {value}: {too_small}")


def check_combinations(argv: list[str], cuda: bool | None = None) -> None:
    """Refuse, before anything loads, the flags and combinations this server cannot serve (each
    ended in a traceback from a child process, or no start at all).

    argv: after `with_defaults`; cuda: whether this machine has a CUDA device (None: not checked)."""
    known = _known_flags(argv)
    if not 1 <= known.port <= 65535:
        raise LaunchError(f"--port {known.port}: a TCP port is 1-65535")
    for flag, value in (("--tp-size", known.tp_size), ("--pp-size", known.pp_size), ("--dp-size", known.dp_size),
                        ("--attn-dp-size", known.attn_dp_size)):
        if value < 1:
            raise LaunchError(f"{flag} {value}: must be at least 1")
    check_parallelism(argv)
    _token_count("--page-size", known.page_size, f"a page holds at least 1 token (the mepic cache uses "
                 f"{MEPIC_PAGE_SIZE}, one MEPIC block per page)")
    _token_count("--max-total-tokens", known.max_total_tokens, "the KV pool needs at least 1 token")
    _token_count("--context-length", known.context_length, "a context holds at least 1 token")
    _token_count("--chunked-prefill-size", known.chunked_prefill_size,
                 "a prefill chunk holds at least 1 token (or -1 to turn chunked prefill off)", off=-1)
    if known.radix_cache_backend not in (None, "mepic"):
        raise LaunchError(f"--radix-cache-backend {known.radix_cache_backend}: this server offers mepic (chunk "
                          "reuse, the default) and sglang (SGLang's own prefix cache)")
    if known.enable_hierarchical_cache and known.radix_cache_backend == "mepic":
        raise LaunchError("--enable-hierarchical-cache: SGLang's HiCache does not work with --radix-cache-backend "
                          "mepic; the mepic cache has its own host tier (--mepic-host-tier-gb GB) and shared "
                          "storage (--mepic-storage-backend), or use --radix-cache-backend sglang")
    if known.enable_hierarchical_cache and known.device == "cpu":
        raise LaunchError("--enable-hierarchical-cache: SGLang's HiCache registers its host pool with CUDA and "
                          "needs a GPU")
    if known.speculative_algorithm and known.attention_backend == "mepic":
        raise LaunchError(f"--speculative-algorithm {known.speculative_algorithm}: --attention-backend mepic has "
                          "no draft or verify path (no tree masks); serve without speculative decoding or with "
                          "another --attention-backend")
    if known.disable_radix_cache and known.radix_cache_backend == "mepic" and config.mode().reuses:
        raise LaunchError(f"--disable-radix-cache: --mepic-mode {config.mode().name} reuses chunks through the "
                          "radix cache; drop --disable-radix-cache, or use --mepic-mode full or "
                          "--radix-cache-backend sglang")
    if known.attention_backend == "mepic" and (known.kv_cache_dtype or "auto") not in MEPIC_KV_DTYPES:
        raise LaunchError(f"--kv-cache-dtype {known.kv_cache_dtype}: --attention-backend mepic reads the KV cache "
                          "unscaled, in the model's dtype or bf16; use --kv-cache-dtype auto or bf16")
    if config.known_texts_on() and (getattr(known, "tokenizer_worker_num", 1) or 1) > 1:
        raise LaunchError(f"--tokenizer-worker-num {known.tokenizer_worker_num}: --mepic-auto-chunk "
                          f"{config.raw(config.AUTO_CHUNK)} keeps the registered texts in the tokenizer process, "
                          "and each worker would hold its own; run one tokenizer worker")
    if cuda is False and (known.device or "").startswith("cuda"):
        raise LaunchError(f"--device {known.device}: this machine has no CUDA device (torch.cuda.is_available() "
                          "is False); leave --device out to serve on the CPU")
    if known.device == "cpu" and known.attention_backend not in CPU_ATTENTION_BACKENDS:
        raise LaunchError(f"--attention-backend {known.attention_backend}: needs a GPU; on the CPU use one of "
                          f"{', '.join(CPU_ATTENTION_BACKENDS)}")


def check_model_fits(folder: Path, argv: list[str]) -> None:
    """Refuse a model the mepic attention backend would refuse only once loaded (in a child process):
    what `backend.MepicAttnBackend._take_over_rotary` checks that config.json already tells."""
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise LaunchError(f"{folder / 'config.json'}: cannot be read as JSON ({e})") from None
    if not isinstance(hf, dict):
        raise LaunchError(f"{folder / 'config.json'}: not a JSON object")
    if _known_flags(argv).attention_backend != "mepic":
        return
    archs = hf.get("architectures") or []
    other = "serve it with another --attention-backend (and --radix-cache-backend sglang)"
    if not any(a in MEPIC_ARCHITECTURES for a in archs):
        raise LaunchError(f"--attention-backend mepic supports {', '.join(MEPIC_ARCHITECTURES)} (RoPE models); "
                          f"this model is {', '.join(archs) or 'of no stated architecture'}: {other}")
    if hf.get("sliding_window") and hf.get("use_sliding_window", True):
        raise LaunchError(f"--attention-backend mepic does not support sliding-window attention (this model's "
                          f"sliding_window is {hf['sliding_window']}): {other}")


@contextmanager
def _one_line_argument_errors():
    """SGLang's own parser refuses a flag with its whole usage block (some 300 lines) and exit status 2:
    here, one line and status 2."""
    def error(self, message):
        raise LaunchError(message)

    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original


def _from_argument_checks(error: BaseException) -> bool:
    """Whether SGLang's own validation of its flags raised `error` (before any process started):
    `prepare_server_args`, or the resolution `run_server` begins with (`ServerArgs.resolve_once`)."""
    import traceback

    return any(frame.name in ("prepare_server_args", "check_server_args", "__post_init__", "resolve_once")
               for frame in traceback.extract_tb(error.__traceback__))


def check_storage_dir(path: str) -> str:
    """The file tier's directory, created if missing; refused if it cannot be written."""
    path = os.path.abspath(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise LaunchError(f"--mepic-storage-dir {path}: cannot create it ({e.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise LaunchError(f"--mepic-storage-dir {path}: not writable")
    return path


def _without_flag(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def wants_help(argv: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def with_defaults(argv: list[str], cuda: bool, native_bf16: bool | None = None) -> tuple[list[str], dict[str, str]]:
    """Return (argv, env) with the defaults filled in where the user gave none.

    native_bf16: whether the CPU has native bf16 (default: read from /proc/cpuinfo).
    """
    known = _known_flags(argv)
    argv = list(argv)
    env = {"HF_HUB_OFFLINE": "1"}  # nothing may download from a model hub
    if known.model_path is None:
        argv += ["--model-path", str(models.model_dir(models.DEFAULT_MODEL))]
    if known.radix_cache_backend == SGLANG_CACHE:
        argv = _without_flag(argv, "--radix-cache-backend")
    elif known.radix_cache_backend is None and (known.attention_backend or ATTENTION_BACKEND) == "mepic":
        argv += ["--radix-cache-backend", "mepic"]
        known.radix_cache_backend = "mepic"
    if known.radix_cache_backend == "mepic" and known.page_size is None:
        argv += ["--page-size", str(MEPIC_PAGE_SIZE)]
    if known.attention_backend is None:
        argv += ["--attention-backend", ATTENTION_BACKEND]
    if not known.enable_metrics:
        argv += ["--enable-metrics"]  # /metrics, with the chunk cache's figures
    if not known.enable_cache_report:
        argv += ["--enable-cache-report"]  # OpenAI usage reports cached prompt tokens
    if (known.attention_backend or ATTENTION_BACKEND) == "mepic":
        if not cuda and known.cuda_graph_backend_decode is None:
            # No CUDA here: nothing to capture. On CUDA the mepic backend captures decode graphs.
            argv += ["--cuda-graph-backend-decode", "disabled"]
        if cuda and known.cuda_graph_backend_prefill is None:
            # SGLang's default breakable prefill graphs would replay the model with the positions of
            # capture time, not a chunked request's planned positions: prefill runs eagerly.
            argv += ["--cuda-graph-backend-prefill", "disabled"]
    if not cuda:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        if known.device is None:
            argv += ["--device", "cpu"]
        if known.max_total_tokens is None:
            argv += ["--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS)]
        if known.dtype is None and (native_bf16 if native_bf16 is not None else cpu_has_native_bf16()) is False:
            argv += ["--dtype", "float32"]  # emulated bf16 is several times slower than float32
        if not known.sleep_on_idle:
            # An idle scheduler otherwise spins a whole core of a small CPU machine.
            argv += ["--sleep-on-idle"]
    return argv, env


def check_model_path(path: str, argv: list[str] | None = None) -> None:
    """A local HF model folder; with argv, also one the attention backend it names can serve."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise LaunchError(
            f"model folder not found: {folder}\n"
            "  Give --model-path a local HF model folder (hub downloads are disabled), "
            "or build one with: python -m sglang_mepic.models {tiny,smollm2-135m}"
        )
    if not (folder / "config.json").is_file():
        raise LaunchError(f"{folder} is not an HF model folder: it has no config.json")
    if argv is not None:
        check_model_fits(folder, argv)


def check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Same option uvicorn sets, so a socket in TIME_WAIT does not count as taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise LaunchError(f"cannot listen on {host}:{port}: {e.strerror} (is another server running?)") from None


def _ensure_default_model(model_path: str) -> None:
    default = models.model_dir(models.DEFAULT_MODEL)
    if Path(model_path) == default and not models.is_built(default):
        models.build(models.DEFAULT_MODEL)


def _log(line: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] sglang-mepic: {line}", file=sys.stderr, flush=True)


def verify_model(model_path: str, argv: list[str]) -> None:
    """`--mepic-verify`: the accuracy gate, where chunks would be reused; serve as full if it fails."""
    known = _known_flags(argv)
    if (known.attention_backend, known.radix_cache_backend) != ("mepic", "mepic"):
        _log("--mepic-verify: chunks are not reused with this attention backend or radix cache: nothing to check")
        return
    verdict = verify.verify(model_path, argv, _log)
    if verdict is not None and not verdict.passed:
        verify.refuse_reuse(verdict, _log)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _drop_checkout_root_from_path() -> None:
    """`python -m` from the repo root puts it first on sys.path, where `kernels/`
    would shadow the PyPI package `kernels` in this process and the ones it
    spawns. The installed package does not need it there. Installed from its
    wheel, the folder above this package is the site (site-packages, or a
    `pip --target` folder on PYTHONPATH, as the GPU e2e run installs it), which
    holds SGLang itself: it stays."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():  # not a checkout
        return
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != root]


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except LaunchError as e:
        print(e.message, file=sys.stderr)
        raise SystemExit(2) from None


def _main(argv: list[str] | None) -> None:
    _drop_checkout_root_from_path()
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, mepic_env = split_mepic_flags(argv)
    os.environ.update(mepic_env)
    summary = None  # a line for after SGLang's argument checks, so that a refused flag is the only line
    if wants_help(argv):
        mepic_parser().print_help()
        print()
    else:
        cuda = _has_cuda()
        argv, env = with_defaults(argv, cuda=cuda)
        check_combinations(argv, cuda=cuda)
        for key, value in env.items():
            os.environ.setdefault(key, value)
        known = _known_flags(argv)
        _ensure_default_model(known.model_path)
        check_model_path(known.model_path, argv)
        check_port_free(known.host, known.port)
        if config.verify():
            verify_model(known.model_path, argv)
        settings = mepic_settings(argv)
        if quiet_start(argv):  # before SGLang's imports, which warn
            quiet.install(cpu=not cuda, argv=" ".join(argv), mepic=settings)
            quiet.for_children(cpu=not cuda)
            if not cuda:
                summary = quiet.SUMMARY
        else:  # SGLang's full server_args line knows nothing of the --mepic-* flags
            print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] sglang-mepic: {settings}", file=sys.stderr)

    # Imported late: SGLang reads SGLANG_USE_CPU_ENGINE at import time.
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    from sglang_mepic import plugin

    if not plugin._registered:  # SGLang logs a plugin's exception and goes on without it
        raise LaunchError("the sglang-mepic plugin did not register (its error is logged above): the server would "
                          "run without MEPIC's backends and hooks")
    try:
        with _one_line_argument_errors():
            server_args = prepare_server_args(argv)
        if summary:
            _log(summary)
        run_server(server_args)
    except (ValueError, AssertionError) as e:
        if not _from_argument_checks(e) or not quiet_start(argv):  # --log-level debug: the whole traceback
            raise
        raise LaunchError(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
