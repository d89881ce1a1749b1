"""A request's output does not depend on how SGLang schedules it: the scheduling-flag matrix. The unit half: the whole description, and the tests on a server, are in
e2e/test_scheduling_flags_server.py."""


import pytest


def test_priority_scheduling_gets_a_neutral_default_priority():
    """Without --default-priority-value SGLang gives a request sent without a priority None, and the
    first preemption sorts the running batch by it: a TypeError that ended the scheduler."""
    from sglang_mepic.launch.defaults import with_defaults

    argv, _ = with_defaults(["--model-path", "m", "--enable-priority-scheduling"], cuda=False)
    assert argv[argv.index("--default-priority-value") + 1] == "0"
    argv, _ = with_defaults(["--model-path", "m", "--enable-priority-scheduling", "--default-priority-value", "5"],
                            cuda=False)
    assert argv.count("--default-priority-value") == 1
    assert "--default-priority-value" not in with_defaults(["--model-path", "m"], cuda=False)[0]


def test_refused_scheduling_flags():
    """A scheduling flag the server cannot start with is refused in one line before any process starts."""
    from sglang_mepic.launch.checks import check_combinations
    from sglang_mepic.launch.defaults import with_defaults
    from sglang_mepic.launch.sglang_flags import LaunchError

    argv, _ = with_defaults(["--model-path", "m", "--schedule-policy", "priority"], cuda=False)
    with pytest.raises(LaunchError, match="--schedule-policy priority: .*--enable-priority-scheduling"):
        check_combinations(argv, cuda=False)


def test_compile_rows_rank_as_their_reader(tiny_model):
    """Priority preemption sorts the running batch, compile rows included, by priority: a row is
    made with its reader's priority and routing key."""
    from types import SimpleNamespace

    from sglang_mepic.cache.prefill_round import compile_req

    scheduler = SimpleNamespace(model_config=SimpleNamespace(hf_eos_token_id=[2], vocab_size=4096),
                                dllm_config=None, init_req_max_new_tokens=lambda req: None)
    parent = SimpleNamespace(extra_key="ns", cache_salt=None, lora_id=None, priority=100, routing_key="tenant-1")
    row = compile_req(scheduler, "mepic-compile-x", [5, 6, 7], parent)
    assert (row.priority, row.routing_key, row.extra_key) == (100, "tenant-1", "ns")


def test_disaggregation_is_refused_with_mepic_attention():
    """A PD decode server builds its batches without SGLang's extend (no placement would reach the
    position map): refused in one line."""
    from sglang_mepic.launch.checks import check_combinations
    from sglang_mepic.launch.defaults import with_defaults
    from sglang_mepic.launch.sglang_flags import LaunchError

    for mode in ("prefill", "decode"):
        argv, _ = with_defaults(["--model-path", "m", "--disaggregation-mode", mode], cuda=False)
        with pytest.raises(LaunchError, match=f"--disaggregation-mode {mode}: --attention-backend mepic"):
            check_combinations(argv, cuda=False)
    argv, _ = with_defaults(["--model-path", "m", "--disaggregation-mode", "null"], cuda=False)
    check_combinations(argv, cuda=False)


def test_beam_search_is_refused_under_mepic_attention():
    """Beam search's member rows get no position-map row (review, 2026-11-29: a member row kept the
    plan of the request that used it before, masking the new prompt's first tokens)."""
    from types import SimpleNamespace

    from sglang_mepic.frontend.limits import LimitError, check

    def manager(backend):
        return SimpleNamespace(server_args=SimpleNamespace(attention_backend=backend, allow_auto_truncate=True),
                               model_config=SimpleNamespace(vocab_size=4096), mm_processor=None, context_len=4096)

    beam = SimpleNamespace(sampling_params={"beam_width": 4, "max_new_tokens": 8})
    with pytest.raises(LimitError, match="beam_width 4: beam search is not supported by --attention-backend mepic"):
        check(manager("mepic"), beam, [1, 2, 3])
    check(manager("triton"), beam, [1, 2, 3])  # SGLang's own backends keep it
    check(manager("mepic"), SimpleNamespace(sampling_params={"beam_width": 1}), [1, 2, 3])


def test_decode_positions_take_no_host_branch():
    """on_decode may be captured into a graph (SGLANG_ENABLE_METADATA_GLUE_GRAPH) and replayed later:
    a row planned after the capture must still decode at its plan's position. torch.fx records the
    call as a graph does: Python branches are taken once, at trace time, with no row planned."""
    import torch
    import torch.fx

    from sglang_mepic.pages.positions import PositionMap

    pm = PositionMap(torch.zeros(4, 16, dtype=torch.int32))
    captured = torch.fx.symbolic_trace(lambda rows, seq_lens, positions: pm.on_decode(rows, seq_lens, positions))
    pm.assign(1, torch.tensor([0, 1, -1, -1, 2, 3, 4]))
    assert captured(torch.tensor([1]), torch.tensor([8]), torch.tensor([7])).tolist() == [5]
