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
  compute, compile_rows.py.) The tokenizer side seals every action it creates: its mark is an
  HMAC, under a key random to this process that never leaves it, of the
  action's payload and the request's final input ids. An action whose mark is
  not the seal of its own payload and ids is refused, whatever path the request
  came by. A mark is no bearer token: one copied from a log or a response
  authorises only the identical request, which the server itself made.
"""

import hashlib
import hmac
import json
import secrets
from array import array

from sglang_mepic.side_table import SideTable
from sglang_mepic.wire.hint import HINT_TYPE, MARK_KEY

# Random per tokenizer process; it never leaves the process (the scheduler ignores the mark).
_KEY = secrets.token_bytes(32)


class IntakeError(ValueError):
    """A request the server refuses (SGLang's HTTP layer answers a ValueError with 400)."""


def _ids_bytes(input_ids) -> bytes:
    if input_ids is None:
        return b"none"
    try:
        return array("q", input_ids).tobytes()
    except (TypeError, OverflowError):  # not plain integers: refused later, but sealed all the same
        return repr(list(input_ids)).encode()


def seal(version, payload: dict, input_ids) -> str:
    """The mark of a `mepic.chunks` payload (its own mark left out) on a request of these ids."""
    body = json.dumps({"version": version, "payload": {k: v for k, v in payload.items() if k != MARK_KEY}},
                      sort_keys=True, separators=(",", ":"), default=repr)
    mac = hmac.new(_KEY, body.encode(), hashlib.sha256)
    mac.update(b"\0")
    mac.update(_ids_bytes(input_ids))
    return mac.hexdigest()


def stamp(action: dict, input_ids) -> dict:
    """Seal an encoded `mepic.chunks` action (hint.encode) as made by this server for a request whose
    final input ids are `input_ids`."""
    action["payload"][MARK_KEY] = seal(action["action_version"], action["payload"], input_ids)
    return action


def _is_ours(action, input_ids) -> bool:
    payload = action.payload if isinstance(action.payload, dict) else {}
    mark = payload.get(MARK_KEY)
    return isinstance(mark, str) and hmac.compare_digest(mark, seal(action.action_version, payload, input_ids))


# Set (request_markup.CHUNKS_ATTR) on a request whose markup this server turned into its hint; no
# client can set it (a request body sets declared fields only). An attribute, not a side table:
# with n > 1 SGLang sends and streams `copy.copy`s of the tokenized request (TokenizerManager's
# batch path), and each copy's response reports the chunks.
MARKED_ATTR = "_mepic_chunks"


def check_hints(kv_hints, input_ids, marked_here: bool = False) -> None:
    """Refuse a `mepic.chunks` action that is not sealed for its own payload and these final ids.

    `marked_here`: the server made this request's hint from its markup, so a broken seal means its
    ids changed after the layout was made (a multimodal processor expanding media placeholders),
    which would put every span in the wrong place."""
    for action in kv_hints.actions if kv_hints is not None else []:
        if action.action_type == HINT_TYPE and not _is_ours(action, input_ids):
            if marked_here:
                raise IntakeError("the prompt's token ids changed after its chunks were laid out (the model's "
                                  "processor expands media placeholders): chunk markup cannot be used with this "
                                  "request's image, audio or video data")
            raise IntakeError(f"kv_hints action {HINT_TYPE!r} is made by the server, not sent by clients: "
                              f"mark chunks with <|chunk|>...<|/chunk|> in text, or ids -100 ... -101 in input_ids")


def check_prompt(text, input_ids, session_params=None, multimodal: bool = False) -> None:
    if isinstance(session_params, dict) and session_params.get("id"):
        return  # the session's history supplies the prompt
    if not multimodal and isinstance(text, str) and not text.strip():
        raise IntakeError("the prompt is empty or only whitespace" if not text else
                          "the prompt is only whitespace")
    # On the tokens the scheduler will see, whatever media fields say: a processor that added no
    # token left an empty extend all the same (media on a text-only model are refused before, request_limits.py).
    if input_ids is not None and len(input_ids) == 0:
        raise IntakeError("the prompt has no tokens (empty text, or chunk markers with nothing in them)")


def check(obj, input_ids) -> None:
    """Refuse what must not reach the scheduler; the message names the batch item, if any."""
    try:
        # A client's ids are the prompt: SGLang's request log (level >= 2) writes their decoding into
        # `text`, which must not decide what is refused.
        text = getattr(obj, "text", None) if getattr(obj, "input_ids", None) is None else None
        check_prompt(text, input_ids, getattr(obj, "session_params", None), multimodal=_multimodal(obj))
        check_hints(getattr(obj, "kv_hints", None), input_ids, marked_here=hasattr(obj, MARKED_ATTR))
    except IntakeError as e:
        raise IntakeError(labelled(obj, str(e))) from None


def _multimodal(obj) -> bool:
    return any(getattr(obj, f, None) for f in ("image_data", "video_data", "audio_data"))  # [] is no data


# SGLang splits a batch into per-item objects (`GenerateReqInput.__getitem__`); the item's
# index is kept beside it so that an error can say which item it is about.
ITEMS: SideTable = SideTable("batch item index")


def labelled(obj, message: str) -> str:
    item = ITEMS.get(obj)
    return message if item is None or message.startswith("batch item") else f"batch item {item}: {message}"


def relabel(obj, error: ValueError) -> ValueError:
    try:
        return type(error)(labelled(obj, str(error)))
    except TypeError:  # an error type that takes other arguments keeps its message
        return error
