"""The launcher: CPU defaults, flag pass-through and start-up errors."""

import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest

from sglang_mepic import env
from sglang_mepic.launch import checks, defaults, mepic_flags, models, sglang_flags
from sglang_mepic.launch.defaults import with_defaults
from support.abbreviations import abbreviated
from support.launcher import assert_refused


def flag_value(argv, flag):
    return argv[argv.index(flag) + 1]


def test_cpu_defaults_fill_missing_flags():
    argv, env = with_defaults(["--model-path", "m"], cuda=False)
    assert flag_value(argv, "--device") == "cpu"
    assert flag_value(argv, "--attention-backend") == "mepic"
    assert flag_value(argv, "--radix-cache-backend") == "mepic"
    assert flag_value(argv, "--page-size") == "16"
    assert "--enable-metrics" in argv and "--enable-cache-report" in argv
    assert flag_value(argv, "--cuda-graph-backend-decode") == "disabled"
    assert int(flag_value(argv, "--max-total-tokens")) == defaults.CPU_MAX_TOTAL_TOKENS
    assert "--sleep-on-idle" in argv
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("given", [["--max-total-tokens", "4096"], ["--max-total-tokens=4096"]])
def test_user_flags_win_over_defaults(given):
    user = ["--model-path", "m", "--attention-backend", "triton", *given]
    argv, _ = with_defaults(user, cuda=False, native_bf16=True)
    added = argv[len(user):]
    assert argv[:len(user)] == user
    assert "--attention-backend" not in added and "--max-total-tokens" not in added
    # triton attention: no mepic cache, no CUDA-graph override
    assert added == ["--enable-metrics", "--enable-cache-report", "--device", "cpu", "--sleep-on-idle"]


def test_cpu_scheduler_leaves_a_core_to_the_other_processes():
    plan = defaults.CpuThreads.plan
    assert plan({}, 1, 1, 128) is None  # one core: nothing to leave
    assert plan({"OMP_NUM_THREADS": "2"}, 2, 2, 128) is None  # the user's (or launch_cluster's) count stays
    assert plan({"SGLANG_CPU_OMP_THREADS_BIND": "0-1"}, 2, 2, 128) is None  # as many cores as torch's threads
    assert plan({}, 16, 16, 128).fewer == 15 and plan({}, 8, 3, 128).fewer == 2
    threads = plan({}, 2, 2, 576)  # SmolLM2's hidden size
    long_extend = -(-defaults.LONG_EXTEND_WORK // 576)
    steps = [(False, 0), (False, 0), (True, 200), (True, long_extend), (True, long_extend - 1), (False, 0)]
    assert [threads.for_forward(*s) for s in steps] == [1, None, None, 2, 1, None]  # None: the count set stays


def test_float32_by_default_on_a_cpu_without_native_bf16(monkeypatch):
    avx2_only = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    sapphire_rapids = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    assert defaults.cpu_has_native_bf16(avx2_only) is False
    assert defaults.cpu_has_native_bf16(sapphire_rapids) is True
    assert defaults.cpu_has_native_bf16("") is None  # nothing known: SGLang's own default stays
    argv, _ = with_defaults(["--model-path", "m"], cuda=False, native_bf16=False)
    assert flag_value(argv, "--dtype") == "float32"
    argv, _ = with_defaults(["--model-path", "m"], cuda=False, native_bf16=True)
    assert "--dtype" not in argv
    monkeypatch.setattr(defaults, "cpu_has_native_bf16", lambda: None)  # e.g. no /proc/cpuinfo
    argv, _ = with_defaults(["--model-path", "m"], cuda=False)
    assert "--dtype" not in argv
    argv, _ = with_defaults(["--model-path", "m", "--dtype", "bfloat16"], cuda=False, native_bf16=False)
    assert flag_value(argv, "--dtype") == "bfloat16" and argv.count("--dtype") == 1
    argv, _ = with_defaults(["--model-path", "m"], cuda=True, native_bf16=False)
    assert "--dtype" not in argv  # a GPU has its own bf16


def test_cuda_machine_gets_no_cpu_defaults():
    argv, env = with_defaults(["--model-path", "m", "--attention-backend", "triton"], cuda=True)
    assert argv == ["--model-path", "m", "--attention-backend", "triton", "--enable-metrics", "--enable-cache-report"]
    assert "SGLANG_USE_CPU_ENGINE" not in env


def test_cuda_keeps_decode_and_prefill_graphs_for_the_mepic_backend():
    """On CUDA the mepic backend captures decode graphs and runs prefill under SGLang's default breakable
    prefill graphs (its captured-metadata hooks place planned positions, issue 69): no graph flag is added,
    and the user's choice stands."""
    argv, _ = with_defaults(["--model-path", "m"], cuda=True)
    assert flag_value(argv, "--attention-backend") == "mepic"
    assert "--cuda-graph-backend-decode" not in argv
    assert "--cuda-graph-backend-prefill" not in argv
    for choice in ("breakable", "disabled"):
        argv, _ = with_defaults(["--model-path", "m", "--cuda-graph-backend-prefill", choice], cuda=True)
        assert flag_value(argv, "--cuda-graph-backend-prefill") == choice and argv.count(choice) == 1


def test_default_model_when_no_model_path():
    argv, _ = with_defaults([], cuda=False)
    assert flag_value(argv, "--model-path") == str(models.model_dir(models.DEFAULT_MODEL))
    argv, _ = with_defaults(["--model", "x"], cuda=False)
    assert "--model-path" not in argv


def run_launcher(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "sglang_mepic.launch_server", *args],
                          capture_output=True, text=True, timeout=timeout)


class ReachedSGLang(Exception):
    """The launcher got past its own checks, to where it imports and starts SGLang."""


@pytest.fixture
def launch_here(monkeypatch, capsys):
    """`launch_here(*args)`: the launcher's `main` in this process, stopped where it would import SGLang
    (a subprocess costs an interpreter and its imports, 5-10 s a case). Gives what a process would have
    given: the exit status and its output (stdout, stderr). The environment it changes is restored."""
    import os

    from sglang_mepic.launch import server

    def stop(argv):
        raise ReachedSGLang(" ".join(argv))

    monkeypatch.setattr(server, "quiet_start", stop)

    def launch(*args):
        saved = dict(os.environ)
        capsys.readouterr()
        try:
            server.main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code
        finally:
            os.environ.clear()
            os.environ.update(saved)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["launch_server", *args], code, out.out, out.err)

    return launch


