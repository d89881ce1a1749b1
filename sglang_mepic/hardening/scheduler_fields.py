"""Fields of a generate request that SGLang's scheduler trusts without checking them.

SGLang 0.5.23 passes these on from the tokenizer unchecked, and the scheduler uses them as tensor sizes,
tensor values, slice bounds or text: a wrong one raised there, outside any request's error handling, and
the scheduler process exited with every request it held (the request fuzzer,
tests/hardening/e2e/test_request_fuzz.py, found each). Here each is a 400 for its own request, checked in
the tokenizer process once a request is one prompt (`TokenizerManager._validate_one_request`, whose hook,
`sglang_mepic/patches/tokenizer/tokenizer_manager_validate_one_request.py`, also runs MEPIC's own limits).
`/v1/detokenize`'s token ids are checked here too (`check_token_ids`). One field is bounded rather than
refused: a `logit_bias` value is clamped into [-100, 100] (`_bound_logit_bias`), so that it cannot beat a grammar.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

# Fields only a model with a multimodal processor reads (`positional_embed_overrides: [1]` on the tiny
# model took the scheduler down; request fuzzer).
MEDIA_FIELDS = ("image_data", "video_data", "audio_data", "positional_embed_overrides")


class FieldError(ValueError):
    """A field the scheduler would fail on (SGLang's HTTP layer answers a ValueError with 400)."""


def check(manager: TokenizerManager, obj: GenerateReqInput | EmbeddingReqInput) -> None:
    """Refuse one prompt's request whose fields the scheduler would fail on."""
    vocab_size = manager.model_config.vocab_size
    _check_media(manager, obj)
    _check_keys(obj)
    _check_top_logprobs(obj, vocab_size)
    _check_logprob_start(obj)
    params = getattr(obj, "sampling_params", None)
    _check_sampling_numbers(params)
    _bound_logit_bias(params)
    _check_stop_regex(params)
    _check_stop_token_ids(params, vocab_size)


def _whole(value: object) -> TypeGuard[int]:
    """An integer from JSON: bool is an int subclass in Python, but `true` is no count or token id."""
    return isinstance(value, int) and not isinstance(value, bool)


def _given(field: str, value: object) -> bool:
    if field == "positional_embed_overrides":  # SGLang passes even "" on to the scheduler (which died on it)
        return value is not None
    return value is not None and value != "" and value != []


# Fields the scheduler joins as text into a request's cache key (Req appends lora_id to extra_key):
# `"lora_id": ["x"]` on one prompt raised a TypeError there and the server exited (request fuzzer,
# 2026-11-28). A list is a batch's, split one per prompt before this check.
KEY_FIELDS = ("lora_id", "extra_key", "cache_salt")


def _check_keys(obj: object) -> None:
    for name in KEY_FIELDS:
        value = getattr(obj, name, None)
        if value is not None and not isinstance(value, str):
            raise FieldError(f"{name} must be a string for one prompt (a list only in a batch, one string a "
                             f"prompt), got {type(value).__name__}")


def _check_media(manager: TokenizerManager, obj: object) -> None:
    if getattr(manager, "mm_processor", None) is not None:
        return
    given = [f for f in MEDIA_FIELDS if _given(f, getattr(obj, f, None))]
    if given:
        raise FieldError(f"this model takes text only: {', '.join(given)} cannot be used with it")


def _check_top_logprobs(obj: object, vocab_size: int) -> None:
    num = getattr(obj, "top_logprobs_num", None)
    if num is None:
        return
    if not _whole(num):
        raise FieldError(f"top_logprobs_num must be an integer, got {type(num).__name__}")
    if not 0 <= num <= vocab_size:
        raise FieldError(f"top_logprobs_num must be in [0, {vocab_size}] (the vocabulary size), got {num}")


INT64 = 2**63
INT32 = 2**31
# Held in int32 tensors (sampling_batch_info.top_ks, the min-new-tokens penalizer): `top_k: 2**32` overflowed there.
INT32_PARAMS = ("top_k", "min_new_tokens")
# SamplingParams fields the scheduler uses as counts, indices or seeds (sampling_params.py).
WHOLE_NUMBER_PARAMS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "beam_width", "stream_interval",
                       "sampling_seed")


def _check_sampling_numbers(params: object) -> None:
    """Sampling parameters become int64 and float32 tensors when the scheduler batches the request: an
    integer beyond 64 bits raised there (`top_k: 2**63`), outside any request's error handling."""
    if not isinstance(params, dict):
        return
    for key in WHOLE_NUMBER_PARAMS:
        value = params.get(key)
        if value is not None and not _whole(value):
            # a float `max_new_tokens` (Ollama's `num_predict: 1.5`) became a slice bound when the request
            # finished, in the scheduler, and the server exited
            raise FieldError(f"sampling parameter {key!r} must be a whole number, got {value!r}")
    for key in INT32_PARAMS:
        value = params.get(key)
        if isinstance(value, int) and not -INT32 <= value < INT32:
            raise FieldError(f"sampling parameter {key!r} must fit in 32 bits, got {value}")
    for key, value in params.items():
        for number in (value if isinstance(value, list) else [value]):
            if _whole(number) and not -INT64 <= number < INT64:
                raise FieldError(f"sampling parameter {key!r} must fit in 64 bits, got {number}")


