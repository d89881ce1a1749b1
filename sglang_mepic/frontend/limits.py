"""Tokenizer side: the bounds SGLang's scheduler assumes of a request, checked before it is sent.

SGLang validates a request's length against the model's context in the
tokenizer process, but several limits it applies only later, inside the
scheduler, where a request that breaks one takes the whole server down or is
refused after its chunk compiles have run:

- **The input limit the KV pool sets.** The scheduler refuses inputs of
  `max_req_input_len` tokens or more (from the pool size when the pool holds
  fewer tokens than the context). A laid-out request is checked against the
  smaller of the two limits (`max_input_slots`), whatever `--allow-auto-truncate`
  says (cutting it would cut its layout); any other request as SGLang itself would
  refuse it.
- **Room for its new tokens in that pool.** SGLang clips a request's new tokens to what the pool holds
  beside its paged input and a page (`max_new_tokens_for_memory`), silently, down to none: a laid-out
  request a few slots under the input limit then answered with no token at all, alone, and behind a
  pool of stored chunks it never joined the batch, and SGLang's queue waited behind it (a tiny-4l
  server on 192 pages, 2026-11-30). A laid-out request must leave room for the new tokens it asks for
  (`_pool_refusal`).
- **Beam search under the mepic backend.** Its beams take request-pool rows with no request behind
  them, so no position-map row: refused (`_check_beam`).

The fields SGLang's scheduler trusts whatever the backend (sampling numbers, top-logprobs, stop ids and
patterns, media on a text-only model, cache-key types) are hardening's (`hardening/scheduler_fields.py`):
SGLang's to fix, not MEPIC's; the same hook runs both.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Sequence, TypeGuard, cast

from sglang_mepic.frontend import state
from sglang_mepic.side_table import SideTable

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from tokenizers.normalizers import Normalizer
    from tokenizers.pre_tokenizers import PreTokenizer
    from transformers import PreTrainedTokenizerBase


class LimitError(ValueError):
    """A request outside a bound the scheduler relies on (SGLang's HTTP layer answers a ValueError with 400)."""


def pool_tokens(manager: TokenizerManager) -> int | None:
    """The KV pool's tokens where the pool, not the context, bounds a request: SGLang sets `max_req_input_len`
    to min(context_len - 1, pool - 1) - 5 (tp_worker.py); None where the context bounds it (or is as large)."""
    limit = getattr(manager, "max_req_input_len", None)
    if not isinstance(limit, int) or limit <= 0 or limit + 6 >= manager.context_len:
        return None
    return limit + 6


def max_input_slots(manager: TokenizerManager) -> int:
    """The most input slots SGLang serves in one request: it refuses `len + reserved >= context_len` in
    the tokenizer and `len >= max_req_input_len` in the scheduler (which is set from the pool)."""
    limit = manager.context_len - int(getattr(manager, "num_reserved_tokens", 0) or 0)
    pool_limit = getattr(manager, "max_req_input_len", None)
    if isinstance(pool_limit, int) and pool_limit > 0:
        limit = min(limit, pool_limit)
    return max(0, limit - 1)


def _check_laid_out(manager: TokenizerManager, obj: object, slots: int, real_tokens: int) -> None:
    """A laid-out request's slots, and its slots and new tokens, must fit. SGLang checks the same, but
    its refusal named a slot count as the client's tokens (or, after an n > 1 request's compiles had
    run, the scheduler aborted it)."""
    refusal = _laid_out_refusal(manager, slots, real_tokens, new_tokens(manager, getattr(obj, "sampling_params", None)))
    if refusal is not None:
        raise LimitError(refusal)


def fits_laid_out(manager: TokenizerManager, slots: int, new: int | None) -> bool:
    """Whether a request of `slots` slots (its tokens, where not laid out) and `new` new tokens
    (`new_tokens`) fits this server's limits."""
    return _laid_out_refusal(manager, slots, slots, new) is None


def new_tokens(manager: TokenizerManager, params: object) -> int | None:
    """The new tokens a request's prompt must leave room for, by its sampling parameters; None: SGLang
    checks none (none asked for, or it truncates)."""
    new = params.get("max_new_tokens") if isinstance(params, dict) else None
    return new if _whole(new) and not allows_truncation(manager) else None


def _laid_out_refusal(manager: TokenizerManager, slots: int, real_tokens: int, new: int | None) -> str | None:
    limit = max_input_slots(manager)
    if slots > limit:
        return (f"request needs {slots} KV slots after chunk padding ({real_tokens} real tokens), more than the "
                f"{limit} this server accepts in one request (the smaller of the context length and the KV "
                "pool's input limit)")
    if (refusal := _pool_refusal(manager, slots, real_tokens, new)) is not None:
        return refusal
    reserved = int(getattr(manager, "num_reserved_tokens", 0) or 0)
    if new is not None and slots + reserved + new > manager.context_len:
        return (f"request needs {slots} KV slots after chunk padding ({real_tokens} real tokens) and {new} new "
                f"tokens, more than the model's context length ({manager.context_len} tokens); ask for at most "
                f"{max(0, manager.context_len - slots - reserved)} new tokens, or send a shorter prompt")
    return None


def _pool_refusal(manager: TokenizerManager, slots: int, real_tokens: int, new: int | None) -> str | None:
    """SGLang's clip of new tokens (`max_new_tokens_for_memory`: the pool less the paged input, a page and a
    token) must leave the new tokens asked for, at least one."""
    pool = pool_tokens(manager)
    if pool is None:
        return None
    page = state.page_size(manager)
    room = pool - -(-slots // page) * page - page - 1
    wanted = max(1, new or 0)
    if room >= wanted:
        return None
    return (f"request needs {slots} KV slots after chunk padding ({real_tokens} real tokens) and {wanted} new "
            f"token{'s' if wanted > 1 else ''}, more than the KV pool holds ({pool} tokens, a page of them kept "
            f"free): {'ask for at most ' + str(room) + ' new tokens, or ' if room > 0 else ''}send a shorter prompt")


def fits_by_characters(manager: TokenizerManager, text: str) -> bool:
    """Whether a text prompt may fit the context, judged by its characters before it is tokenized: one
    that cannot is refused here, unless SGLang truncates prompts (--allow-auto-truncate): then False."""
    limit = max_prompt_chars(manager)
    if limit is None or len(text) <= limit:
        return True
    if allows_truncation(manager):
        return False
    raise LimitError(f"the prompt has {len(text)} characters, more than the {limit} that can fit the model's context "
                     f"length ({manager.context_len} tokens of at most {limit // manager.context_len} characters "
                     "each); send a shorter prompt")


def max_prompt_chars(manager: TokenizerManager) -> int | None:
    """The most characters a text that fits the context can have; None where no bound is proven."""
    per_token = chars_per_token(getattr(manager, "tokenizer", None))
    return None if per_token is None else manager.context_len * per_token


# A tokenizer's characters per token, worked out once (its whole vocabulary is read).
_PER_TOKEN: SideTable[int | None] = SideTable("most characters a token stands for")
# A character's canonical decomposition has at most 4 code points (U+1F82): a Unicode normal form shortens
# a text at most 4 times. Replace, Prepend and Lowercase never shorten it where Replace's content is no
# shorter than its literal pattern; anything else (Strip, StripAccents, Precompiled, a regex) may.
_UNICODE_FORMS = {"NFC", "NFD", "NFKC", "NFKD"}
# Pre-tokenizers that keep every character (unless a behavior "Removed" drops the delimiters).
_KEEPING = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "Split", "Sequence"}


def chars_per_token(tokenizer: PreTrainedTokenizerBase | None) -> int | None:
    """The most characters of a prompt one token stands for, where the tokenizer provably puts every
    character in some token (a fast tokenizer's byte-level or byte-fallback BPE); None otherwise."""
    if tokenizer is None:
        return None
    if tokenizer not in _PER_TOKEN:
        _PER_TOKEN.set(tokenizer, _per_token(tokenizer))
    return _PER_TOKEN.get(tokenizer)


def _per_token(tokenizer: PreTrainedTokenizerBase) -> int | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ != "BPE":  # no fast BPE tokenizer: no bound proven
        return None
    shrink = _shrink(_state(backend.normalizer))
    kept = _pre_tokenizers(_state(backend.pre_tokenizer))
    if shrink is None or kept is None:
        return None
    vocab = backend.get_vocab(with_added_tokens=True)
    if not (getattr(backend.model, "byte_fallback", False) or ("ByteLevel" in kept and _utf8_bytes() <= vocab.keys())):
        return None  # a character outside the vocabulary may be dropped, or fused with others into one token
    if any(t.lstrip or t.rstrip for t in backend.get_added_tokens_decoder().values()):
        return None  # such a token takes in the whitespace beside it, however long
    return shrink * max(map(len, vocab), default=1)


def _state(component: Normalizer | PreTokenizer | None) -> dict[str, Any] | None:
    return None if component is None else json.loads(component.__getstate__())


def _shrink(normalizer: dict[str, Any] | None) -> int | None:
    """How many times a normalizer may shorten a text; None: without bound."""
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        factors = [_shrink(n) for n in normalizer.get("normalizers") or []]
        return None if None in factors else math.prod(cast(list[int], factors))  # no None in them
    if kind in _UNICODE_FORMS:
        return 4
    if kind in ("Prepend", "Lowercase"):
        return 1
    pattern = (normalizer.get("pattern") or {}).get("String") if kind == "Replace" else None
    return 1 if isinstance(pattern, str) and len(normalizer.get("content") or "") >= len(pattern) else None


def _pre_tokenizers(pre: dict[str, Any] | None) -> set[str] | None:
    """The kinds of pre-tokenizer in use; None where one may drop characters."""
    if pre is None:
        return set()
    kind = pre.get("type")
    if kind not in _KEEPING or pre.get("behavior") == "Removed":
        return None
    inner = [_pre_tokenizers(p) for p in pre.get("pretokenizers") or []]
    return None if None in inner else {kind}.union(*cast(list[set[str]], inner))  # no None in them


def _utf8_bytes() -> set[str]:
    """The byte-level alphabet's characters (GPT-2's table) of every byte UTF-8 text may hold (all
    but 0xC0, 0xC1 and 0xF5 to 0xFF)."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
             *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table = {b: chr(b) for b in shown}
    table.update((b, chr(256 + i)) for i, b in enumerate(b for b in range(256) if b not in table))
    return {table[b] for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5}


def _whole(value: object) -> TypeGuard[int]:
    """An integer from JSON: bool is an int subclass in Python, but `true` is no count."""
    return isinstance(value, int) and not isinstance(value, bool)


def allows_truncation(manager: TokenizerManager) -> bool:
    return bool(getattr(manager.server_args, "allow_auto_truncate", False))


def check(manager: TokenizerManager, obj: GenerateReqInput | EmbeddingReqInput,
          input_ids: Sequence[int] | None) -> None:
    """Refuse a generate request (one item of a batch) outside the scheduler's bounds."""
    _check_beam(manager, getattr(obj, "sampling_params", None))
    marked = state.marked(obj)
    if marked is not None and marked.slots is not None:
        _check_laid_out(manager, obj, marked.slots, marked.real_tokens)
    elif input_ids is not None and not allows_truncation(manager):
        limit = max_input_slots(manager)
        if len(input_ids) > limit:
            raise LimitError(f"the input is {len(input_ids)} tokens, more than the {limit} this server accepts "
                             f"in one request (context length {manager.context_len}, "
                             f"KV pool input limit {getattr(manager, 'max_req_input_len', None)})")


def _check_beam(manager: TokenizerManager, params: object) -> None:
    """Beam search runs its beams on request-pool rows it takes itself, with no request behind them,
    so they never get a position-map row: under the mepic attention backend a beam would rotate
    keys at the positions of whichever request used its row last."""
    width = params.get("beam_width") if isinstance(params, dict) else None
    if _whole(width) and width > 1 and getattr(manager.server_args, "attention_backend", None) == "mepic":
        raise LimitError(f"beam_width {width}: beam search is not supported by --attention-backend mepic; "
                         "send beam_width 1, or serve with another --attention-backend")