def test_missing_model_folder_is_a_clear_error(tmp_path, launch_here):
    out = launch_here("--model-path", str(tmp_path / "nope"), "--port", "1")
    assert out.returncode != 0
    assert "model folder not found" in out.stderr
    assert "Traceback" not in out.stderr


def test_folder_without_config_is_a_clear_error(tmp_path, launch_here):
    out = launch_here("--model-path", str(tmp_path))
    assert out.returncode != 0
    assert "no config.json" in out.stderr


def test_port_in_use_is_a_clear_error(tiny_model, launch_here):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = launch_here("--model-path", tiny_model, "--port", str(port))
    assert out.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


def test_mepic_cache_defaults_to_page_size_16():
    argv, _ = with_defaults(["--model-path", "m", "--radix-cache-backend", "mepic"], cuda=False)
    assert flag_value(argv, "--page-size") == "16"
    argv, _ = with_defaults(["--model-path", "m", "--radix-cache-backend", "mepic", "--page-size", "4"], cuda=False)
    assert argv.count("--page-size") == 1


def test_sglang_cache_opts_out_of_chunk_reuse():
    argv, _ = with_defaults(["--model-path", "m", "--radix-cache-backend", "sglang"], cuda=False)
    assert "--radix-cache-backend" not in argv and "--page-size" not in argv
    argv, _ = with_defaults(["--model-path", "m", "--radix-cache-backend=sglang"], cuda=False)
    assert not any(a.startswith("--radix-cache-backend") for a in argv)


def test_mepic_flags_are_consumed_here():
    argv, env = mepic_flags.split_mepic_flags(["--model-path", "m", "--mepic-placement", "leading",
                                               "--mepic-mode", "epic-16", "--mepic-recompute-blocks", "all",
                                               "--mepic-text-markup", "off"])
    assert argv == ["--model-path", "m"]
    assert env == {"SGLANG_MEPIC_PLACEMENT": "leading", "SGLANG_MEPIC_MODE": "epic-16",
                   "SGLANG_MEPIC_RECOMPUTE_BLOCKS": "all", "SGLANG_MEPIC_TEXT_MARKUP": "off"}


@pytest.mark.parametrize("flag", [["--mepic-mode", "epic"], ["--mepic-mode", "cacheblend-2"],
                                  ["--mepic-mode", "turbo"], ["--mepic-recompute-blocks", "0"]])
def test_bad_mepic_flags_are_refused_with_the_choices(flag, capsys):
    with pytest.raises(SystemExit):
        mepic_flags.split_mepic_flags(["--model-path", "m", *flag])
    err = capsys.readouterr().err
    assert flag[0] in err and ("choose one of" in err or "whole number" in err)


def test_bad_compile_sink_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        mepic_flags.split_mepic_flags(["--model-path", "m", "--mepic-compile-sink", "eos"])
    err = capsys.readouterr().err
    assert "--mepic-compile-sink" in err and "'bos'" in err and "'none'" in err


@pytest.mark.parametrize("value", ["-1", "lots", "nan", "inf"])
def test_bad_host_tier_size_is_refused(capsys, value):
    with pytest.raises(SystemExit):
        mepic_flags.split_mepic_flags(["--mepic-host-tier-gb", value])
    assert "--mepic-host-tier-gb" in capsys.readouterr().err


def test_tier_flags_become_settings(tmp_path):
    _, env = mepic_flags.split_mepic_flags(["--mepic-host-tier-gb", "0.5", "--mepic-storage-dir",
                                            str(tmp_path / "new")])
    assert env == {"SGLANG_MEPIC_HOST_TIER_GB": "0.5", "SGLANG_MEPIC_STORAGE_DIR": str(tmp_path / "new")}
    assert (tmp_path / "new").is_dir()


def test_unwritable_storage_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match="--mepic-storage-dir .*cannot create it"):
        mepic_flags.split_mepic_flags(["--mepic-storage-dir", str(blocker / "sub")])


def test_shared_storage_flags_become_settings_and_bad_ones_are_refused(monkeypatch, tmp_path):
    for var in ("MOONCAKE_MASTER", "MOONCAKE_CLIENT", "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"):
        monkeypatch.delenv(var, raising=False)
    extra = '{"master_server_address": "127.0.0.1:50051"}'
    _, env = mepic_flags.split_mepic_flags(["--mepic-storage-backend", "mooncake", "--mepic-storage-config", extra,
                                            "--mepic-storage-timeout", "0.2"])
    assert env == {"SGLANG_MEPIC_STORAGE_BACKEND": "mooncake", "SGLANG_MEPIC_STORAGE_CONFIG": extra,
                   "SGLANG_MEPIC_STORAGE_TIMEOUT": "0.2"}
    refused = {
        "needs --mepic-storage-dir": ["--mepic-storage-backend", "file"],
        "needs the master's address": ["--mepic-storage-backend", "mooncake"],
        "is the file backend's": ["--mepic-storage-backend", "mooncake", "--mepic-storage-dir", str(tmp_path),
                                  "--mepic-storage-config", extra],
        "need --mepic-storage-backend": ["--mepic-storage-config", extra],
        "no such storage backend; choose one of file, .*mooncake": ["--mepic-storage-backend", "s3"],
        "keeps no KV bytes": ["--mepic-storage-backend", "sim"],
        "dynamic needs module_path, class_name": ["--mepic-storage-backend", "dynamic", "--mepic-storage-config",
                                                  '{"backend_name": "mine"}'],
    }
    if importlib.util.find_spec("nixl") is None:  # a backend whose library is missing
        refused["backend nixl: Failed to import"] = ["--mepic-storage-backend", "nixl"]
    for message, argv in refused.items():
        with pytest.raises(SystemExit, match=message):
            mepic_flags.split_mepic_flags(argv)
    for argv in (["--mepic-storage-config", "{not json"], ["--mepic-storage-config", "[1]"],
                 ["--mepic-storage-timeout", "0"]):
        with pytest.raises(SystemExit):
            mepic_flags.split_mepic_flags(argv)
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:50051")  # Mooncake's own convention is enough
    assert mepic_flags.split_mepic_flags(["--mepic-storage-backend", "mooncake"])[1] == {
        "SGLANG_MEPIC_STORAGE_BACKEND": "mooncake"}


