"""The few SGLang flags this wrapper reads, the values it gives them by default, and its one-line refusal.

Everything else on the command line is SGLang's business and passes through untouched."""

import argparse

from sglang_mepic.launch.sglang_options import AmbiguousFlag, canonical, spellings_of, with_config_file

PROG = "sglang_mepic.launch_server"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
MEPIC_PAGE_SIZE = 16  # one MEPIC block = one SGLang page
ATTENTION_BACKEND = "mepic"  # NoPE keys with RoPE fused into attention
SGLANG_CACHE = "sglang"  # `--radix-cache-backend sglang`: SGLang's built-in tree, no chunk reuse


class LaunchError(SystemExit):
    """A start-up refused with a one-line reason; `main` prints it and exits with status 2 (as argparse does)."""

    def __init__(self, message: str):
        self.message = f"{PROG}: error: {message}"
        super().__init__(self.message)


class Parser(argparse.ArgumentParser):
    """argparse, but a refused flag is one line (no usage block) and exit status 2, as `LaunchError`."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


class _Flags(Parser):
    """Each flag under every full spelling SGLang gives it (`--enable-hicache` is `--enable-hierarchical-cache`)."""

    def add_argument(self, *names, **kwargs):
        spellings = dict.fromkeys([*names, *(s for name in names for s in spellings_of(name))])  # names first: dest
        return super().add_argument(*spellings, **kwargs)


def sglang_argv(argv: list[str]) -> list[str]:
    """argv as SGLang's parser reads it (abbreviations written out): what every check and default reads."""
    if "--" in argv:  # SGLang takes no positional argument: it refuses what follows, the checks would not see it
        raise LaunchError("--: SGLang's server takes no positional arguments; give every setting as a flag")
    try:
        return canonical(argv)
    except AmbiguousFlag as e:
        raise LaunchError(str(e)) from None


def merged_config(argv: list[str]) -> list[str]:
    """argv with a `--config` file's flags in it, so that the checks read them too."""
    try:
        return sglang_argv(with_config_file(sglang_argv(argv)))
    except (ValueError, OSError) as e:
        raise LaunchError(f"--config: {e}") from None


def known_flags(argv: list[str]) -> argparse.Namespace:
    """The few flags this wrapper reads, in any spelling SGLang accepts; everything else is SGLang's business."""
    argv = sglang_argv(argv)
    p = _Flags(add_help=False, allow_abbrev=False)
    p.add_argument("--model-path")
    p.add_argument("--host", default=DEFAULT_HOST)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--device")
    p.add_argument("--dtype")
    p.add_argument("--attention-backend")
    p.add_argument("--prefill-attention-backend")
    p.add_argument("--decode-attention-backend")
    p.add_argument("--max-total-tokens")
    p.add_argument("--radix-cache-backend")
    p.add_argument("--page-size")
    p.add_argument("--cuda-graph-backend-decode")
    p.add_argument("--cuda-graph-backend-prefill")
    p.add_argument("--sleep-on-idle", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--log-level")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--json-model-override-args")
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--load-balance-method")
    p.add_argument("--attn-dp-size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--enable-hierarchical-cache", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--context-length")
    p.add_argument("--chunked-prefill-size")
    p.add_argument("--tokenizer-worker-num", type=int, default=1)
    p.add_argument("--schedule-policy")
    p.add_argument("--enable-priority-scheduling", action="store_true")
    p.add_argument("--default-priority-value")
    p.add_argument("--disaggregation-mode", default="null")
    known, _ = p.parse_known_args(argv)
    return known


def quiet_start(argv: list[str]) -> bool:
    """Quiet unless the user asked for debug logs."""
    return (known_flags(argv).log_level or "").lower() != "debug"
