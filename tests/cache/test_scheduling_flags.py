"""A request's output does not depend on how SGLang schedules it: the scheduling-flag matrix.

Under each set of SGLang flags that changes how a request's tokens reach the forward, the same
chunked and plain requests are sent one at a time on an empty cache, then together, arriving a
little apart so that new prefills meet decoding requests (mixed batches, preemption, chunked
prefill splitting a chunk). Greedy tokens in float32 must be the same both times.

Every flag of the matrix appears in at least one server; flags that do not interfere share one,
because each server costs a start (about a minute on 2 cores). A flag the project cannot serve is
refused at launch, and `test_refused_scheduling_flags` checks the refusal instead.

| server | flags | what it exercises |
|---|---|---|
| mixed | --enable-mixed-chunk, lpm | decode tokens riding in prefill batches (issue 68); a cache-aware policy |
| split | --enable-mixed-chunk, --chunked-prefill-size 32, lof, 2 continuous decode steps | chunks split across prefill passes, mixed |
| one-at-a-time | --page-size 32, --max-running-requests 1, dfs-weight, --max-prefill-tokens 256 | larger pages, strictly serial running |
| wide-pages | --page-size 64, random, --disable-overlap-schedule, --schedule-conservativeness 0.3 | larger pages, no overlap, eager admission |
| preempt | --enable-priority-scheduling, --max-running-requests 2, fcfs, SGLANG_TEST_RETRACT=1 | priority preemption (compile rows ranked as their readers) and forced retraction |
| interval | hrrn, --prefill-decode-interval 2 | decode rounds forced between prefills |
| shortest | shortest-prefill-first, --max-running-requests 3, --max-queued-requests 64 | a cache-aware sort by prefill length |
| keyed | routing-key, --stream-interval 4 | the routing-key sort (requests carry keys) |

Every `--schedule-policy` SGLang offers but `priority` (an alias SGLang maps onto
--enable-priority-scheduling's sort, run by `preempt`) is one server's.
"""


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

    from sglang_mepic.frontend.request_limits import LimitError, check

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

    from sglang_mepic.attention.positions import PositionMap

    pm = PositionMap(torch.zeros(4, 16, dtype=torch.int32))
    captured = torch.fx.symbolic_trace(lambda rows, seq_lens, positions: pm.on_decode(rows, seq_lens, positions))
    pm.assign(1, torch.tensor([0, 1, -1, -1, 2, 3, 4]))
    assert captured(torch.tensor([1]), torch.tensor([8]), torch.tensor([7])).tolist() == [5]
