"""Strip chunk markup before SGLang tokenizes a generate request, and compile new chunks.

Marked-up text or input_ids become plain input_ids plus a `kv_hints` action with
the chunk spans; malformed markup raises a ValueError, which the HTTP layer
returns as a 400 before the request reaches the scheduler. A laid-out request's
`logprob_start_len` becomes the slot of that token (logprobs.py).

When chunks are reused (every mode but `full`), each chunk of the request is
first sent alone as an internal `compile` request: the chunk computed
standalone, positions from 0, whose pages then join the chunk store. A chunk
the cache already holds costs one token there (the radix tree matches the rest).
The request itself is sent right behind its compiles, naming them; the
scheduler holds it back only while a compile of a chunk it lacks is still to
run (compiles.py), so chunks already resident cost no extra round trip.
"""

import asyncio
import logging
import uuid
from dataclasses import dataclass

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.kv_hints import KvHintAction, KvHintsEnvelope
from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import config, intake
from sglang_mepic.markup import (HINT_TYPE, HINT_VERSION, Marked, has_id_markup, has_text_markup,
                                 split_ids, split_text, tokenize_text)
from sglang_mepic.logprobs import start_slot
from sglang_mepic.request_layout import PAD_FILL_ID
from sglang_mepic.segments import PAD_ID, Layout, Segment, layout

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._tokenize_one_request"
HOOK_TYPE = HookType.AROUND

logger = logging.getLogger(__name__)


def _page_size(manager) -> int:
    return int(getattr(manager.server_args, "page_size", None) or 1)


def _lays_out_slots(manager) -> bool:
    """Pad slots need the mepic attention backend (masks them, positions by the map) and
    the mepic radix cache (keys them apart from real tokens); otherwise chunks are
    computed in full on the real tokens, as they are in `full` mode."""
    args = manager.server_args
    return args.attention_backend == "mepic" and args.radix_cache_backend == "mepic" and config.mode().reuses


def _with_action(envelope: KvHintsEnvelope | None, rid, action: dict) -> KvHintsEnvelope:
    others = [a for a in (envelope.actions if envelope else []) if a.action_type != HINT_TYPE]
    return KvHintsEnvelope(protocol_version=envelope.protocol_version if envelope else "1",
                           message_id=envelope.message_id if envelope else str(rid or ""),
                           actions=[*others, KvHintAction(**action)])


COMPILE_FLAG = "_mepic_compile"


def strip_markup(manager, obj: GenerateReqInput) -> Layout | None:
    """Replace markup by input_ids and hints; returns the layout when the request is laid out in slots."""
    if obj.input_embeds is not None or getattr(obj, COMPILE_FLAG, False):
        return None
    vocab = manager.model_config.vocab_size
    if obj.input_ids is not None and (has_id_markup(obj.input_ids) or max(obj.input_ids, default=0) >= vocab):
        # Also catches plain out-of-vocabulary ids, which would otherwise crash the scheduler.
        pieces = split_ids(obj.input_ids, vocab)
    elif isinstance(obj.text, str) and config.text_markup() and has_text_markup(obj.text):
        intake.check_prompt("".join(part for _, part in split_text(obj.text)), None)
        tok = manager.tokenizer
        pieces = tokenize_text(obj.text, lambda s, special: tok.encode(s, add_special_tokens=special))
    else:
        return None  # a client's own mepic.chunks hint is refused at validation (intake.py)
    # Rejects a request that no longer fits the context once chunks are padded.
    lay = layout(pieces, _page_size(manager), config.placement(), max_slots=manager.context_len)
    lays_out = _lays_out_slots(manager)
    if len(lay.chunks) > config.max_chunks() and lays_out:  # each would be a compile request
        raise ValueError(f"the request marks {len(lay.chunks)} chunks for reuse, more than the {config.max_chunks()} "
                         "this server allows (--mepic-max-chunks); join small chunks or mark fewer")
    marked = Marked.from_pieces(pieces)
    action = intake.stamp(marked.hint_action())
    laid_out = lays_out and bool(lay.chunks or lay.pad_runs())
    if laid_out:
        # Laid out in slots: pads have no position and are masked by the mepic backend.
        slots = lay.slot_tokens()
        obj.input_ids = [PAD_FILL_ID if t == PAD_ID else t for t in slots]
        if obj.return_logprob and isinstance(obj.logprob_start_len, int) and obj.logprob_start_len >= 0:
            obj.logprob_start_len = start_slot(slots, obj.logprob_start_len)  # a token index -> its slot
        action["payload"]["pads"] = [list(run) for run in lay.pad_runs()]
        action["payload"]["chunks"] = [[seg.start, seg.end] for seg in lay.chunks]
    else:
        obj.input_ids = marked.input_ids
    obj.text = None
    obj.kv_hints = _with_action(obj.kv_hints, obj.rid, action)
    return lay if laid_out else None


