"""Guards against SGLang's own mishandling of inputs: what SGLang should fix upstream, not MEPIC.

Each module is one guard, installed by a hook in `sglang_mepic/patches/hardening/` (`scheduler_fields` by
the tokenizer's validation hook, which also runs MEPIC's limits: one hook a function), and imports nothing of this package: MEPIC's
parts (frontend, cache, attention) never depend on it, and a newcomer learning how a chunk is laid out
need not read it. Checked against SGLang 0.5.23 (each hook's WRITTEN_FOR); when an SGLang release fixes
the behaviour, the guard and its hook go.

| module | SGLang's behaviour it covers (0.5.23) | answer |
|---|---|---|
| `body_types` | OpenAI request models' `mode="before"` validators and `normalize_batch_and_arguments` call `.get` / index whatever was sent: AttributeError, TypeError, IndexError; JSON nested about 1,000 deep, a RecursionError | 400, not 500 (any route: nested deeper than 128) |
| `unserved_routes` | `/v1/responses` listed without its handler (no `openai_harmony`); scheduler routes that raise without their server flag, which took the server down | 404 / 400 that says why |
| `validation_errors` | a RequestValidationError's message carries the endpoint's source file and line | the same errors without them |
| `admin_bodies` | `/remove_external_corpus` calls `.get` on any JSON body (`null`, `[]`, `0`) | 400 |
| `weight_paths` | `/update_weights_from_disk` takes a `model_path` that is no folder for a Hub id and leaves a lock file named after it in /tmp | 400 before the loader runs |
| `scheduler_fields` | the scheduler uses a request's sampling numbers, `top_logprobs_num`, `logprob_start_len`, stop ids and patterns, cache-key fields and media fields unchecked (tensor sizes and values, slice bounds, text): a wrong one raised outside any request's handling and the scheduler exited; `/v1/detokenize` answered a negative id with a 500; a `logit_bias` beyond float32 (1e308) is inf after the grammar's mask, whose -inf it makes NaN: a forbidden token reached the grammar (a 500) | 400; `logit_bias` clamped into [-100, 100] (a NaN one: 400) |
| `batch_guard` | an exception in `run_batch` leaves the scheduler process and ends the server | the batch's requests end with a 500; the server goes on |
| `profile_guard` | `/start_profile` accepts a directory it cannot write and activities it does not know; the stop step then raised in every batch | 400 before anything changes; a failed step ends the profile |
| `health_probe` | `/health` sleeps a second before it first looks for an answer (never under 1.003 s) | the same probe, looking every 5 ms |
"""
