"""What the server takes from a client, checked once every path has tokenized it.

Two rules, both enforced in the tokenizer process just before a request is
handed to the scheduler (SGLang's `_validate_one_request`, which the single,
batch, n > 1 and OpenAI paths all go through):

- **No empty prompt.** A prompt of no tokens (empty text, markup around
  nothing, ids that are only markers) or of only whitespace would reach the
  model as an empty extend, which SGLang's CPU path cannot run: one such
  request took the whole scheduler down.
- **Layout hints only of the server's making.** The `mepic.chunks` kv_hints
  action tells the planner where chunks and pads are. A client that could
  send one could have the scheduler key its own tokens as a chunk's. (No
  action makes the scheduler store KV: it stores what its own compile rows
  compute, compile_rows.py.) The tokenizer side seals every action it made
  (ids_and_hint.py; state.MarkedRequest says which) here, once the ids are
  final: its mark is an HMAC, under a key random to this process that never
  leaves it, of the action's payload and the request's final input ids. An action whose mark is
  not the seal of its own payload and ids is refused, whatever path the request
  came by. A mark is no bearer token: one copied from a log or a response
  authorises only the identical request, which the server itself made.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from array import array
from typing import TYPE_CHECKING, Any, Iterable, Sequence, cast

from sglang_mepic.frontend import state
from sglang_mepic.wire.hint import HINT_TYPE, MARK_KEY

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.kv_hints import KvHintAction, KvHintsEnvelope

# Random per tokenizer process; it never leaves the process (the scheduler ignores the mark).
_KEY = secrets.token_bytes(32)


class IntakeError(ValueError):
    """A request the server refuses (SGLang's HTTP layer answers a ValueError with 400)."""


def _ids_bytes(input_ids: Iterable[int] | None) -> bytes:
    if input_ids is None:
        return b"none"
    try:
        return array("q", input_ids).tobytes()
    except (TypeError, OverflowError):  # not plain integers: refused later, but sealed all the same
        return repr(list(input_ids)).encode()


def seal(version: str, payload: dict[str, Any], input_ids: Iterable[int] | None) -> str:
    """The mark of a `mepic.chunks` payload (its own mark left out) on a request of these ids."""
    body = json.dumps({"version": version, "payload": {k: v for k, v in payload.items() if k != MARK_KEY}},
                      sort_keys=True, separators=(",", ":"), default=repr)
    mac = hmac.new(_KEY, body.encode(), hashlib.sha256)
    mac.update(b"\0")
    mac.update(_ids_bytes(input_ids))
    return mac.hexdigest()


def _is_ours(action: KvHintAction, input_ids: Iterable[int] | None) -> bool:
    payload = action.payload if isinstance(action.payload, dict) else {}
    mark = payload.get(MARK_KEY)
    return isinstance(mark, str) and hmac.compare_digest(mark, seal(action.action_version, payload, input_ids))


def check_hints(kv_hints: KvHintsEnvelope | None, input_ids: Iterable[int] | None) -> None:
    """Refuse a `mepic.chunks` action that is not sealed for its own payload and these final ids."""
    for action in kv_hints.actions if kv_hints is not None else []:
        if action.action_type == HINT_TYPE and not _is_ours(action, input_ids):
            raise IntakeError(f"kv_hints action {HINT_TYPE!r} is made by the server, not sent by clients: "
                              f"mark chunks with <|chunk|>...<|/chunk|> in text, or ids -100 ... -101 in input_ids")


def check_prompt(text: object, input_ids: Sequence[int] | None, session_params: object = None,
                 multimodal: bool = False) -> None:
    if isinstance(session_params, dict) and session_params.get("id"):
        return  # the session's history supplies the prompt
    if not multimodal and isinstance(text, str) and not text.strip():
        raise IntakeError("the prompt is empty or only whitespace" if not text else
                          "the prompt is only whitespace")
    # On the tokens the scheduler will see, whatever media fields say: a processor that added no
    # token left an empty extend all the same (media on a text-only model are refused before:
    # hardening/scheduler_fields.py).
    if input_ids is not None and len(input_ids) == 0:
        raise IntakeError("the prompt has no tokens (empty text, or chunk markers with nothing in them)")


def seal_marked(obj: GenerateReqInput, marked: state.MarkedRequest, input_ids: Sequence[int] | None) -> None:
    """Seal the hint the server made from this request's markup (ids_and_hint.py), now that its ids
    are final; refuse the request if they are not the ids its layout was made for (a multimodal
    processor expanding media placeholders would put every span in the wrong place)."""
    if not marked.same_ids(input_ids):
        raise IntakeError("the prompt's token ids changed after its chunks were laid out (the model's "
                          "processor expands media placeholders): chunk markup cannot be used with this "
                          "request's image, audio or video data")
    kv_hints = cast("KvHintsEnvelope | None", obj.kv_hints)  # one request's: SGLang decoded its envelope
    for action in kv_hints.actions if kv_hints is not None else []:
        if action.action_type == HINT_TYPE:
            action.payload[MARK_KEY] = seal(action.action_version, action.payload, input_ids)


def check(obj: GenerateReqInput | EmbeddingReqInput, input_ids: Sequence[int] | None) -> None:
    """Refuse what must not reach the scheduler; the message names the batch item, if any."""
    try:
        # A client's ids are the prompt: SGLang's request log (level >= 2) writes their decoding into
        # `text`, which must not decide what is refused.
        text = getattr(obj, "text", None) if getattr(obj, "input_ids", None) is None else None
        check_prompt(text, input_ids, getattr(obj, "session_params", None), multimodal=_multimodal(obj))
        if (marked := state.marked(obj)) is not None:
            seal_marked(cast("GenerateReqInput", obj), marked, input_ids)  # ids_and_hint marks only these
        else:
            check_hints(getattr(obj, "kv_hints", None), input_ids)
    except IntakeError as e:
        raise IntakeError(state.labelled(obj, str(e))) from None


def _multimodal(obj: object) -> bool:
    return any(getattr(obj, f, None) for f in ("image_data", "video_data", "audio_data"))  # [] is no data
