"""Input logprobs of a laid-out request come back per user token, in the user's order.

SGLang lists them per slot from the request's `logprob_start_len` on, once the
last prefill pass is done; pads then drop out and each token takes the logits of
the real token before it (logprobs.py). Flat top-logprob arrays are built after
that, from the reordered rows.
"""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.logprobs import per_token

WRITTEN_FOR = "0.5.23"
TARGET = ("sglang.srt.managers.scheduler_components.logprob_result_processor."
          "SchedulerLogprobResultProcessor.add_input_logprob_return_values")
HOOK_TYPE = HookType.AROUND

# Per-slot lists taken per real token; input_token_logprobs_idx is rebuilt from the tokens.
FIELDS = ("input_token_logprobs_val", "input_top_logprobs_val", "input_top_logprobs_idx",
          "input_token_ids_logprobs_val", "input_token_ids_logprobs_idx")


def hook(original, processor, i, req, *args, last_prefill_chunk: bool, **kwargs):
    link = getattr(req, "mepic", None)
    if link is None or not last_prefill_chunk or req.logprob.input_token_logprobs_val is not None:
        return original(processor, i, req, *args, last_prefill_chunk=last_prefill_chunk, **kwargs)
    flat, req.return_flat_raw_top_logprobs = req.return_flat_raw_top_logprobs, False
    try:
        result = original(processor, i, req, *args, last_prefill_chunk=last_prefill_chunk, **kwargs)
    finally:
        req.return_flat_raw_top_logprobs = flat
    start = req.logprob_start_len
    if start < 0:
        return result
    pads = link.pad_slots()
    for name in FIELDS:
        entries = getattr(req.logprob, name)
        if entries:
            setattr(req.logprob, name, per_token(entries, start, pads))
    # SGLang's idx lists the planned slot ids; from the start slot on that order is natural.
    req.logprob.input_token_logprobs_idx = [link.natural[s] for s in range(start, link.size) if not pads[s]]
    if flat:
        processor._flatten_input_top_logprobs(req)
    return result