def test_quiet_start_up_hides_cpu_notices_and_shortens_server_args(monkeypatch):
    import logging
    import warnings

    from sglang_mepic.launch import quiet

    monkeypatch.setattr(warnings, "filters", list(warnings.filters))
    loggers = [logging.getLogger(name) for name in ("sglang.srt.models.registry", quiet.SERVER_ARGS_LOGGER,
                                                   "sglang.srt.entrypoints.http_server")]
    for logger in loggers:
        monkeypatch.setattr(logger, "filters", [])
    quiet.install(cpu=True, argv="--model-path m --port 1")
    quiet.install(cpu=True, argv="--model-path m --port 1")  # once per logger
    registry, engine, http = loggers
    assert len(registry.filters) == len(engine.filters) == 1

    def passes(logger, msg):
        record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, msg, (), None)
        return all(f.filter(record) for f in logger.filters), record.getMessage()

    assert not passes(registry, "Ignore import error when loading sglang.srt.models.grok: no module")[0]
    assert passes(registry, "Something real went wrong")[0]  # other warnings stay
    assert not passes(http, "OpenAI Responses API (/v1/responses) disabled: no openai_harmony")[0]
    kept, text = passes(engine, "server_args={'model_path': 'm', " + "'x': 1, " * 2000 + "}")
    assert kept and text.startswith("server_args: --model-path m --port 1") and len(text) < 200
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        quiet.install(cpu=True)
        warnings.warn("Only CUDA, HIP and XPU support AWQ currently.", UserWarning)
        warnings.warn("a real warning", UserWarning)
    assert [str(w.message) for w in seen] == ["a real warning"]


def test_debug_log_level_keeps_every_line():
    quiet_start = sglang_flags.quiet_start
    assert quiet_start(["--model-path", "m"]) and quiet_start(["--log-level", "info"])
    assert not quiet_start(["--log-level", "debug"]) and not quiet_start(["--log-level=DEBUG"])


MEPIC_ENVS = ("SGLANG_MEPIC_MODE", "SGLANG_MEPIC_RECOMPUTE_BLOCKS", "SGLANG_MEPIC_COMPILE_SINK",
              "SGLANG_MEPIC_PLACEMENT", "SGLANG_MEPIC_TEXT_MARKUP", "SGLANG_MEPIC_HOST_TIER_GB",
              "SGLANG_MEPIC_STORAGE_DIR", "SGLANG_MEPIC_STORAGE_BACKEND", "SGLANG_MEPIC_STORAGE_CONFIG",
              "SGLANG_MEPIC_STORAGE_TIMEOUT", "SGLANG_MEPIC_STORAGE_SECRET", "SGLANG_MEPIC_MAX_CHUNKS",
              "SGLANG_MEPIC_AUTO_CHUNK", "SGLANG_MEPIC_SEPARATOR")


def settings_line(monkeypatch, *flags):
    """The start-up line's MEPIC part for a command line, as main() computes it."""
    for var in MEPIC_ENVS:
        monkeypatch.delenv(var, raising=False)
    argv, variables = mepic_flags.split_mepic_flags(["--model-path", "m", *flags])
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    env.reload()  # as the launcher does once the flags are variables
    return mepic_flags.mepic_settings(with_defaults(argv, cuda=False, native_bf16=True)[0])


def test_start_up_line_shows_the_effective_mepic_settings_defaults_included(monkeypatch, tmp_path):
    import logging

    from sglang_mepic.launch import quiet

    assert settings_line(monkeypatch) == (
        "--mepic-mode mepic --mepic-recompute-blocks 1 --mepic-compile-sink none --mepic-placement trailing "
        "--mepic-text-markup on --mepic-host-tier-gb 0 --mepic-max-chunks 64 --mepic-auto-chunk off "
        "--mepic-separator none --mepic-storage-backend none")
    given = settings_line(monkeypatch, "--mepic-mode", "epic-16", "--mepic-compile-sink", "bos",
                          "--mepic-placement", "leading", "--mepic-text-markup", "off",
                          "--mepic-host-tier-gb", "0.5", "--mepic-storage-dir", str(tmp_path),
                          "--mepic-max-chunks", "8", "--mepic-storage-secret", "hunter2",
                          "--mepic-auto-chunk", "tools", "--mepic-separator", " # # ")
    assert given == ("--mepic-mode epic-16 --mepic-recompute-blocks 1 --mepic-compile-sink bos "
                     "--mepic-placement leading --mepic-text-markup off --mepic-host-tier-gb 0.5 "
                     "--mepic-chunk-store pool --mepic-max-chunks 8 "
                     "--mepic-auto-chunk tools --mepic-separator ' # # ' "
                     f"--mepic-storage-backend file --mepic-storage-dir {tmp_path} --mepic-storage-timeout 0.5 "
                     "--mepic-storage-secret (set)")  # never the secret itself
    assert settings_line(monkeypatch, "--mepic-mode", "full").endswith("(full mode: chunks are computed in "
                                                                       "context, never reused)")
    assert "chunks are not reused" in settings_line(monkeypatch, "--radix-cache-backend", "sglang")

    engine = logging.getLogger(quiet.SERVER_ARGS_LOGGER)
    monkeypatch.setattr(engine, "filters", [])
    quiet.install(cpu=False, argv="--model-path m", mepic=settings_line(monkeypatch))
    record = engine.makeRecord(engine.name, logging.INFO, __file__, 1, "server_args={'x': 1}", (), None)
    assert all(f.filter(record) for f in engine.filters)
    assert record.getMessage().startswith("server_args: --model-path m; sglang-mepic: --mepic-mode mepic "
                                          "--mepic-recompute-blocks 1 --mepic-compile-sink none")


def test_help_states_the_compile_sink_default():
    text = " ".join(mepic_flags.mepic_parser().format_help().split())
    assert "or 'none' (the chunk alone). Default: none." in text


def test_storage_secret_and_max_chunks_become_settings(tmp_path, capsys):
    _, env = mepic_flags.split_mepic_flags(["--mepic-storage-dir", str(tmp_path), "--mepic-storage-secret", "k",
                                            "--mepic-max-chunks", "8"])
    assert env["SGLANG_MEPIC_STORAGE_SECRET"] == "k" and env["SGLANG_MEPIC_MAX_CHUNKS"] == "8"
    with pytest.raises(SystemExit, match="need --mepic-storage-backend"):
        mepic_flags.split_mepic_flags(["--mepic-storage-secret", "k"])  # a secret for no shared tier
    for bad in ("0", "-3", "many"):
        with pytest.raises(SystemExit):
            mepic_flags.split_mepic_flags(["--mepic-max-chunks", bad])
        assert "--mepic-max-chunks" in capsys.readouterr().err


