"""Input logprobs of a laid-out request, in the user's tokens rather than its slots.

SGLang computes input logprobs over the request's slots from `logprob_start_len`
on: the logits of each slot score the id in the next slot. A laid-out request
has pad slots, and in shared modes its pages are reordered. Three things keep
the user's view exact:

- The tokenizer side turns the user's `logprob_start_len` (a token index) into
  the slot that token sits in (`slots.start_slot`).
- The plan reuses only chunks that end before that slot (`make_plan`'s
  `reuse_before`): like SGLang, which limits the prefix match to
  `logprob_start_len`, every token from there on is computed. Pages before the
  slot are the only ones reordered, so from the slot on, planned order is the
  natural order.
- Each computed slot scores the next *real* token rather than the next slot
  (`next_real_ids`), and the entries are then taken per real token
  (`per_token`): pads drop out, and each token gets the logits of the real
  token before it. As in SGLang, the first requested token has no entry (None).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Sequence, cast

import torch

from sglang_mepic.cache.link import link_of

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler_components.logprob_result_processor import SchedulerLogprobResultProcessor


def next_real_ids(natural: Sequence[int], is_pad: Sequence[bool]) -> list[int]:
    """Per slot, the id of the first real slot after it (0 past the last: the sampled token's place)."""
    out = [0] * len(natural)
    nxt = 0
    for i in range(len(natural) - 1, -1, -1):
        out[i] = nxt
        if not is_pad[i]:
            nxt = natural[i]
    return out


def per_token(entries: list, start: int, is_pad: Sequence[bool]) -> list:
    """SGLang's entries for slots [start, size), as entries for the real tokens among them.

    entries[0] is None and entries[e] comes from the logits of slot start + e - 1, which
    scored the real token after it; a real slot's entry is therefore at its previous real
    slot + 1. The first real slot keeps SGLang's None.
    """
    out, prev = [], None
    for slot in range(start, start + len(entries)):
        if is_pad[slot]:
            continue
        out.append(entries[0] if prev is None else entries[prev - start + 1])
        prev = slot
    return out


def score_real_tokens(batch: ScheduleBatch) -> None:
    """Per request, SGLang lists the id each slot from its logprob start scores: the next slot's.
    For laid-out requests that becomes the next real token in natural order."""
    targets, at = cast(torch.Tensor, batch.extend_input_logprob_token_ids), 0  # extend.py checked: not None
    for req, skipped in zip(batch.reqs, batch.extend_logprob_start_lens):
        count = req.extend_len - skipped
        link = link_of(req)
        first = req.prefix_len + skipped
        end = min(first + count, link.size) if link is not None else first
        if link is not None and end > first:  # (end > first only for a laid-out request)
            nxt = next_real_ids(link.natural, link.pad_slots())
            natural = link.order if link.order is not None else range(link.size)
            targets[at:at + end - first] = torch.tensor([nxt[natural[k]] for k in range(first, end)],
                                                        dtype=targets.dtype)
        at += count


# Per-slot lists taken per real token; input_token_logprobs_idx is rebuilt from the tokens.
INPUT_FIELDS = ("input_token_logprobs_val", "input_top_logprobs_val", "input_top_logprobs_idx",
          "input_token_ids_logprobs_val", "input_token_ids_logprobs_idx")


def add_input_logprobs(original: Callable[..., Any], processor: SchedulerLogprobResultProcessor, i: int, req: Req,
                       *args: Any, last_prefill_chunk: bool, **kwargs: Any) -> Any:
    """SGLang lists input logprobs per slot from the request's `logprob_start_len` on, once the
    last prefill pass is done; for a laid-out request pads then drop out and each token takes
    the logits of the real token before it. Flat top-logprob arrays are built after that, from
    the reordered rows."""
    link = link_of(req)
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
    for name in INPUT_FIELDS:
        entries = getattr(req.logprob, name)
        if entries:
            setattr(req.logprob, name, per_token(entries, start, pads))
    # SGLang's idx lists the planned slot ids; from the start slot on that order is natural.
    req.logprob.input_token_logprobs_idx = [link.natural[s] for s in range(start, link.size) if not pads[s]]
    if flat:
        processor._flatten_input_top_logprobs(req)
    return result
