"""Tokenized requests as SGLang's DP controller receives them (ids laid out in slots, the `mepic.chunks`
action sealed by the tokenizer side as intake.py seals it), and a replay of routing that counts compiles:
shared by tests/scale_out/test_affinity.py and test_dp_routing.py."""

import random
from array import array
from collections import deque
from types import SimpleNamespace

from sglang_mepic.config import Placement
from sglang_mepic.frontend import intake
from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID, CHUNK_END_ID, split_ids
from sglang_mepic.scale_out.affinity import AffinityRouter, Chunk
from sglang_mepic.scale_out.request_chunks import RequestChunks
from sglang_mepic.wire import hint
from sglang_mepic.wire.layout import PAD_ID, layout
from sglang_mepic.wire.slots import PAD_FILL_ID

PAGE = 16
VOCAB = 4096  # the tiny model's
KEYS = RequestChunks(Placement.TRAILING, PAGE, "models/tiny")


def laid_out_request(marked_ids, extra_key=None, cache_salt=None, lora_id=None, seal=True, routed_dp_rank=None):
    """What the tokenizer sends for ids with chunk markers (-100 ... -101): slots, and the sealed hint."""
    lay = layout(split_ids(marked_ids, VOCAB), PAGE, Placement.TRAILING)
    ids = [PAD_FILL_ID if t == PAD_ID else t for t in lay.slot_tokens()]
    action = hint.encode(hint.Hint(chunks=tuple((s.start, s.end) for s in lay.chunks), pads=tuple(lay.pad_runs())))
    if seal:
        action["payload"][hint.MARK_KEY] = intake.seal(action["action_version"], action["payload"], ids)
    return SimpleNamespace(input_ids=array("q", ids), kv_hints=SimpleNamespace(actions=[SimpleNamespace(**action)]),
                           extra_key=extra_key, cache_salt=cache_salt, lora_id=lora_id, routed_dp_rank=routed_dp_rank)


def text_ids(text: str, length: int = 40) -> list[int]:
    """A document's token ids: the same text, the same ids."""
    rng = random.Random(text)
    return [rng.randrange(100, VOCAB) for _ in range(length)]


def chunk_of(text: str, extra_key=None, cache_salt=None) -> Chunk:
    """The one chunk of a request that marks `text` as a chunk, in that tenant's namespace."""
    (chunk,) = KEYS.of(laid_out_request([1, 2, CHUNK_BEGIN_ID, *text_ids(text), CHUNK_END_ID, 3],
                                        extra_key=extra_key, cache_salt=cache_salt))
    return chunk


def workload_requests(count: int = 16) -> list[tuple[Chunk, ...]]:
    """The chunks of the first `count` requests of the cache-independence workload (seed SEED), as the
    e2e tests send it."""
    from cache.e2e.test_cache_independence import SEED, workload

    return [KEYS.of(laid_out_request(ids)) for ids in workload(random.Random(SEED))[:count]]


def compiles_per_chunk(requests, router: AffinityRouter | None, replicas, in_flight: int) -> float:
    """Route `requests` (their chunks) with at most `in_flight` at once, the oldest finishing first; a replica
    compiles each distinct chunk it is sent once. router None: SGLang's round robin."""
    loads, flight, sent = dict.fromkeys(replicas, 0), deque(), {r: set() for r in replicas}
    for i, chunks in enumerate(requests):
        while len(flight) >= in_flight:
            loads[flight.popleft()] -= 1
        chosen = router.choose(chunks, replicas, loads) if router is not None else replicas[i % len(replicas)]
        loads[chosen] += 1
        flight.append(chosen)
        sent[chosen] |= {c.key for c in chunks}
    distinct = set().union(*sent.values())
    return sum(len(keys) for keys in sent.values()) / len(distinct)
