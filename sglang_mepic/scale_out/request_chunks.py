"""The chunks a tokenized request carries, as the DP controller receives it (SGLang's
`TokenizedGenerateReqInput`: its input ids laid out in slots, its `mepic.chunks` kv_hints action, its
`extra_key`, `cache_salt` and `lora_id`), keyed as the replica's cache will key them (wire/chunk_keys.py).

Only a hint the tokenizer side made may steer routing. The tokenizer refuses, before a request leaves it,
every `mepic.chunks` action that does not carry its seal (an HMAC of the payload and the final ids under a key
that never leaves the tokenizer process: frontend/intake.py), and the controller reads requests from the
tokenizer's socket alone, the channel the scheduler takes its hints from too. The controller cannot check the
HMAC itself (it has no key); what reaches it with the action but without a seal's shape (64 hex digits), with
two actions, or with spans outside its ids is no hint of the server's making and routes as an unmarked
request: by load, never by its chunks.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sglang_mepic.config import Placement
from sglang_mepic.scale_out.affinity import Chunk
from sglang_mepic.wire.chunk_keys import cache_namespace, chunk_keys
from sglang_mepic.wire.hint import HINT_TYPE, MARK_KEY, Hint, HintError, decode

if TYPE_CHECKING:
    from sglang.srt.managers.kv_hints import KvHintsEnvelope

_SEAL = re.compile(r"[0-9a-f]{64}")  # intake.seal: an HMAC-SHA256 hexdigest


def sealed_layout(kv_hints: KvHintsEnvelope | None, num_slots: int) -> Hint | None:
    """The request's laid-out hint where it carries the tokenizer's seal and fits its slots; else None."""
    ours = [a for a in (kv_hints.actions if kv_hints is not None else []) if a.action_type == HINT_TYPE]
    if len(ours) != 1 or not isinstance(ours[0].payload, dict):
        return None
    mark = ours[0].payload.get(MARK_KEY)
    if not isinstance(mark, str) or not _SEAL.fullmatch(mark):
        return None
    try:
        hint = decode(kv_hints, num_slots)
    except HintError:
        return None
    return hint if hint is not None and hint.laid_out else None


class RequestChunks:
    """Keys a request's chunks with the server's placement and page size. The model fingerprint the cache adds
    is the same on every replica of one server, so the model path stands for it here: it keeps the keys of
    two servers' routers apart and changes no routing within one."""

    def __init__(self, placement: Placement, page_size: int, model: str) -> None:
        self.placement, self.page_size, self.model = placement, page_size, model

    def of(self, req: object) -> tuple[Chunk, ...]:
        ids = getattr(req, "input_ids", None)
        if ids is None:
            return ()
        hint = sealed_layout(getattr(req, "kv_hints", None), len(ids))
        if hint is None or not hint.chunks or hint.pads is None:
            return ()
        namespace = cache_namespace(getattr(req, "extra_key", None), getattr(req, "cache_salt", None),
                                    getattr(req, "lora_id", None))
        keys = chunk_keys(ids, hint.chunks, hint.pads, self.placement, self.page_size, self.model, namespace)
        return tuple(Chunk(key, end - start) for key, (start, end) in zip(keys, hint.chunks))
