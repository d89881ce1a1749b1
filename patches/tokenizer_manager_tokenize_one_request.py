"""Strip chunk markup before SGLang tokenizes a generate request.

Marked-up text or input_ids become plain input_ids plus a `kv_hints` action with
the chunk spans; malformed markup raises a ValueError, which the HTTP layer
returns as a 400 before the request reaches the scheduler.
"""

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.kv_hints import KvHintAction, KvHintsEnvelope
from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import config
from sglang_mepic.markup import (HINT_TYPE, Marked, check_client_hints, has_id_markup, has_text_markup,
                                 split_ids, tokenize_text)
from sglang_mepic.request_layout import PAD_FILL_ID
from sglang_mepic.segments import PAD_ID, layout

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._tokenize_one_request"
HOOK_TYPE = HookType.AROUND


def _page_size(manager) -> int:
    return int(getattr(manager.server_args, "page_size", None) or 1)


def _lays_out_slots(manager) -> bool:
    """Pad slots need the mepic attention backend (masks them, positions by the map) and
    the mepic radix cache (keys them apart from real tokens); otherwise chunks are
    computed in full on the real tokens."""
    args = manager.server_args
    return args.attention_backend == "mepic" and args.radix_cache_backend == "mepic"


def _with_action(envelope: KvHintsEnvelope | None, rid, action: dict) -> KvHintsEnvelope:
    others = [a for a in (envelope.actions if envelope else []) if a.action_type != HINT_TYPE]
    return KvHintsEnvelope(protocol_version=envelope.protocol_version if envelope else "1",
                           message_id=envelope.message_id if envelope else str(rid or ""),
                           actions=[*others, KvHintAction(**action)])


def strip_markup(manager, obj: GenerateReqInput) -> Marked | None:
    if obj.input_embeds is not None:
        return None
    vocab = manager.model_config.vocab_size
    if obj.input_ids is not None and (has_id_markup(obj.input_ids) or max(obj.input_ids, default=0) >= vocab):
        # Also catches plain out-of-vocabulary ids, which would otherwise crash the scheduler.
        pieces = split_ids(obj.input_ids, vocab)
    elif isinstance(obj.text, str) and has_text_markup(obj.text):
        tok = manager.tokenizer
        pieces = tokenize_text(obj.text, lambda s, special: tok.encode(s, add_special_tokens=special))
    else:
        if obj.kv_hints is not None:
            # Spans index input_ids, so a text request cannot carry any.
            check_client_hints(obj.kv_hints, len(obj.input_ids) if obj.input_ids is not None else 0)
        return None
    # Rejects a request that no longer fits the context once chunks are padded.
    lay = layout(pieces, _page_size(manager), config.placement(), max_slots=manager.context_len)
    marked = Marked.from_pieces(pieces)
    action = marked.hint_action()
    if _lays_out_slots(manager) and lay.pad_runs():
        # Laid out in slots: pads have no position and are masked by the mepic backend.
        obj.input_ids = [PAD_FILL_ID if t == PAD_ID else t for t in lay.slot_tokens()]
        action["payload"]["pads"] = [list(run) for run in lay.pad_runs()]
        action["payload"]["chunks"] = [[seg.start, seg.end] for seg in lay.chunks]
    else:
        obj.input_ids = marked.input_ids
    obj.text = None
    obj.kv_hints = _with_action(obj.kv_hints, obj.rid, action)
    return marked


async def hook(original, manager, obj, *args, **kwargs):
    if isinstance(obj, GenerateReqInput):
        strip_markup(manager, obj)
    return await original(manager, obj, *args, **kwargs)
