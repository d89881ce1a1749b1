"""The start-up checks: flags and combinations this server cannot serve, refused in one line before any
server process starts (each ended in a traceback from a child process, or no start at all)."""

import argparse
import importlib.util
import json
import re
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from sglang_mepic import env
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE, LaunchError, known_flags

# backend.SUPPORTED_ARCHITECTURES, named here without importing SGLang before its environment is set
# (tests/launch/test_launch.py checks that the two agree).
MEPIC_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# KV cache dtypes the mepic backend reads: the model's own or bf16, and fp8 with SGLang's per-layer scales.
MEPIC_KV_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
# Attention backends SGLang offers for a CPU (`--device cpu`), and ours; the others need a GPU or an accelerator.
CPU_ATTENTION_BACKENDS = ("mepic", "torch_native", "intel_amx", "flex_attention")
# RAM SGLang's HiCache host pool (which the mepic host tier is) leaves free when it sizes itself:
# HICACHE_HOST_MEMORY_RESERVE_BYTES of sglang/srt/mem_cache/pool_host/base.py (tests/launch/test_launch.py checks it).
HOST_POOL_RESERVE_BYTES = 10 * 1024**3


def check_parallelism(argv: list[str]) -> None:
    """With the mepic cache, serve tensor parallelism where every rank plans alike; refuse the rest, before
    anything loads (docs/scale-out.md).

    `--tp-size N` is served when the model's attention heads and KV heads both divide by N: each rank keeps
    its own heads of every page and runs the same scheduler on the same requests, so chunk keys, plans and
    page ids agree, and a storage entry is keyed by (tp_rank, tp_size). Refused under TP > 1:
    - a model whose heads do not divide (SGLang would pad or replicate them: untested here).
    CacheBlend is served: its per-token KV deviation is summed over the ranks' heads (an all-reduce at the
    check layer, attention/blend.py) before it selects, so every rank recomputes the same tokens.
    Shared storage and the host tier are served: what a rank finds there is its own (a read's timeout, an
    outage), so the ranks agree on it each round by a MIN all-reduce, as HiCache's do (tiers/agreement.py),
    and each rank's host pool takes the GB asked (check_host_memory counts every rank).
    `--dp-size N` is served as `check_data_parallel` says. PP and DP attention stay refused: a pipeline stage
    holds only its layers' KV, and DP attention's schedulers run their forwards in one TP group."""
    known = known_flags(argv)
    if known.radix_cache_backend != "mepic":
        return
    given = [f"{flag} {value}" for flag, value in (("--pp-size", known.pp_size),
                                                   ("--attn-dp-size", known.attn_dp_size)) if value > 1] + \
        (["--enable-dp-attention"] if known.enable_dp_attention else [])
    if given:
        raise LaunchError(f"{', '.join(given)}: --radix-cache-backend mepic serves tensor and data parallelism only "
                          "(a pipeline stage holds only its layers' KV, and DP attention runs its schedulers' "
                          "forwards in one tensor-parallel group, untested with the mepic cache); use --dp-size N "
                          "(a whole replica each) or --radix-cache-backend sglang")
    check_data_parallel(known)
    tp = known.tp_size
    if tp <= 1:
        return
    check_tp_heads(known.model_path, tp, must_read=False, override=known.json_model_override_args)


def check_tp_heads(model_path: str | Path | None, tp: int, must_read: bool, override: str | None = None) -> None:
    """Under `--tp-size` above 1 with the mepic cache, the model's attention and KV heads divide by it.
    must_read: the folder exists now (check_model_fits, after the default model is built), so heads that
    cannot be read are refused too; before that (check_parallelism) an unreadable folder is left to
    check_model_path."""
    heads = _attention_heads(None if model_path is None else str(model_path), override)
    if heads is None and must_read:
        raise LaunchError(f"--tp-size {tp}: --radix-cache-backend mepic serves TP only where it can read the "
                          "model's attention and KV heads (num_attention_heads, num_key_value_heads) from its "
                          "config.json, and this one does not say them")
    if heads is not None and (heads[0] % tp or heads[1] % tp):
        raise LaunchError(f"--tp-size {tp}: --radix-cache-backend mepic serves TP only where the model's attention "
                          f"heads ({heads[0]}) and KV heads ({heads[1]}) both divide by the TP size (padded or "
                          f"replicated heads are untested); use a --tp-size that divides both")