def test_auto_chunk_and_separator_become_settings(capsys):
    _, env = mepic_flags.split_mepic_flags(["--mepic-auto-chunk", "messages", "--mepic-separator", " # # "])
    assert env["SGLANG_MEPIC_AUTO_CHUNK"] == "messages" and env["SGLANG_MEPIC_SEPARATOR"] == " # # "  # spaces kept
    for flags, named in ((["--mepic-auto-chunk", "all"], "--mepic-auto-chunk"),
                         (["--mepic-separator", ""], "visible character"),
                         (["--mepic-separator", "  "], "visible character"),
                         (["--mepic-separator", "<|chunk|>"], "holds chunk markup")):
        with pytest.raises(SystemExit):
            mepic_flags.split_mepic_flags(flags)
        assert named in capsys.readouterr().err
    text = " ".join(mepic_flags.mepic_parser().format_help().split())
    assert "--mepic-auto-chunk {off,messages,tools,known,messages+known,tools+known}" in text and "--mepic-separator STR" in text


@pytest.mark.parametrize("flags, named", [(["--enable-dp-attention"], "--enable-dp-attention"),
                                          (["--dp-size", "2", "--enable-dp-attention"], "--enable-dp-attention"),
                                          (["--pp-size", "2"], "--pp-size 2"),
                                          (["--attn-dp-size", "2"], "--attn-dp-size 2")])
def test_pipeline_ranks_and_dp_attention_are_refused_with_the_mepic_cache(flags, named):
    argv, _ = with_defaults(["--model-path", "m", *flags], cuda=True)
    with pytest.raises(SystemExit, match=f"{named}: --radix-cache-backend mepic serves tensor and data parallelism "
                                         "only"):
        checks.check_parallelism(argv)
    checks.check_parallelism(with_defaults(["--model-path", "m", "--radix-cache-backend", "sglang", *flags],
                                           cuda=True)[0])  # SGLang's own cache: SGLang's business
    checks.check_parallelism(with_defaults(["--model-path", "m", "--tp-size", "1"], cuda=True)[0])


@pytest.mark.parametrize("flags", [["--dp-size", "2"], ["--dp", "2"], ["--data-parallel-size", "2"], ["--dp=3"],
                                   ["--dp-size", "2", "--load-balance-method", "round_robin"],
                                   ["--dp-size", "2", "--load-balance-method", "total_tokens"]])
def test_dp_is_served_with_the_mepic_cache_in_every_spelling(tiny_model, launch_here, flags):
    """Each replica is a whole scheduler with its own cache; the DP controller routes by chunk affinity
    (tests/scale_out/). The launcher used to refuse it in every spelling."""
    checks.check_parallelism(with_defaults(["--model-path", tiny_model, *flags], cuda=True)[0])
    with pytest.raises(ReachedSGLang):
        launch_here("--model-path", tiny_model, "--port", "1", *flags)


@pytest.mark.parametrize("flags, named", [
    (["--dp-size", "2", "--tp-size", "2"], "--dp-size 2 with --tp-size 2: --radix-cache-backend mepic serves data "
                                           "parallelism over single-rank replicas only"),
    (["--dp", "2", "--tp", "2"], "--dp-size 2 with --tp-size 2"),
    (["--dp-size", "2", "--load-balance-method", "follow_bootstrap_room"],
     "--load-balance-method follow_bootstrap_room: SGLang's DP controller routes by the bootstrap room"),
    (["--dp-size", "2", "--mepic-host-tier-gb", "1"], "--dp-size 2: --mepic-host-tier-gb under data parallelism"),
    (["--dp-size", "2", "--mepic-storage-dir", "/tmp/mepic-dp-store"],
     "--dp-size 2: --mepic-storage-backend under data parallelism")])
def test_what_dp_does_not_serve_is_refused_in_one_line(tiny_model, launch_here, flags, named):
    assert_refused(launch_here("--model-path", tiny_model, "--port", "1", *flags), named)


def _heads_folder(tmp_path, heads, kv):
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": heads, "num_key_value_heads": kv}))
    return str(tmp_path)


@pytest.mark.parametrize("tp, heads, kv, served", [(2, 4, 2, True), (4, 8, 4, True), (2, 4, 4, True),
                                                   (4, 4, 2, False), (3, 4, 2, False), (2, 6, 3, False),
                                                   (2, 2, 1, False)])
def test_tp_is_served_where_the_heads_and_kv_heads_divide(tmp_path, tp, heads, kv, served):
    """Each rank keeps heads/tp attention heads and kv/tp KV heads of every page; where either does not
    divide, SGLang pads or replicates heads, which the mepic cache is not tested with."""
    argv, _ = with_defaults(["--model-path", _heads_folder(tmp_path, heads, kv), "--tp", str(tp)], cuda=True)
    if served:
        checks.check_parallelism(argv)
        return
    with pytest.raises(SystemExit, match=f"--tp-size {tp}: --radix-cache-backend mepic serves TP only where the "
                                         f"model's attention heads \\({heads}\\) and KV heads \\({kv}\\) both divide"):
        checks.check_parallelism(argv)


@pytest.mark.parametrize("spelling", [["--tp-size", "2"], ["--tp", "2"], ["--tensor-parallel-size", "4"]])
def test_cacheblend_is_served_under_tp(tmp_path, monkeypatch, spelling):
    """CacheBlend sums its per-token KV deviation over the ranks' heads before it selects (attention/blend.py),
    so every rank recomputes the same tokens: served under TP, where it was refused (its deviation was one
    rank's heads). tests/scale_out/e2e/test_tensor_parallel_cacheblend.py serves it."""
    from sglang_mepic import config, env

    monkeypatch.setenv(config.MODE.env, "cacheblend-0.15")
    env.reload()
    checks.check_parallelism(with_defaults(["--model-path", _heads_folder(tmp_path, 8, 4), *spelling], cuda=True)[0])


@pytest.mark.parametrize("flags", [["--tp-size", "2", "--mepic-mode", "cacheblend-0.15"],
                                   ["--tp", "2", "--mepic-mode", "cacheblend-1.0"]])
def test_cacheblend_at_tp_2_passes_the_launchers_checks(tiny_model, launch_here, flags):
    with pytest.raises(ReachedSGLang):
        launch_here("--model-path", tiny_model, "--port", "1", *flags)


