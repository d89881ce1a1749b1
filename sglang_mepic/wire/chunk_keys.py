"""A chunk's key from what a laid-out request carries: one rule for the scheduler's cache, which keys the KV
it stores by it (cache/link.py), and the DP controller, which routes a request to the replica that holds its
chunks by it (scale_out/request_chunks.py). Two writings of it could part, and a router keyed otherwise than
the cache would send a chunk where the cache does not hold it, or join two tenants' chunks the cache keeps
apart."""

from collections.abc import Sequence

from sglang_mepic.config import Placement
from sglang_mepic.wire.layout import span_hash
from sglang_mepic.wire.namespace import tenant_key
from sglang_mepic.wire.slots import masked_key


def cache_namespace(extra_key: str | None, cache_salt: str | None, lora_id: str | None) -> str:
    """Everything that keeps SGLang's tree entries apart keeps chunks apart too (wire/namespace.py, the rule the
    tokenizer side finds registered texts by). repr keeps None apart from "None" and a field's text from the
    separators: a client's extra_key or cache_salt must never spell another tenant's namespace."""
    return repr((*tenant_key(extra_key, cache_salt), lora_id))


def chunk_keys(natural: Sequence[int], chunks: Sequence[tuple[int, int]], pads: Sequence[tuple[int, int]],
               placement: Placement, page_size: int, model_fingerprint: str, namespace: str) -> tuple[str, ...]:
    """The key of each chunk segment [start, end) of a request laid out in slots: its padded tokens (pads as
    PAD_ID, so a pad never matches a real token), the model, the placement, the page size and the namespace
    (layout.span_hash); never its position."""
    masked = masked_key(natural, pads)
    return tuple(span_hash(masked[s:e], placement, page_size, model_fingerprint, namespace) for s, e in chunks)