def check_data_parallel(known: argparse.Namespace) -> None:
    """`--dp-size N` with the mepic cache: N whole replicas, each its own scheduler and cache, and SGLang's DP
    controller sends each request to the replica that holds its chunks, under a bound on load
    (scale_out/affinity.py; an explicit --load-balance-method is the user's). Refused beside it:
    - `--tp-size` above 1: replicas of several ranks are untested here;
    - `--load-balance-method follow_bootstrap_room` without disaggregation: SGLang's controller asserts every
      request carries a prefill-decode bootstrap room, and stopped the server at the first one that did not;
    - the host tier and shared storage: each replica would make a host pool of its own (the memory check
      counts one), and replicas sharing a store are untested."""
    dp = known.dp_size
    if dp <= 1:
        return
    if known.tp_size > 1:
        raise LaunchError(f"--dp-size {dp} with --tp-size {known.tp_size}: --radix-cache-backend mepic serves data "
                          "parallelism over single-rank replicas only (replicas of several TP ranks are untested); "
                          "use --dp-size alone or --tp-size alone")
    if known.load_balance_method == "follow_bootstrap_room" and known.disaggregation_mode in (None, "null"):
        raise LaunchError("--load-balance-method follow_bootstrap_room: SGLang's DP controller routes by the "
                          "bootstrap room only a disaggregated server's requests carry, and stops at the first "
                          "request without one; leave it out (chunk affinity with the mepic cache) or use "
                          "round_robin, total_requests or total_tokens")
    settings = env.settings()
    tiers = [flag for flag, on in (("--mepic-storage-backend", settings.storage_backend is not None),
                                   ("--mepic-host-tier-gb", settings.host_tier_gb > 0)) if on]
    if tiers:
        raise LaunchError(f"--dp-size {dp}: {' and '.join(tiers)} under data parallelism is untested (each replica "
                          "would make a host pool of its own, and replicas would share one store); use --dp-size 1 "
                          "with a host tier or shared storage")


