"""Tokenizer side: a generate request's chunk markup becomes input ids and its `mepic.chunks` hint.

Marked-up text or input_ids (or text split by the separator, auto_chunk.py)
become plain input_ids plus the hint (hint.py) with the chunk spans; malformed
markup raises a ValueError, which the HTTP layer returns as a 400 before the
request reaches the scheduler. With the mepic attention backend and radix cache
the request is laid out in slots (chunks on whole pages, pads filled with
`PAD_FILL_ID`), and its `logprob_start_len` becomes the slot of that token
(logprobs.py).

A plain text (no markup, no separator) is split at the texts registered in its
namespace (known_texts.py): the server's choice, not the client's, so it must
not cost the prompt its place. A prompt that cannot fit the context by its
characters is refused before it is searched, a session turn is never searched,
and found texts whose pads would take the request past its limits are left
prompt text, the last ones first (the plain prompt, if none fits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence, cast

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.kv_hints import KvHintAction, KvHintsEnvelope

from sglang_mepic import env
from sglang_mepic.frontend import auto_chunk, known_texts, limits, state
from sglang_mepic.frontend.markup import MarkupError, has_id_markup, split_ids, tokenize_pieces
from sglang_mepic.wire import hint
from sglang_mepic.wire.slots import PAD_FILL_ID, start_slot
from sglang_mepic.wire.layout import PAD_ID, Kind, Layout, Piece, layout

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

Parts = Sequence[tuple[Kind, str]]  # (kind, text) pieces, as markup.split_text returns them


def prepare(manager: TokenizerManager, obj: GenerateReqInput | EmbeddingReqInput) -> None:
    """Before SGLang tokenizes a generate request: strip its markup. Nothing else is sent: the
    scheduler computes chunks no tier holds in the forward that needs them (compile_rows.py)."""
    if not isinstance(obj, GenerateReqInput):
        return
    try:
        strip_markup(manager, obj)
    except ValueError as e:  # malformed markup, too many chunks, markup in a session
        raise state.relabel(obj, e) from None


def _lays_out_slots(manager: TokenizerManager) -> bool:
    """Pad slots need the mepic attention backend (masks them, positions by the map) and
    the mepic radix cache (keys them apart from real tokens); otherwise chunks are
    computed in full on the real tokens, as they are in `full` mode."""
    args: Any = manager.server_args  # ServerArgs assembles its fields at run time (arg_groups): mypy sees none
    return args.attention_backend == "mepic" and args.radix_cache_backend == "mepic" and env.settings().mode.reuses


def with_hint(envelope: KvHintsEnvelope | None, rid: object, action: dict[str, Any]) -> KvHintsEnvelope:
    """The request's envelope carrying the encoded hint `action` (hint.encode) in place of any earlier
    one (a client's is dropped); intake.py seals it once the request's ids are final."""
    others = [a for a in (envelope.actions if envelope else []) if a.action_type != hint.HINT_TYPE]
    return KvHintsEnvelope(protocol_version=envelope.protocol_version if envelope else "1",
                           message_id=envelope.message_id if envelope else str(rid or ""),
                           actions=[*others, KvHintAction(**action)])


def strip_markup(manager: TokenizerManager, obj: GenerateReqInput) -> Layout | None:
    """Replace markup by input_ids and the hint; returns the layout when the request is laid out in slots."""
    if obj.input_embeds is not None:
        return None
    settings = env.settings()
    vocab = manager.model_config.vocab_size
    found = False
    input_ids = cast("list[int] | None", obj.input_ids)  # one request's (SGLang tokenizes each item alone)
    if input_ids is not None and (has_id_markup(input_ids) or max(input_ids, default=0) >= vocab):
        # Also catches plain out-of-vocabulary ids, which would otherwise crash the scheduler.
        pieces = split_ids(input_ids, vocab)
    elif obj.input_ids is None and isinstance(obj.text, str):
        # (ids given are the prompt: a `text` beside them is SGLang's request log's decoding of them)
        parts, found = _text_parts(manager, obj)
        if parts is None:
            return None
        if not (text := "".join(part for _, part in parts)).strip():
            obj.text = text  # refused as an empty prompt at validation (intake.py)
            return None
        pieces = _tokenized(manager, parts)
    else:
        return None  # a client's own mepic.chunks hint is refused at validation (intake.py)
    lay = layout(pieces, state.page_size(manager), settings.placement)
    lays_out = _lays_out_slots(manager)
    if found and not _fits(manager, obj, lay, lays_out):
        # found: the text's parts were searched (the branch above), so they are not None
        if (fitted := _fitted(manager, obj, cast(Parts, parts), pieces, lays_out)) is None:
            return None  # the plain prompt, as SGLang takes it
        pieces, lay = fitted
    if len(lay.chunks) > settings.max_chunks and lays_out:  # each may be a compile row
        raise ValueError(f"the request marks {len(lay.chunks)} chunks for reuse, more than the {settings.max_chunks} "
                         "this server allows (--mepic-max-chunks); join small chunks or mark fewer")
    real_tokens = lay.real_tokens()
    laid_out = lays_out and bool(lay.chunks or lay.pad_runs())
    if laid_out and _in_session(obj):
        # SGLang rebuilds a session's request from its history and passes no kv_hints on: the
        # pad slots would reach the model as tokens.
        raise MarkupError("chunk markup cannot be used in a session (SGLang passes no layout on "
                          "through sessions); send the request without session_params, or without markup")
    if laid_out:
        # Laid out in slots: pads have no position and are masked by the mepic backend.
        slots = lay.slot_tokens()
        obj.input_ids = [PAD_FILL_ID if t == PAD_ID else t for t in slots]
        if obj.return_logprob and isinstance(obj.logprob_start_len, int) and obj.logprob_start_len >= 0:
            obj.logprob_start_len = start_slot(slots, obj.logprob_start_len)  # a token index -> its slot
        chunks, pads = tuple((seg.start, seg.end) for seg in lay.chunks), tuple(lay.pad_runs())
    else:
        obj.input_ids = real_tokens
        chunks, pads = lay.marked_chunks, None  # spans of the real tokens; no pad slots
    obj.text = None
    # The request's one hint, built here only: slot spans and pad runs where laid out, token spans where not.
    action = hint.encode(hint.Hint(chunks=chunks, pads=pads))
    obj.kv_hints = with_hint(cast("KvHintsEnvelope | None", obj.kv_hints), obj.rid, action)  # one request's, decoded
    # What validation checks (limits: the slots against the limits; intake: the ids are still
    # these) and the responses report (the chunk spans).
    state.mark(obj, state.MarkedRequest.made(lay.marked_chunks, real_tokens=len(real_tokens),
                                                             slots=lay.size if laid_out else None,
                                                             input_ids=obj.input_ids))
    return lay if laid_out else None


def _in_session(obj: GenerateReqInput) -> bool:
    return isinstance(obj.session_params, dict) and bool(obj.session_params.get("id"))


def _text_parts(manager: TokenizerManager, obj: GenerateReqInput) -> tuple[Parts | None, bool]:
    """How a text prompt splits into pieces: by the client's markup or the separator, else by the texts
    registered in its namespace; and whether the chunks are the server's finds (True), which must not
    cost the prompt its place. A session turn is served as the plain prompt it was: SGLang passes no
    layout on through sessions, and the client marked nothing."""
    text = cast(str, obj.text)  # strip_markup asks for a text prompt's parts only
    parts = auto_chunk.text_pieces(text)
    if parts is not None or _in_session(obj) or not env.settings().known_texts:
        return parts, False
    if not limits.fits_by_characters(manager, text):
        return None, False  # over the context, to be cut to it (--allow-auto-truncate): plain, as SGLang cuts it
    # One request's keys: SGLang refused any that is not a string when it normalized the request.
    namespace = known_texts.namespace_of(cast("str | None", obj.extra_key), cast("str | None", obj.cache_salt))
    parts = known_texts.known_pieces(text, namespace)
    return parts, parts is not None


def _tokenized(manager: TokenizerManager, parts: Parts) -> list[Piece]:
    tok = manager.tokenizer
    return tokenize_pieces(parts, lambda s, special: tok.encode(s, add_special_tokens=special))


def _fits(manager: TokenizerManager, obj: GenerateReqInput, lay: Layout, lays_out: bool) -> bool:
    return limits.fits_laid_out(manager, lay.size if lays_out else len(lay.real_tokens()),
                                        limits.new_tokens(manager, obj.sampling_params))


def _fitted(manager: TokenizerManager, obj: GenerateReqInput, parts: Parts, pieces: list[Piece],
            lays_out: bool) -> tuple[list[Piece], Layout] | None:
    """A layout of the found texts that fits the limits the plain prompt met: the last chunks become
    prompt text (their pads go) until it fits, and the prompt is tokenized again as their markup would
    be (with those texts unmarked); None where even that does not fit (the plain prompt may)."""
    size, placement = state.page_size(manager), env.settings().placement
    kept = [i for i, (kind, _) in enumerate(parts) if kind is Kind.CHUNK]
    trial = list(pieces)
    while kept:  # the same tokens, fewer chunks: which of them may stay
        drop = kept.pop()
        trial[drop] = Piece(Kind.PROMPT, trial[drop].tokens)
        if _fits(manager, obj, layout(trial, size, placement), lays_out):
            break
    if not kept:
        return None
    pieces = _tokenized(manager, _unmarked(parts, set(kept)))
    lay = layout(pieces, size, placement)
    return (pieces, lay) if _fits(manager, obj, lay, lays_out) else None


def slots_needed(manager: TokenizerManager, parts: Parts) -> int:
    """The slots (tokens, where not laid out) a request of these (kind, text) pieces takes."""
    return slots_of(manager, _tokenized(manager, parts))


def slots_of(manager: TokenizerManager, pieces: list[Piece]) -> int:
    """The slots (tokens, where not laid out) a request of these tokenized pieces takes."""
    lay = layout(pieces, state.page_size(manager), env.settings().placement)
    return lay.size if _lays_out_slots(manager) else len(lay.real_tokens())


def _unmarked(parts: Parts, kept: set[int]) -> list[tuple[Kind, str]]:
    """The parts with every chunk but those `kept` joined to the prompt text around it."""
    out: list[tuple[Kind, str]] = []
    for i, (kind, text) in enumerate(parts):
        if kind is Kind.CHUNK and i in kept:
            out.append((kind, text))
        elif out and out[-1][0] is Kind.PROMPT:
            out[-1] = (Kind.PROMPT, out[-1][1] + text)
        else:
            out.append((Kind.PROMPT, text))
    return out
