"""The launcher started as a server is (forked from the fork server where the session has one), run to
its exit: its help, and its one-line refusals of what SGLang's own parser and checks refuse. The launcher's
own refusals run its `main` in the test process (tests/launch/test_launch.py)."""

from support.launcher import assert_refused, launch_to_exit


def test_help_shows_sglang_flags(tiny_model):
    out = launch_to_exit(tiny_model, "--help")
    assert out.returncode == 0, out.stderr
    for flag in ("--model-path", "--attention-backend", "--radix-cache-backend", "--max-total-tokens",
                 "--mepic-placement"):
        assert flag in out.stdout


def test_a_flag_sglang_refuses_is_one_line_and_status_2(tiny_model):
    """SGLang's own argument checks (here: the chunked prefill size must be a multiple of the page)."""
    out = launch_to_exit(tiny_model, "--page-size", "7")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "sglang_mepic.launch_server: error: chunked_prefill_size must be divisible by page_size" in out.stderr
    assert "Load weight" not in out.stderr  # refused before any process started


def test_a_combination_sglang_refuses_when_it_resolves_its_flags_is_one_line(tiny_model):
    """SGLang checks some combinations only in `run_server` (ServerArgs.resolve_once), before any process."""
    out = launch_to_exit(tiny_model, "--speculative-algorithm", "NGRAM", "--attention-backend", "torch_native",
                         "--radix-cache-backend", "sglang", "--page-size", "16")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "Load weight" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert errors == ["sglang_mepic.launch_server: error: speculative_eagle_topk(10) > 1 with page_size(16) > 1 is "
                      "unstable and produces incorrect results for paged attention backends. This combination is "
                      "only supported for the 'flashinfer' backend."], out.stderr[-2000:]


def test_a_flag_sglang_does_not_know_is_one_line_not_its_usage(tiny_model):
    """SGLang's parser prints its whole usage block (hundreds of lines) for an unknown flag."""
    out = launch_to_exit(tiny_model, "--no-such-flag")
    assert_refused(out, "unrecognized arguments: --no-such-flag")