def _check_stop_token_ids(params: object, vocab_size: int) -> None:
    """Stop ids index the logits (the min-new-tokens penalizer masks them): `stop_token_ids: [-1]` with
    `min_new_tokens` raised in the scheduler and the server exited."""
    ids = params.get("stop_token_ids") if isinstance(params, dict) else None
    if ids is None:
        return
    if not isinstance(ids, (list, tuple, set)):  # the server's own chat templates may add a set
        raise FieldError(f"stop_token_ids must be a list of token ids, not {type(ids).__name__}")
    for token in ids:
        if not _whole(token) or not 0 <= token < vocab_size:
            raise FieldError(f"stop_token_ids must hold token ids from 0 to {vocab_size - 1} (the vocabulary), "
                             f"found {token!r}")


# OpenAI documents logit_bias values in [-100, 100]; vLLM clamps them into it too.
LOGIT_BIAS_BOUND = 100


def _bound_logit_bias(params: object) -> None:
    """SGLang adds a request's logit_bias to the logits after the grammar's mask
    (`SamplingBatchInfo.apply_logits_bias`), as a float32 row: a bias beyond float32 (1e308, or "inf" read as a
    float by the OpenAI models) is inf there, and the mask's -inf plus inf is NaN. Greedy decoding's argmax takes
    a NaN for the largest logit, and sampling's softmax of a row with a NaN or an inf is all NaN (token 0, or
    torch.multinomial raising): a token the grammar forbids reached its accept_token, a 500 "Grammar accept_token
    failed" (regex, json_schema, ebnf; every route), and without a grammar the answer was token 0 or a 500.

    Each value is clamped into [-100, 100] in the request's sampling parameters, before SGLang builds its
    SamplingParams: the mask's -inf plus a finite bias stays -inf, so the grammar wins, and 100 still forces (or
    bans) a token against the logits models give, so a client's 1e308 (or -1e9 to ban a token) gets what it meant. A NaN means nothing a
    sampler can honour, and a value that is no number is no bias: a 400. The keys are SGLang's to check
    (`SamplingParams.verify`: whole numbers in the vocabulary)."""
    if not isinstance(params, dict) or params.get("logit_bias") is None:
        return
    bias = params["logit_bias"]
    if not isinstance(bias, dict):
        raise FieldError(f"logit_bias must map token ids to numbers, not {type(bias).__name__}")
    bounded: dict[object, int | float] = {}
    for token, value in bias.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FieldError(f"logit_bias must map token ids to numbers from -{LOGIT_BIAS_BOUND} to "
                             f"{LOGIT_BIAS_BOUND}, found {value!r} for token {token!r}")
        if isinstance(value, float) and math.isnan(value):
            raise FieldError(f"logit_bias for token {token!r} is NaN: a bias is a number from -{LOGIT_BIAS_BOUND} "
                             f"to {LOGIT_BIAS_BOUND}")
        bounded[token] = max(-LOGIT_BIAS_BOUND, min(LOGIT_BIAS_BOUND, value))
    if bounded != bias:
        params["logit_bias"] = bounded  # a new dict: the client's own (a batch may share it) stays as sent


STOP_REGEX_BYTES = 256  # sampling_params.MAX_STOP_REGEX_LEN


def _check_stop_regex(params: object) -> None:
    """SGLang parses each `stop_regex` with sre_parse, whose re.error is no ValueError: a streamed request
    with `"stop_regex": "["` was cut off mid-answer, a plain one a 500."""
    patterns = params.get("stop_regex") if isinstance(params, dict) else None
    if patterns is None:
        return
    patterns = [patterns] if isinstance(patterns, str) else patterns
    if not isinstance(patterns, list):
        raise FieldError(f"stop_regex must be a string or a list of strings, not {type(patterns).__name__}")
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise FieldError(f"stop_regex must be a string or a list of strings, found {type(pattern).__name__}")
        if len(pattern.encode()) > STOP_REGEX_BYTES:
            continue  # SGLang refuses it by its length (a ValueError, a 400) before parsing it
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as e:
            raise FieldError(f"stop_regex {pattern[:80]!r} is not a regular expression: {e}") from None


TOKENIZER_IDS = 2**32  # HF tokenizers decode u32 ids; a larger one raised OverflowError (a 500)


def check_token_ids(tokens: object) -> None:
    """Token ids a client asks to decode (`/v1/detokenize`): the tokenizer raises on a negative one."""
    rows = tokens if isinstance(tokens, list) and tokens and isinstance(tokens[0], list) else [tokens]
    for row in rows:
        for token in row if isinstance(row, list) else []:
            if isinstance(token, int) and not 0 <= token < TOKENIZER_IDS:
                raise FieldError(f"token id {token} is not a token id (they are whole numbers from 0 to "
                                 f"{TOKENIZER_IDS - 1})")


def _check_logprob_start(obj: object) -> None:
    """The scheduler compares `logprob_start_len` with the prompt's length: a list there (a single request
    with a batch's field) raised in the scheduler and the server exited."""
    start = getattr(obj, "logprob_start_len", None)
    if start is None:
        return
    if not _whole(start) or not -1 <= start < INT64:
        raise FieldError(f"logprob_start_len must be a whole number from -1 (the default), got {start!r}")