def compile_request(seg: Segment, parent: GenerateReqInput, page_size: int, sink: int | None) -> GenerateReqInput:
    """The chunk alone, padded as in any request, plus one pad slot: SGLang always computes
    at least the last slot, and a pad there lets the tree match every page of a compiled chunk.

    With a `sink` token (the model's BOS), the chunk follows it on a page of its own, so the
    chunk attends to an attention sink as it would in a prompt, instead of making its own
    first token the sink.
    """
    head = [] if sink is None else [sink] + [PAD_FILL_ID] * (page_size - 1)
    at, size = len(head), seg.size
    pads = ([[1, page_size - 1]] if head else []) + ([[at, seg.lead_pad]] if seg.lead_pad else []) + \
        [[at + size - seg.tail_pad, seg.tail_pad + 1]]
    action = intake.stamp({"action_id": "mepic-compile", "action_type": HINT_TYPE, "action_version": HINT_VERSION,
                           "payload": {"pads": pads, "chunks": [[at, at + size]], "compile": True}})
    req = GenerateReqInput(
        rid=f"mepic-compile-{uuid.uuid4().hex}",
        input_ids=head + [PAD_FILL_ID if t == PAD_ID else t for t in seg.padded_tokens()] + [PAD_FILL_ID],
        # Greedy: the token it samples is dropped, and one non-greedy request sends its whole
        # prefill batch down SGLang's top-k/top-p sampler instead of argmax.
        sampling_params={"max_new_tokens": 0, "temperature": 0},
        extra_key=parent.extra_key, cache_salt=parent.cache_salt, lora_path=parent.lora_path,
        kv_hints=_with_action(None, None, action),
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
        request = compile_request(seg, parent, _page_size(manager), _sink(manager))
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


# The compiles serving each chunk segment, kept on the request object itself: the tokenizer
# side streams every copy of an n > 1 request through a shallow copy of the object it
# tokenized (with a new rid), so the attribute reaches every copy's response.
COMPILES = "_mepic_compiles"


async def residency(obj) -> list[str] | None:
    """Where each chunk segment of a request was when its compile looked it up."""
    compiles = getattr(obj, COMPILES, None)
    if compiles is None:
        return None
    return list(await asyncio.gather(*(asyncio.shield(c.task) for c in compiles)))


async def hook(original, manager, obj, *args, **kwargs):
    if isinstance(obj, GenerateReqInput):
        try:
            lay = strip_markup(manager, obj)
        except ValueError as e:  # malformed markup, an empty prompt, a request too long once padded
            raise intake.relabel(obj, e) from None
        if lay is not None and lay.chunks and config.mode().reuses:
            compiles = await send_compiles(manager, lay, obj)
            if compiles is not None:
                setattr(obj, COMPILES, compiles)
                for action in obj.kv_hints.actions:
                    if action.action_type == HINT_TYPE:
                        action.payload["compiles"] = [c.rid for c in compiles]
    return await original(manager, obj, *args, **kwargs)