def test_a_cpu_tp_server_binds_each_rank_to_its_own_cores(monkeypatch):
    """SGLang's CPU path binds each rank to a NUMA node of its own unless SGLANG_CPU_OMP_THREADS_BIND says
    otherwise, and asserts there are as many nodes as ranks: a one-node machine failed there."""
    from sglang_mepic.launch.defaults import cpu_threads_bind

    assert cpu_threads_bind(2, [0, 1]) == "0|1"
    assert cpu_threads_bind(2, [0, 1, 2, 3]) == "0-1|2-3"
    assert cpu_threads_bind(2, [0, 1, 2, 3, 4]) == "0-2|3-4"
    assert cpu_threads_bind(2, [0, 2, 4, 6]) == "0,2|4,6"
    assert cpu_threads_bind(4, [0, 1]) == "0|1|0|1"  # fewer cores than ranks: they share
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    _, env = with_defaults(["--model-path", "m", "--tp-size", "2"], cuda=False, environ={})
    assert env["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"
    _, env = with_defaults(["--model-path", "m", "--device", "cpu", "--tp", "2"], cuda=True, environ={})
    assert env["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"  # the CPU engine asked for on a CUDA machine
    for dp in (["--dp-size", "2"], ["--dp", "2"], ["--data-parallel-size=2"]):  # a DP replica is a CPU rank too
        assert with_defaults(["--model-path", "m", *dp], cuda=False, environ={})[1]["SGLANG_CPU_OMP_THREADS_BIND"] \
            == "0|1"
    for flags, cuda, environ in ((["--tp-size", "1"], False, {}), (["--tp-size", "2"], True, {}),
                                 (["--tp-size", "2"], False, {"SGLANG_CPU_OMP_THREADS_BIND": "0-1|0-1"})):
        assert "SGLANG_CPU_OMP_THREADS_BIND" not in with_defaults(["--model-path", "m", *flags], cuda=cuda,
                                                                  environ=environ)[1]


def test_each_cpu_rank_runs_as_many_threads_as_its_cores():
    """SGLang binds a rank's threads to its SGLANG_CPU_OMP_THREADS_BIND cores only with AMX or on arm64;
    elsewhere each rank ran torch's thread a core of the machine, and two ranks on 2 cores took 4-6 times as
    long. The scheduler's forward sets the count of the fewest cores a rank is given."""
    plan = defaults.CpuThreads.plan
    for bind, current, count in (("0|1", 2, 1), ("0-1|2-3", 4, 2), ("0-2|3-4", 5, 2), ("0,2|4,6", 8, 2),
                                 ("0-3|4-7", 8, 4)):
        threads = plan({"SGLANG_CPU_OMP_THREADS_BIND": bind}, current, current, 128)
        assert threads is not None and threads.every == threads.fewer == count, bind
        assert [threads.for_forward(*s) for s in ((False, 0), (True, 10**6), (False, 0))] == [count, None, None]
    for bind in ("0-1|2-3", "x|y", "0-|1"):  # as many as torch runs already (SGLang bound them), or unreadable
        assert plan({"SGLANG_CPU_OMP_THREADS_BIND": bind}, 2, 2, 128) is None
    assert plan({"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "OMP_NUM_THREADS": "2"}, 2, 2, 128) is None


@pytest.mark.parametrize("flag", ["--tp-size", "--tp"])  # `--tp`: SGLang's parser reads it as --tp-size
def test_a_tp_size_the_heads_do_not_divide_is_refused_before_anything_loads(tiny_model, flag):
    out = run_launcher("--model-path", tiny_model, flag, "4", timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert ("--tp-size 4: --radix-cache-backend mepic serves TP only where the model's attention heads (4) and KV "
            "heads (2) both divide by the TP size") in out.stderr


@pytest.mark.parametrize("spelling", [["--tp-size", "2"], ["--tp", "2"], ["--tensor-parallel-size", "2"]])
def test_tp_heads_are_checked_again_once_the_model_folder_exists(tmp_path, spelling):
    """The flag checks run before the launcher builds the default model (SmolLM2: 9 heads, 3 KV heads), so
    check_parallelism finds no config.json and lets --tp 2 by; check_model_fits, which runs once the folder
    exists, refuses it, and a config.json that does not say its heads."""
    folder = tmp_path / "model"
    argv, _ = with_defaults(["--model-path", str(folder), *spelling], cuda=True)
    checks.check_parallelism(argv)  # not built yet: nothing to read
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                    "num_attention_heads": 9, "num_key_value_heads": 3}))
    with pytest.raises(SystemExit, match=r"--tp-size 2: .* attention heads \(9\) and KV heads \(3\) both divide"):
        checks.check_model_fits(folder, argv)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(SystemExit, match="--tp-size 2: .* this one does not say them"):
        checks.check_model_fits(folder, argv)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                    "num_attention_heads": 8, "num_key_value_heads": 2}))
    checks.check_model_fits(folder, argv)
    # SGLang lays --json-model-override-args over the config: heads given there are the ones checked
    overridden, _ = with_defaults(["--model-path", str(folder), *spelling, "--json-model-override-args",
                                   json.dumps({"num_key_value_heads": 3})], cuda=True)
    with pytest.raises(SystemExit, match=r"attention heads \(8\) and KV heads \(3\)"):
        checks.check_parallelism(overridden)
    checks.check_model_fits(folder, argv)
    checks.check_model_fits(folder, with_defaults(["--model-path", str(folder), "--tp-size", "2",
                                                   "--radix-cache-backend", "sglang"], cuda=True)[0])


def test_tp_2_on_the_tiny_model_passes_the_launchers_checks(tiny_model, launch_here):
    with pytest.raises(ReachedSGLang):
        launch_here("--model-path", tiny_model, "--port", "1", "--tp-size", "2")


