"""Hooks in the scheduler process: NoPE keys and the fp8 pool on the CPU (model runner), page frees, the
prefill round, batch join and extend of the mepic cache, the figures sent with each output."""

MODULES = (
    "rotary_embedding_forward",
    "kv_cache_dtype_configure_kv_cache_dtype",
    "paged_allocator_free",
    "paged_allocator_free_page_ids",
    "schedule_batch_prepare_for_extend",
    "output_streamer_accept",
    "output_streamer_is_request_level_customized_info_key",
    "schedule_batch_prepare_for_decode",
    "scheduler_get_internal_state",
    "scheduler_on_idle",
    "scheduler_get_new_batch_prefill",
    "schedule_policy_add_one_req",
    "scheduler_handle_generate_request",
    "schedule_policy_compute_prefix_matches",
    "logprob_result_processor_add_input_logprob_return_values",
    "model_runner_forward",
)
