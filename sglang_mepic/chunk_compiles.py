"""Tokenizer side of chunk compiles: send each chunk of a request alone before the request.

(The scheduler side, which holds a request back while a compile it needs is still
to run, is compiles.py.)

When chunks are reused (every mode but `full`), each chunk of a laid-out request
is first sent alone as an internal compile request: the chunk computed
standalone, positions from 0, whose pages then join the chunk store. A chunk
the cache already holds costs one token there (the radix tree matches the rest).
The request itself is sent right behind its compiles, naming them in its hint;
the scheduler holds it back only while a compile of a chunk it lacks is still
to run, so chunks already resident cost no extra round trip. Requests arriving
together share one compile of a chunk.
"""

import asyncio
import dataclasses
import logging
import uuid
from dataclasses import dataclass

from sglang.srt.managers.io_struct import GenerateReqInput

from sglang_mepic import config, hint, intake, request_markup
from sglang_mepic.request_layout import PAD_FILL_ID
from sglang_mepic.request_markup import with_hint
from sglang_mepic.segments import PAD_ID, Layout, Segment

logger = logging.getLogger(__name__)

# Set on the compile requests this module makes: they carry no markup and send no compiles.
COMPILE_FLAG = "_mepic_compile"

# The compiles serving each chunk segment, kept on the request object itself: the tokenizer
# side streams every copy of an n > 1 request through a shallow copy of the object it
# tokenized (with a new rid), so the attribute reaches every copy's response.
COMPILES = "_mepic_compiles"


def is_compile(obj) -> bool:
    return getattr(obj, COMPILE_FLAG, False)


async def prepare(manager, obj) -> None:
    """Before SGLang tokenizes a generate request: strip its markup (request_markup.py) and,
    when its chunks are reused, send their compiles and name them in its hint."""
    if not isinstance(obj, GenerateReqInput) or is_compile(obj):
        return
    try:
        lay = request_markup.strip_markup(manager, obj)
    except ValueError as e:  # malformed markup, an empty prompt, a request too long once padded
        raise intake.relabel(obj, e) from None
    if lay is None or not lay.chunks or not config.mode().reuses:
        return
    compiles = await send_compiles(manager, lay, obj)
    if compiles is not None:
        setattr(obj, COMPILES, compiles)
        named = dataclasses.replace(hint.decode(obj.kv_hints), compiles=tuple(c.rid for c in compiles))
        obj.kv_hints = with_hint(obj.kv_hints, obj.rid, hint.encode(named), obj.input_ids)


def compile_request(seg: Segment, parent: GenerateReqInput, page_size: int, sink: int | None) -> GenerateReqInput:
    """The chunk alone, padded as in any request, plus one pad slot: SGLang always computes
    at least the last slot, and a pad there lets the tree match every page of a compiled chunk.

    With a `sink` token (the model's BOS), the chunk follows it on a page of its own, so the
    chunk attends to an attention sink as it would in a prompt, instead of making its own
    first token the sink.
    """
    head = [] if sink is None else [sink] + [PAD_FILL_ID] * (page_size - 1)
    at, size = len(head), seg.size
    pads = ([(1, page_size - 1)] if head and page_size > 1 else []) + \
        ([(at, seg.lead_pad)] if seg.lead_pad else []) + [(at + size - seg.tail_pad, seg.tail_pad + 1)]
    action = hint.encode(hint.Hint(chunks=((at, at + size),), pads=tuple(pads), compile=True))
    input_ids = head + [PAD_FILL_ID if t == PAD_ID else t for t in seg.padded_tokens()] + [PAD_FILL_ID]
    req = GenerateReqInput(
        rid=f"mepic-compile-{uuid.uuid4().hex}",
        input_ids=input_ids,
        # Greedy: the token it samples is dropped, and one non-greedy request sends its whole
        # prefill batch down SGLang's top-k/top-p sampler instead of argmax.
        sampling_params={"max_new_tokens": 0, "temperature": 0},
        extra_key=parent.extra_key, cache_salt=parent.cache_salt, lora_path=parent.lora_path,
        kv_hints=with_hint(None, None, action, input_ids),
    )
    setattr(req, COMPILE_FLAG, True)
    return req


async def _drain(manager, obj) -> str:
    """Run a compile request; returns where the scheduler found the chunk (device, host, storage
    or absent). A compile that fails or is aborted only means the chunk is computed in context."""
    found, why = "absent", None
    try:
        async for out in manager.generate_request(obj, None):
            meta = out.get("meta_info", {})
            found = meta.get("mepic_residency", found)
            reason = meta.get("finish_reason") or {}
            if reason.get("type") == "abort":
                why = reason.get("message") or "aborted"
    except Exception as e:  # noqa: BLE001 - the request it serves must go on regardless
        why = str(e) or type(e).__name__
    if why is not None:
        logger.warning("MEPIC chunk compile did not complete (%s); the chunk is computed in context", why)
    return found


@dataclass
class Compile:
    rid: str
    task: asyncio.Task  # its run; the result is where the scheduler found the chunk

    async def sent(self, manager) -> None:
        """Returns once the compile has been dispatched to the scheduler (or ended without it).

        The request it serves is sent after this on the same socket, so the scheduler
        receives the compile first and knows to hold the request back for it."""
        spins = 0
        while not self.task.done():
            state = manager.rid_to_state.get(self.rid)
            if state is not None and state.dispatched:
                return
            spins += 1
            await asyncio.sleep(0 if spins < 100 else 0.001)


# Compiles in flight, so that requests arriving together share one compile of a chunk
# instead of each computing (and briefly holding) a copy of it.
_inflight: dict[tuple, Compile] = {}


def _sink(manager) -> int | None:
    return manager.tokenizer.bos_token_id if config.compile_sink() == "bos" and manager.tokenizer else None


def _compile_once(manager, seg: Segment, parent: GenerateReqInput) -> Compile:
    key = (seg.tokens, seg.lead_pad, seg.tail_pad, repr(parent.extra_key), repr(parent.cache_salt or None),
           repr(parent.lora_path))  # repr: a tenant named "None" is not the default one
    running = _inflight.get(key)
    if running is None:
        request = compile_request(seg, parent, request_markup.page_size(manager), _sink(manager))
        running = _inflight[key] = Compile(request.rid, asyncio.ensure_future(_drain(manager, request)))
        running.task.add_done_callback(lambda _: _inflight.pop(key, None))
    return running


async def send_compiles(manager, lay: Layout, parent: GenerateReqInput) -> list[Compile] | None:
    """Send the request's chunk compiles; returns the compile serving each chunk segment, in order."""
    if config.canonical_from() is None:
        return None
    compiles = [_compile_once(manager, seg, parent) for seg in lay.chunks]
    for c in {c.rid: c for c in compiles}.values():
        await c.sent(manager)
    return compiles


async def residency(obj) -> list[str] | None:
    """Where each chunk segment of a request was when its compile looked it up."""
    compiles = getattr(obj, COMPILES, None)
    if compiles is None:
        return None
    return list(await asyncio.gather(*(asyncio.shield(c.task) for c in compiles)))
