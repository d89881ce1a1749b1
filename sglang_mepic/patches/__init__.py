"""HookRegistry hooks on SGLang internals.

One module per upstream function. Each module names the function it hooks
(`TARGET`), how (`HOOK_TYPE`), the hook itself (`hook`), and the SGLang release
it was written against (`WRITTEN_FOR`); `register_all` refuses to hook any other
release, because the upstream function may have changed under it.
"""

import importlib

from sglang.srt.plugins.hook_registry import HookRegistry

MODULES = (
    "tokenizer_manager_tokenize_one_request",
    "tokenizer_manager_should_use_batch_tokenization",
    "tokenizer_manager_validate_one_request",
    "request_logger_compute_metadata",
    "request_logger_log_received_request",
    "generate_req_input_getitem",
    "generate_req_input_normalize_batch_and_arguments",
    "embedding_req_input_normalize_batch_and_arguments",
    "http_server_setup_and_run_http_server",
    "serving_chat_process_messages",
    "serving_chat_build_chat_response",
    "serving_completions_build_completion_response",
    "serving_completions_get_echo_text",
    "serving_detokenize_handle_non_streaming_request",
    "ollama_serving_handle_generate",
    "ollama_serving_handle_chat",
    "rotary_embedding_forward",
    "paged_allocator_free",
    "paged_allocator_free_page_ids",
    "schedule_batch_prepare_for_extend",
    "output_streamer_accept",
    "output_streamer_is_request_level_customized_info_key",
    "tokenizer_manager_stream_one_response",
    "schedule_batch_prepare_for_decode",
    "scheduler_get_internal_state",
    "scheduler_on_idle",
    "scheduler_get_new_batch_prefill",
    "schedule_policy_add_one_req",
    "scheduler_handle_generate_request",
    "scheduler_run_batch",
    "schedule_policy_compute_prefix_matches",
    "logprob_result_processor_add_input_logprob_return_values",
    "type_based_dispatcher_call",
    "fan_out_communicator_call",
    "tokenizer_control_mixin_execute_profile",
    "dual_gemm_select_mode",
    "engine_set_envs_and_config",
    "kv_cache_dtype_configure_kv_cache_dtype",
)


def register_all(sglang_version: str) -> None:
    for name in MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        if module.WRITTEN_FOR != sglang_version:
            raise RuntimeError(f"patch {name} was written for sglang {module.WRITTEN_FOR}, "
                               f"not {sglang_version}; it must be re-checked against the new code")
        HookRegistry.register(module.TARGET, module.hook, module.HOOK_TYPE)
