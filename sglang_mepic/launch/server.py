"""Launch SGLang's own HTTP server with sglang-mepic loaded.

    python -m sglang_mepic.launch_server [any sglang.launch_server flag ...]

Every flag is passed on to SGLang. What this wrapper adds, each part in its own module of `launch/`
(`sglang_flags`: the SGLang flags it reads and its one-line refusal; `defaults`; `mepic_flags`; `checks`):
- with no `--model-path`, the embedded default model (SmolLM2-135M-Instruct);
- `--attention-backend mepic` (NoPE keys, RoPE applied inside attention) with
  `--radix-cache-backend mepic` (chunk reuse) and `--page-size 16`
  (`--radix-cache-backend sglang` keeps SGLang's built-in cache instead);
- `--enable-metrics` (Prometheus `/metrics`, MEPIC figures included) and
  `--enable-cache-report` (cached prompt tokens in OpenAI `usage`);
- the `--mepic-*` flags (mode, recompute blocks, pad placement), which become
  environment settings read by every SGLang process (`mepic_flags`);
- on a machine without CUDA, the CPU defaults (`SGLANG_USE_CPU_ENGINE=1`,
  `--device cpu`, a bounded `--max-total-tokens`, `--sleep-on-idle`, and
  `--dtype float32` where the CPU has no native bf16);
- each default only where the flag is not given (`defaults`);
- clear one-line errors and exit status 2, before any server process starts
  (`checks.check_combinations`, `checks.check_model_fits`), for a missing model folder, a
  port that is taken or out of range, pipeline parallelism, DP attention and the TP and DP
  combinations the mepic cache does not serve,
  SGLang's hierarchical cache or `--disable-radix-cache` (in a reusing mode)
  with the mepic cache, HiCache or a GPU attention backend on the CPU, a
  quantized KV cache or speculative decoding with the mepic attention backend, a prefill or
  decode attention backend beside it,
  a model it cannot serve (architecture, sliding window: from config.json),
  sizes below 1 (page, pool, context, chunked prefill, parallel ranks), a bad
  flag value (no usage block), and what SGLang's own argument checks refuse
  (`--log-level debug` keeps their traceback);
- a quiet start-up: SGLang's ~20 KB `server_args=` line becomes the command
  line and the effective MEPIC settings (defaults included), and on CPU its CUDA-only notices are replaced by one line saying so
  (`--log-level debug` keeps everything; quiet.py).
"""

import os
import sys
import time
from pathlib import Path

from sglang_mepic import env
from sglang_mepic.gate import verify
from sglang_mepic.launch import checks, models, quiet
from sglang_mepic.launch.defaults import with_defaults
from sglang_mepic.launch.mepic_flags import mepic_parser, mepic_settings, split_mepic_flags
from sglang_mepic.launch.sglang_flags import LaunchError, known_flags, merged_config, quiet_start, sglang_argv


def _ensure_default_model(model_path: str) -> None:
    default = models.model_dir(models.DEFAULT_MODEL)
    if Path(model_path) == default and not models.is_built(default):
        models.build(models.DEFAULT_MODEL)


def _log(line: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] sglang-mepic: {line}", file=sys.stderr, flush=True)


def verify_model(model_path: str, argv: list[str]) -> None:
    """`--mepic-verify`: the accuracy gate, where chunks would be reused; serve as full if it fails."""
    known = known_flags(argv)
    if (known.attention_backend, known.radix_cache_backend) != ("mepic", "mepic"):
        _log("--mepic-verify: chunks are not reused with this attention backend or radix cache: nothing to check")
        return
    verdict = verify.verify(model_path, argv, _log)
    if verdict is not None and not verdict.passed:
        verify.refuse_reuse(verdict, _log)


def wants_help(argv: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _drop_checkout_root_from_path() -> None:
    """`python -m` from the repo root puts it first on sys.path, where its folders
    (eval/, shims/, tests/) would be top-level import names in this process and
    the ones it spawns. The installed package does not need it there. Installed from its
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
    argv = sglang_argv(argv)  # one reading: every check, default and SGLang itself see the same flags
    os.environ.update(mepic_env)
    env.reload()  # this process's settings, from the flags it was given
    summary = None  # a line for after SGLang's argument checks, so that a refused flag is the only line
    if wants_help(argv):
        mepic_parser().print_help()
        print()
    else:
        cuda = _has_cuda()
        if "--config" in argv:  # SGLang's parser is imported to merge it: with the engine it will run
            os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "0" if cuda else "1")
            argv = merged_config(argv)
        argv, sglang_env = with_defaults(argv, cuda=cuda)
        checks.check_combinations(argv, cuda=cuda)
        for key, value in sglang_env.items():
            os.environ.setdefault(key, value)
        known = known_flags(argv)
        _ensure_default_model(known.model_path)
        checks.check_model_path(known.model_path, argv)
        checks.check_port_free(known.host, known.port)
        if env.settings().verify:
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
        with checks.one_line_argument_errors():
            server_args = prepare_server_args(argv)
        if summary:
            _log(summary)
        run_server(server_args)
    except (ValueError, AssertionError) as e:
        if not checks.from_argument_checks(e) or not quiet_start(argv):  # --log-level debug: the whole traceback
            raise
        raise LaunchError(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
