"""Hooks that guard SGLang 0.5.23 against its own mishandling (sglang_mepic.hardening has the guards and the
table of what each covers): what SGLang should fix upstream, in the process where SGLang goes wrong
(tokenizer: request shapes, unserved routes, admin and detokenize bodies, failed control replies;
scheduler: a forward that raises, a profile step that raises, a control handler that raises, a missing dual-GEMM package)."""

MODULES = (
    "generate_req_input_normalize_batch_and_arguments",
    "embedding_req_input_normalize_batch_and_arguments",
    "http_server_setup_and_run_http_server",
    "serving_detokenize_handle_non_streaming_request",
    "tokenizer_manager_update_weights_from_disk",
    "tokenizer_control_mixin_execute_profile",
    "fan_out_communicator_call",
    "type_based_dispatcher_call",
    "scheduler_run_batch",
    "profiler_manager_profile_batch_predicate",
    "dual_gemm_select_mode",
)
