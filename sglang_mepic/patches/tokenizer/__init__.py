"""Hooks in the tokenizer process (HTTP server and tokenizer manager): chunk markup before SGLang tokenizes,
the bounds and the sealed hint at its validation, the figures in responses, the request log."""

MODULES = (
    "tokenizer_manager_tokenize_one_request",
    "tokenizer_manager_should_use_batch_tokenization",
    "tokenizer_manager_validate_one_request",
    "request_logger_compute_metadata",
    "request_logger_log_received_request",
    "generate_req_input_getitem",
    "serving_chat_process_messages",
    "serving_chat_build_chat_response",
    "serving_completions_build_completion_response",
    "serving_completions_get_echo_text",
    "ollama_serving_handle_generate",
    "ollama_serving_handle_chat",
    "tokenizer_manager_stream_one_response",
)