REFUSED = [
    (["--enable-hierarchical-cache"], "--enable-hierarchical-cache: SGLang's HiCache does not work"),
    (["--enable-hierarchical-cache"], "own host tier (--mepic-host-tier-gb GB)"),
    (["--page-size", "0"], "--page-size 0: a page holds at least 1 token"),
    (["--page-size", "-3"], "--page-size -3"),
    (["--page-size", "x"], "--page-size x: must be a whole number"),
    (["--max-total-tokens", "0"], "--max-total-tokens 0"),
    (["--context-length", "0"], "--context-length 0"),
    (["--context-length", "0k"], "--context-length 0k: a context holds at least 1 token"),
    (["--max-total-tokens", "lots"], "--max-total-tokens lots: must be a whole number of tokens (or 64k, 1Ki ...)"),
    (["--chunked-prefill-size", "0"], "--chunked-prefill-size 0"),
    (["--radix-cache-backend", "nope"], "--radix-cache-backend nope"),
    (["--tp-size", "3"], "--tp-size 3: --radix-cache-backend mepic serves TP only where the model's attention "
                         "heads (4) and KV heads (2) both divide"),
    (["--tp-size", "0"], "--tp-size 0: must be at least 1"),
    (["--dp-size", "-1"], "--dp-size -1: must be at least 1"),
    (["--port", "70000"], "--port 70000: a TCP port is 1-65535"),
    (["--port", "-5"], "--port -5: a TCP port is 1-65535"),
    (["--port", "abc"], "argument --port: invalid int value: 'abc'"),
    (["--disable-radix-cache"], "--disable-radix-cache: --mepic-mode mepic reuses chunks through the radix cache"),
    (["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype fp8_e4m3: on the CPU SGLang keeps an e4m3 KV cache only "
                                       "for its intel_amx attention backend; with --attention-backend mepic use "
                                       "--kv-cache-dtype fp8_e5m2"),
    (["--kv-cache-dtype", "mxfp8"], "--kv-cache-dtype mxfp8: --attention-backend mepic reads the KV cache as auto, "
                                    "bf16, bfloat16, fp8_e4m3, fp8_e5m2 only"),
    (["--device", "cpu", "--attention-backend", "triton"], "--attention-backend triton: needs a GPU"),
    (["--device", "cpu", "--radix-cache-backend", "sglang", "--enable-hierarchical-cache"],
     "--enable-hierarchical-cache: SGLang's HiCache registers its host pool with CUDA and needs a GPU"),
    (["--speculative-algorithm", "NGRAM"], "--speculative-algorithm NGRAM: --attention-backend mepic has no draft"),
    # SGLang's hybrid backend would send extends to one and decodes to the other (a reviewer's find, 2026-11-30).
    (["--prefill-attention-backend", "torch_native"], "--prefill-attention-backend torch_native: the mepic "
                                                      "attention backend serves both prefill and decode"),
    (["--decode-attention-backend", "torch_native"], "--decode-attention-backend torch_native: the mepic"),
    (["--attention-backend", "torch_native", "--radix-cache-backend", "sglang", "--decode-attention-backend",
      "mepic"], "--decode-attention-backend mepic: the mepic attention backend serves both"),
    (["--mepic-mode", "turbo"], "argument --mepic-mode: --mepic-mode 'turbo': choose one of"),
    (["--mepic-recompute-blocks", "0"], "argument --mepic-recompute-blocks"),
    (["--mepic-host-tier-gb", "-1"], "argument --mepic-host-tier-gb"),
    (["--mepic-max-chunks", "0"], "argument --mepic-max-chunks"),
    (["--mepic-storage-backend", "file"], "--mepic-storage-backend file needs --mepic-storage-dir"),
    (["--mepic-chunk-store", "host", "--mepic-host-tier-gb", "1"], "--mepic-chunk-store host: keeps the chunks "
                                                                   "epic-K copies in the host tier; it needs"),
    (["--mepic-mode", "epic-16", "--mepic-chunk-store", "host"], "--mepic-host-tier-gb above 0 (here epic-16 and 0 GB)"),
    (["--mepic-mode", "epic-16", "--mepic-chunk-store", "disk"], "argument --mepic-chunk-store"),
    # The check read a flag the launcher never parsed, so it always saw one worker (issue 68).
    (["--mepic-auto-chunk", "known", "--tokenizer-worker-num", "2"],
     "--tokenizer-worker-num 2: sglang-mepic reads chunk markup, auto-chunking and registered texts in"),
    (["--tokenizer-worker-num", "2"], "--tokenizer-worker-num 2: sglang-mepic reads chunk markup"),
    (["--mepic-auto-chunk", "tools+known", "--tokenizer-worker-num=3"], "--tokenizer-worker-num 3"),
    # SGLang's host pool refused it in the scheduler, with a traceback, once the model had loaded (issue 68).
    (["--mepic-host-tier-gb", "1000000"], "--mepic-host-tier-gb 1000000: the host tier needs 1000010.7 GB of free "
                                          "RAM"),
]





# Refusals of checks.py that REFUSED leaves to tests of their own (or to none, before issue 85).
REFUSED_TOO = [
    (["--device", "cuda"], "--device cuda: this machine has no CUDA device"),
    (["--disaggregation-mode", "prefill"], "--disaggregation-mode prefill: --attention-backend mepic places"),
    (["--schedule-policy", "priority"], "--schedule-policy priority: SGLang 0.5.23 lists it, but"),
    (["--enable-hicache"], "--enable-hierarchical-cache: SGLang's HiCache does not work"),  # SGLang's other name
    (["--tensor-parallel-size", "4"], "--tp-size 4: --radix-cache-backend mepic serves TP only where"),
    (["--tp-size", "2", "--json-model-override-args", "{"], "--json-model-override-args {: not JSON"),
    (["--dp-size", "2", "--tp-size", "2"], "--dp-size 2 with --tp-size 2: --radix-cache-backend mepic serves data"),
    (["--dp-size", "2", "--load-balance-method", "follow_bootstrap_room"],
     "--load-balance-method follow_bootstrap_room: SGLang's DP controller routes by the bootstrap room"),
    (["--pp-size", "2"], "--pp-size 2: --radix-cache-backend mepic serves tensor and data parallelism only"),
    (["--attn-dp-size", "2"], "--attn-dp-size 2: --radix-cache-backend mepic serves tensor and data parallelism "
                              "only"),
    (["--enable-dp-attention"], "--enable-dp-attention: --radix-cache-backend mepic serves tensor and data "
                                "parallelism only"),
    (["--attention-backend", "torch_native", "--radix-cache-backend", "mepic"], None),  # served: see below
]
# Each refusal with an SGLang flag, that flag at its shortest abbreviation: SGLang's parser reads `--tp 2` as
# `--tp-size 2`, and every one of these passed the launcher's checks (28 of 28, the battery at 1410689).
ABBREVIATED = [(abbreviated(flags), reason) for flags, reason in REFUSED + REFUSED_TOO
               if reason is not None and abbreviated(flags) != flags]


@pytest.mark.parametrize("flags, reason", REFUSED, ids=[" ".join(f) for f, _ in REFUSED])
def test_unservable_flags_are_one_line_and_status_2(tiny_model, flags, reason, launch_here):
    """Each of these ended in a traceback from a child process (or a ZeroDivisionError, or an OverflowError,
    or argparse's usage block); now the launcher refuses it before anything loads: before it reaches SGLang
    (`launch_here` fails the test with ReachedSGLang if it does). One case runs as a process
    (test_tp_size_2_is_refused_before_anything_loads)."""
    assert_refused(launch_here("--model-path", tiny_model, "--port", "1", *flags), reason)


def test_every_refusal_has_an_abbreviated_case():
    """Each check of checks.py that reads an SGLang flag is in REFUSED or REFUSED_TOO, so ABBREVIATED covers it."""
    import inspect

    named = {line.split("raise LaunchError(f\"", 1)[-1].split("raise LaunchError(\"", 1)[-1].split()[0].rstrip(":")
             for line in inspect.getsource(checks).splitlines() if "raise LaunchError(" in line}
    named = {n for n in named if n.startswith("--") and not n.startswith("--mepic")}
    covered = {token.partition("=")[0] for flags, _ in REFUSED + REFUSED_TOO for token in flags}
    covered |= {"--tp-size", "--attention-backend", "{flag}"}  # the ranks' message, the split backends' names
    assert named - covered == set(), "a refusal with no case in REFUSED or REFUSED_TOO"
    assert len(ABBREVIATED) >= 28


@pytest.mark.parametrize("flags, reason", ABBREVIATED, ids=[" ".join(f) for f, _ in ABBREVIATED])
def test_abbreviated_flags_get_the_same_one_line_refusal(tiny_model, flags, reason, launch_here):
    """The refusal of the full flag, word for word, for its shortest abbreviation (tests/support/abbreviations)."""
    import torch

    if "--dev" in flags and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_refused(launch_here("--model-path", tiny_model, "--port", "1", *flags), reason)


def test_a_new_refusal_covers_its_abbreviations_with_no_code_of_its_own(tiny_model, launch_here, monkeypatch):
    """A check planted in check_combinations, reading a flag by its full name as every check does: the
    abbreviated flag meets it, because the launcher reads the command line once, as SGLang does."""
    planted = checks.check_combinations

    def with_a_new_check(argv, cuda=None):
        if sglang_flags.known_flags(argv).dtype == "float16":
            raise sglang_flags.LaunchError("--dtype float16: planted refusal")
        planted(argv, cuda)

    monkeypatch.setattr(checks, "check_combinations", with_a_new_check)
    short = abbreviated(["--dtype"])[0]
    assert short != "--dtype"
    for flags in (["--dtype", "float16"], [short, "float16"], [f"{short}=float16"]):
        assert_refused(launch_here("--model-path", tiny_model, "--port", "1", *flags), "--dtype float16: planted")


def test_a_lone_double_dash_is_one_line(tiny_model, launch_here):
    """What follows `--` is a value to argparse: the checks saw no --model-path there, and the launcher
    ended in a TypeError traceback (a reviewer's find)."""
    for args in (["--"], ["--port", "1", "--", "--model-path", tiny_model]):
        assert_refused(launch_here(*args), "--: SGLang's server takes no positional arguments")


def test_no_cuda_device_is_refused(tiny_model, launch_here):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_refused(launch_here("--model-path", tiny_model, "--device", "cuda"),
                   "--device cuda: this machine has no CUDA device")


def _model_like(tiny_model, tmp_path, **changes):
    import json
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("changes, reason", [
    ({"architectures": ["GPT2LMHeadModel"]}, "supports LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                                             "Qwen3ForCausalLM (RoPE models); this model is GPT2LMHeadModel"),
    ({"architectures": None}, "this model is of no stated architecture"),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, "does not support sliding-window attention"),
], ids=["no-rope-architecture", "no-architecture", "sliding-window"])
def test_a_model_the_mepic_backend_cannot_serve_is_refused_before_it_loads(tiny_model, tmp_path, changes, reason,
                                                                          launch_here):
    """The mepic attention backend refused these only once the model had loaded, in the scheduler process."""
    assert_refused(launch_here("--model-path", _model_like(tiny_model, tmp_path, **changes), "--port", "1"), reason)


def test_model_checks_follow_the_attention_backend(tiny_model, tmp_path):
    qwen2 = _model_like(tiny_model, tmp_path, architectures=["Qwen2ForCausalLM"], sliding_window=4096,
                        use_sliding_window=False)  # as Qwen2 models ship: the window is off
    checks.check_model_path(qwen2, with_defaults(["--model-path", qwen2], cuda=False)[0])
    (tmp_path / "model" / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    checks.check_model_path(qwen2, ["--attention-backend", "torch_native"])  # not ours to judge
    (tmp_path / "model" / "config.json").write_text("{not json")
    with pytest.raises(SystemExit, match="config.json: cannot be read as JSON"):
        checks.check_model_path(qwen2, ["--attention-backend", "torch_native"])


def test_the_launcher_knows_the_backends_architectures():
    from sglang_mepic.attention import backend

    assert checks.MEPIC_ARCHITECTURES == backend.SUPPORTED_ARCHITECTURES


def check(*flags, cuda=False):
    env.reload()  # the environment as the test left it, as the launcher reads it once the flags are variables
    checks.check_combinations(with_defaults(["--model-path", "m", *flags], cuda=cuda)[0], cuda=cuda)


def test_what_the_combination_checks_let_through(monkeypatch):
    monkeypatch.delenv("SGLANG_MEPIC_MODE", raising=False)
    check()
    check("--page-size", "4")
    check("--kv-cache-dtype", "bf16")
    check("--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "torch_native", "--radix-cache-backend", "sglang")
    check("--kv-cache-dtype", "fp8_e5m2")  # the mepic backend reads fp8 (issue 73)
    check("--kv-cache-dtype", "fp8_e4m3", cuda=True)  # on the CPU SGLang keeps e4m3 for intel_amx only
    check("--disable-radix-cache", "--radix-cache-backend", "sglang")
    check("--enable-hierarchical-cache", "--attention-backend", "triton", "--radix-cache-backend", "sglang",
          cuda=True)
    check("--attention-backend", "triton", cuda=True)  # a GPU: SGLang's own backends are fine
    check("--device", "cuda", cuda=True)
    check("--chunked-prefill-size", "-1")
    check("--max-total-tokens", "64k", "--context-length", "4Ki")  # SGLang's human_readable_int (a reviewer's find)
    check("--context-length", "25.6k")
    check("--prefill-attention-backend", "mepic", "--decode-attention-backend", "mepic")  # the same backend
    check("--prefill-attention-backend", "triton", "--attention-backend", "torch_native", "--radix-cache-backend",
          "sglang", cuda=True)  # SGLang's own backends, split: SGLang's business
    monkeypatch.setenv("SGLANG_MEPIC_MODE", "full")  # --mepic-mode full: no reuse, so no radix cache needed
    check("--disable-radix-cache")
    check("--speculative-algorithm", "NGRAM", "--attention-backend", "triton", "--radix-cache-backend", "sglang",
          cuda=True)  # SGLang's own backends: SGLang's business
    for flags in (["--port", "0"], ["--pp-size", "0"],
                  ["--attention-backend", "flashinfer"], ["--speculative-algorithm", "EAGLE"]):
        with pytest.raises(SystemExit):
            check(*flags)


@pytest.mark.parametrize("auto_chunk", ["off", "messages", "messages+known"])
@pytest.mark.parametrize("cache", [[], ["--attention-backend", "torch_native", "--radix-cache-backend", "sglang"]])
def test_several_tokenizer_workers_are_refused_in_every_mode(monkeypatch, auto_chunk, cache):
    """SGLang's extra tokenizer workers never load the plugin's tokenizer hooks: with two, `<|chunk|>` markers
    reached the model as text and meta_info had no mepic_* fields (the battery at 1410689); the launcher
    refused them only with registered texts (issue 68)."""
    from sglang_mepic import config

    monkeypatch.setenv(config.AUTO_CHUNK.env, auto_chunk)
    for flags in (["--tokenizer-worker-num", "2"], ["--tokenizer-worker-num=4"], ["--tokenizer-w", "3"]):
        with pytest.raises(SystemExit, match="--tokenizer-worker-num [234]: sglang-mepic reads chunk markup"):
            check(*cache, *flags)
    check(*cache, "--tokenizer-worker-num", "1")


def test_a_host_tier_the_free_ram_cannot_hold_is_refused_before_anything_loads(monkeypatch):
    """SGLang's host pool, which the host tier is, keeps a reserve of RAM free (10 GiB) and refused the tier
    in the scheduler process with a traceback when less than tier + reserve was free (`make serve ARGS=
    "--mepic-host-tier-gb 1"` on a machine with under 11 GB free). The free figure is mocked here, so the
    test does not depend on this machine's RAM."""
    from sglang_mepic import config

    monkeypatch.setenv(config.HOST_TIER_GB.env, "1")
    monkeypatch.setattr(checks, "free_host_memory", lambda: 8_000_000_000)
    with pytest.raises(SystemExit, match=r"--mepic-host-tier-gb 1: the host tier needs 11\.7 GB of free RAM \(1 GB "
                                         r"for the tier and the 10 GiB SGLang's host pool leaves free\); 8\.0 GB is "
                                         r"available"):
        check()
    check("--radix-cache-backend", "sglang")  # SGLang's own cache: no host tier is made
    monkeypatch.setattr(checks, "free_host_memory", lambda: 12_000_000_000)
    check()
    monkeypatch.setenv(config.HOST_TIER_GB.env, "0")
    monkeypatch.setattr(checks, "free_host_memory", lambda: 0)
    check()  # no tier, no reserve


def test_the_launcher_knows_sglangs_host_memory_reserve_and_free_figure():
    import psutil
    from sglang.srt.mem_cache.pool_host import base

    assert checks.HOST_POOL_RESERVE_BYTES == base.HICACHE_HOST_MEMORY_RESERVE_BYTES
    assert 0 < checks.free_host_memory() <= psutil.virtual_memory().total


def test_bad_flag_values_of_ours_are_one_line(capsys):
    """argparse's own refusals (a bad --mepic-* value, a --port that is no number) without its usage block."""
    for flags in (["--mepic-mode", "turbo"], ["--port", "abc"]):
        with pytest.raises(SystemExit) as e:
            mepic_flags.split_mepic_flags(flags) if flags[0].startswith("--mepic") else \
                sglang_flags.known_flags(flags)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("sglang_mepic.launch_server: error: argument " + flags[0])


def test_a_checkout_on_pythonpath_brings_its_hooks_and_kernels_with_it(tmp_path):
    """The hooks and kernels live inside the package (issue 72): a checkout on PYTHONPATH (a git worktree)
    gives all of its code, where the editable install once mapped the hooks to its own checkout and a capacity
    run served for an hour without MEPIC's hooks."""
    import os
    import shutil
    from pathlib import Path

    import sglang_mepic

    other = tmp_path / "worktree"
    shutil.copytree(Path(sglang_mepic.__file__).parent, other / "sglang_mepic",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-c", "import sglang_mepic, sglang_mepic.patches, sglang_mepic.kernels, "
                          "sglang_mepic.plugin as p; print(sglang_mepic.__file__, sglang_mepic.patches.__file__, "
                          "sglang_mepic.kernels.__file__, p.__file__)"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(other)})
    assert out.returncode == 0, out.stderr[-2000:]
    files = out.stdout.split()
    assert len(files) == 4 and all(Path(f).is_relative_to(other) for f in files), files


def test_flags_from_an_sglang_config_file_meet_the_same_checks(tiny_model, tmp_path, launch_here):
    """SGLang's `--config file.yaml` is one more spelling of its flags (its keys may be abbreviations too):
    the launcher merges it as SGLang does before any check or default reads argv."""
    config = tmp_path / "server.yaml"
    config.write_text("tp: 4\n")
    assert_refused(launch_here("--model-path", tiny_model, "--port", "1", "--conf", str(config)),
                   "--tp-size 4: --radix-cache-backend mepic serves TP only where")
    config.write_text("attention-back: torch_native\nradix-cache-backend: sglang\n")
    with pytest.raises(ReachedSGLang) as reached:
        launch_here("--model-path", tiny_model, "--port", "1", "--config", str(config))
    argv = str(reached.value).split()
    assert "--config" not in argv and argv.count("--attention-backend") == 1, argv
    assert flag_value(argv, "--attention-backend") == "torch_native" and "mepic" not in argv
    config.write_text(f"config: {tmp_path / 'inner.yaml'}\n")  # a file naming another (a reviewer's find)
    (tmp_path / "inner.yaml").write_text("tokenizer-worker-num: 3\nattention-backend: torch_native\n")
    assert_refused(launch_here("--model-path", tiny_model, "--port", "1", "--config", str(config)),
                   "--tokenizer-worker-num 3")
    config.write_text(f"config: {config}\n")  # naming itself
    assert_refused(launch_here("--model-path", tiny_model, "--config", str(config)), "more than 8 config files")
    (tmp_path / "server.txt").write_text("tp: 2\n")
    assert_refused(launch_here("--model-path", tiny_model, "--config", str(tmp_path / "server.txt")),
                   "--config: Config file must be YAML format")
