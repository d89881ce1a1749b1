"""`--mepic-verify`: the launcher runs the accuracy gate (check_model) before it serves.

The gate runs on a server of its own (a free loopback port, stopped after) with
this launch's MEPIC settings and SGLang flags, so the verdict is about the
configuration that will serve. A model that fails is served as `--mepic-mode full`
(reuse refused): the log says so, `/server_info` reports the refused mode
(`mepic.reuse_refused`) and `/metrics` the gauge `sglang_mepic:reuse_refused`.
Verdicts are cached (verdict_cache.py), so a restart does not run the gate again.
"""

import os
import sys
from typing import Callable

from sglang_mepic import config, env
from sglang_mepic.gate import calibration, check_model
from sglang_mepic.gate import verdict as gate
from sglang_mepic.gate import verdict_cache

# Flags of the launch that the gate's own server must not share: it listens elsewhere, is
# asked without a key, and writes nothing of the calibration set to a shared tier.
NOT_PASSED_ON = ("--model-path", "--model", "--host", "--port", "--api-key")
NOT_INHERITED = (config.VERIFY.env, config.REUSE_REFUSED_ENV, config.STORAGE_DIR.env, config.STORAGE_BACKEND.env, config.STORAGE_CONFIG.env)
# The settings a verdict depends on besides the model, the mode and the SGLang flags.
FIDELITY_SETTINGS = (config.RECOMPUTE_BLOCKS.env, config.COMPILE_SINK.env, config.PLACEMENT.env)


def gate_server_args(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in NOT_PASSED_ON:
            skip = True
        elif not any(a.startswith(flag + "=") for flag in NOT_PASSED_ON):
            out.append(a)
    return out


def questions() -> int:
    """--mepic-verify-questions, checked against the calibration set's size; default, all of it."""
    n = env.settings().verify_questions
    return calibration.size() if n is None else config.parse_questions(str(n), calibration.size())


def verify(model_path: str, argv: list[str], log: Callable[[str], None]) -> gate.Verdict | None:
    """The verdict for this model and the configured mode (cached or measured now); None
    where there is nothing to check (a mode or cache that reuses no chunk)."""
    mode = env.settings().mode
    if not mode.reuses:
        log(f"--mepic-verify: mode {mode.name} reuses nothing, so there is nothing to check")
        return None
    server_args = gate_server_args(argv)
    n, thresholds = questions(), gate.Thresholds()
    settings = {"server_args": server_args, **{k: os.environ.get(k) for k in FIDELITY_SETTINGS}}
    key = verdict_cache.key(verdict_cache.model_fingerprint(model_path), mode.name, n, thresholds, settings)
    verdict = verdict_cache.load(key)
    if verdict is not None:
        log(f"--mepic-verify: cached verdict used for this model (fingerprint {key['model']}) and mode "
            f"{mode.name}: {'PASS' if verdict.passed else 'FAIL'} (from {verdict_cache.cache_dir()})")
    else:
        log(f"--mepic-verify: running the accuracy gate for mode {mode.name} ({n} questions; "
            "python -m sglang_mepic.check_model runs the same)")
        verdict = check_model.run_gate(model_path, mode, n, thresholds, server_args,
                                       env={name: "" for name in NOT_INHERITED}, progress=sys.stderr.isatty(),
                                       log=lambda line: log(f"--mepic-verify: {line}"))
        path = verdict_cache.store(key, verdict)
        log(f"--mepic-verify: verdict cached in {path}")
    for line in verdict.lines():
        log(f"--mepic-verify: {line}")
    return verdict


def refuse_reuse(verdict: gate.Verdict, log: Callable[[str], None]) -> None:
    """Serve as `full`, and have every process report the refused mode."""
    os.environ[config.REUSE_REFUSED_ENV] = verdict.mode
    os.environ[config.MODE.env] = "full"
    env.reload()
    log(f"--mepic-verify: reuse refused for this model: mode {verdict.mode} failed the accuracy gate, "
        "serving as --mepic-mode full (every token computed in context)")