def _attention_heads(model_path: str | None, override: str | None = None) -> tuple[int, int] | None:
    """(attention heads, KV heads) from the model folder's config.json (a text config's, for a multimodal
    one), with `--json-model-override-args` laid over it as SGLang lays it over the HF config; None where
    the folder or its counts cannot be read (check_model_path refuses that folder)."""
    try:
        hf = json.loads((Path(model_path or "").expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(hf, dict):
        return None
    try:
        extra = json.loads(override) if override else {}
    except ValueError:
        raise LaunchError(f"--json-model-override-args {override}: not JSON") from None
    if isinstance(extra, dict):
        hf = {**hf, **extra}
    text_config = hf.get("text_config")
    text = text_config if isinstance(text_config, dict) else hf
    heads = text.get("num_attention_heads")
    kv = text.get("num_key_value_heads") or heads  # absent or null: one KV head per head, as HF reads it
    return (heads, kv) if isinstance(heads, int) and isinstance(kv, int) and heads > 0 and kv > 0 else None


# SGLang's `human_readable_int` (sglang/srt/utils/common.py), which reads --context-length and
# --max-total-tokens: `64k`, `1Ki`, `25.6k`. SGLang parses them; here only their size is checked (its module
# imports torch and reads SGLang's environment, which the launcher has not finished setting).
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")
_MULTIPLIERS = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _count(value: str, human: bool) -> float:
    if human and (match := _HUMAN_INT.fullmatch(value.strip())):
        return float(match.group(1)) * _MULTIPLIERS[match.group(2)]
    return int(value)


def _token_count(flag: str, value: str | None, too_small: str, off: int | None = None, human: bool = False) -> None:
    """A flag counting tokens is a whole number of at least 1 (or its `off` value): 0 divided by zero
    or sized an empty pool in a child process, which died with a traceback. human: SGLang also reads
    `64k` and `1Ki` there."""
    if value is None:
        return
    try:
        count = _count(value, human)
    except ValueError:
        raise LaunchError(f"{flag} {value}: must be a whole number of tokens"
                          + (" (or 64k, 1Ki ...)" if human else "")) from None
    if count < 1 and count != off:
        raise LaunchError(f"{flag} {value}: {too_small}")


def check_combinations(argv: list[str], cuda: bool | None = None) -> None:
    """Refuse, before anything loads, the flags and combinations this server cannot serve (each
    ended in a traceback from a child process, or no start at all).

    argv: after `with_defaults`; cuda: whether this machine has a CUDA device (None: not checked)."""
    known = known_flags(argv)
    if not 1 <= known.port <= 65535:
        raise LaunchError(f"--port {known.port}: a TCP port is 1-65535")
    for flag, value in (("--tp-size", known.tp_size), ("--pp-size", known.pp_size), ("--dp-size", known.dp_size),
                        ("--attn-dp-size", known.attn_dp_size)):
        if value < 1:
            raise LaunchError(f"{flag} {value}: must be at least 1")
    check_parallelism(argv)
    _token_count("--page-size", known.page_size, f"a page holds at least 1 token (the mepic cache uses "
                 f"{MEPIC_PAGE_SIZE}, one MEPIC block per page)")
    _token_count("--max-total-tokens", known.max_total_tokens, "the KV pool needs at least 1 token", human=True)
    _token_count("--context-length", known.context_length, "a context holds at least 1 token", human=True)
    _token_count("--chunked-prefill-size", known.chunked_prefill_size,
                 "a prefill chunk holds at least 1 token (or -1 to turn chunked prefill off)", off=-1)
    if known.disaggregation_mode not in (None, "null") and known.attention_backend == "mepic":
        raise LaunchError(f"--disaggregation-mode {known.disaggregation_mode}: --attention-backend mepic places a "
                          "request's positions when it is prefilled in this server; a decode server that takes "
                          "prefilled requests would decode them with no placement; serve without "
                          "disaggregation, or with another --attention-backend")
    # SGLang then runs a hybrid backend that sends each extend to one backend and each decode to the other: the
    # mepic backend would read keys another backend wrote rotated (or leave NoPE keys to one that rotates none),
    # and would never see the extends that place a request's positions and reset its decode cache.
    split = {flag: value for flag, value in (("--prefill-attention-backend", known.prefill_attention_backend),
                                             ("--decode-attention-backend", known.decode_attention_backend))
             if value is not None and value != known.attention_backend}
    if split and "mepic" in (known.attention_backend, *split.values()):
        flag, value = next(iter(split.items()))
        raise LaunchError(f"{flag} {value}: the mepic attention backend serves both prefill and decode (it "
                          "stores keys without RoPE and places a request's positions when it is prefilled); drop "
                          f"{flag}, or serve with another --attention-backend")
    if known.schedule_policy == "priority":
        raise LaunchError("--schedule-policy priority: SGLang 0.5.23 lists it, but its scheduler knows no such "
                          "policy and stops at start; use --enable-priority-scheduling with --schedule-policy "
                          "fcfs or lof")
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
    settings = env.settings()
    if known.disable_radix_cache and known.radix_cache_backend == "mepic" and settings.mode.reuses:
        raise LaunchError(f"--disable-radix-cache: --mepic-mode {settings.mode.name} reuses chunks through the "
                          "radix cache; drop --disable-radix-cache, or use --mepic-mode full or "
                          "--radix-cache-backend sglang")
    if known.attention_backend == "mepic" and (known.kv_cache_dtype or "auto") not in MEPIC_KV_DTYPES:
        raise LaunchError(f"--kv-cache-dtype {known.kv_cache_dtype}: --attention-backend mepic reads the KV cache "
                          f"as {', '.join(MEPIC_KV_DTYPES)} only")
    if known.tokenizer_worker_num > 1:
        # SGLang's extra tokenizer workers are processes the plugin's tokenizer hooks never reach: marked
        # chunks went to the model as text, with no mepic_* report, and registered texts would be per worker.
        raise LaunchError(f"--tokenizer-worker-num {known.tokenizer_worker_num}: sglang-mepic reads chunk markup, "
                          "auto-chunking and registered texts in SGLang's one tokenizer process, and its "
                          "tokenizer workers would serve without them; run one tokenizer worker")
    if known.radix_cache_backend == "mepic":  # the only cache that makes a host tier
        check_host_memory(settings.host_tier_gb, max(known.tp_size, 1))
    if cuda is False and (known.device or "").startswith("cuda"):
        raise LaunchError(f"--device {known.device}: this machine has no CUDA device (torch.cuda.is_available() "
                          "is False); leave --device out to serve on the CPU")
    if known.device == "cpu" and known.attention_backend not in CPU_ATTENTION_BACKENDS:
        raise LaunchError(f"--attention-backend {known.attention_backend}: needs a GPU; on the CPU use one of "
                          f"{', '.join(CPU_ATTENTION_BACKENDS)}")
    if known.device == "cpu" and known.kv_cache_dtype == "fp8_e4m3" and known.attention_backend == "mepic":
        # SGLang's CPU pool takes e4m3 only quantized its own way, for its intel_amx backend (Intel AMX).
        raise LaunchError("--kv-cache-dtype fp8_e4m3: on the CPU SGLang keeps an e4m3 KV cache only for its "
                          "intel_amx attention backend; with --attention-backend mepic use --kv-cache-dtype fp8_e5m2 "
                          "(e4m3 is for GPUs)")


def free_host_memory() -> int:
    """Free RAM in bytes as SGLang's host pool counts it (`available_host_memory_bytes`: available memory,
    bounded by the cgroup's headroom). Its module is loaded from its file alone: importing the sglang package
    takes half a minute and reads the environment the launcher has not finished setting."""
    found = importlib.util.find_spec("sglang")  # finds the package without importing it
    assert found is not None and found.origin is not None, "sglang is not installed"
    path = Path(found.origin).parent / "srt" / "mem_cache" / "host_memory.py"
    spec = importlib.util.spec_from_file_location("_sglang_host_memory", path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.available_host_memory_bytes(allow_cgroup_fallback=True)


def check_host_memory(gigabytes: float, ranks: int = 1) -> None:
    """Refuse a host tier SGLang's host pool would refuse in the scheduler process, with a traceback, once the
    model has loaded: it wants the tier's size free plus its reserve (`HOST_POOL_RESERVE_BYTES`). Under TP
    each of the `ranks` makes a pool of that size (SGLang gives each rank its share of what is free)."""
    if gigabytes <= 0:
        return
    given = format(gigabytes, "f").rstrip("0").rstrip(".")  # as written: 0.5, 1000000
    needed, available = ranks * gigabytes * 1e9 + HOST_POOL_RESERVE_BYTES, free_host_memory()
    if needed > available:
        each = f"{ranks} TP ranks, {given} GB each" if ranks > 1 else f"{given} GB"
        raise LaunchError(f"--mepic-host-tier-gb {given}: the host tier needs {needed / 1e9:.1f} GB of free "
                          f"RAM ({each} for the tier and the {HOST_POOL_RESERVE_BYTES / 1024**3:.0f} GiB "
                          f"SGLang's host pool leaves free); {available / 1e9:.1f} GB is available")


def check_model_fits(folder: Path, argv: list[str]) -> None:
    """Refuse a model the mepic attention backend would refuse only once loaded (in a child process):
    what `attention/rotary_takeover.py::take_over_rotary` checks that config.json already tells; and under TP,
    heads the TP size does not divide, for a folder that did not exist at check_parallelism (the default
    model, built after the flag checks)."""
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise LaunchError(f"{folder / 'config.json'}: cannot be read as JSON ({e})") from None
    if not isinstance(hf, dict):
        raise LaunchError(f"{folder / 'config.json'}: not a JSON object")
    known = known_flags(argv)
    if known.radix_cache_backend == "mepic" and known.tp_size > 1:  # the default model exists only now
        check_tp_heads(folder, known.tp_size, must_read=True, override=known.json_model_override_args)
    if known.attention_backend != "mepic":
        return
    archs = hf.get("architectures") or []
    other = "serve it with another --attention-backend (and --radix-cache-backend sglang)"
    if not any(a in MEPIC_ARCHITECTURES for a in archs):
        raise LaunchError(f"--attention-backend mepic supports {', '.join(MEPIC_ARCHITECTURES)} (RoPE models); "
                          f"this model is {', '.join(archs) or 'of no stated architecture'}: {other}")
    if hf.get("sliding_window") and hf.get("use_sliding_window", True):
        raise LaunchError(f"--attention-backend mepic does not support sliding-window attention (this model's "
                          f"sliding_window is {hf['sliding_window']}): {other}")


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


@contextmanager
def one_line_argument_errors():
    """SGLang's own parser refuses a flag with its whole usage block (some 300 lines) and exit status 2:
    here, one line and status 2."""
    def error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        raise LaunchError(message)

    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original


def from_argument_checks(error: BaseException) -> bool:
    """Whether SGLang's own validation of its flags raised `error` (before any process started):
    `prepare_server_args`, or the resolution `run_server` begins with (`ServerArgs.resolve_once`)."""
    import traceback

    return any(frame.name in ("prepare_server_args", "check_server_args", "__post_init__", "resolve_once")
               for frame in traceback.extract_tb(error.__traceback__))
