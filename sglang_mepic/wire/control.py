"""A control request's failure, as the scheduler answers it and the tokenizer side reads it.

SGLang's scheduler answers each control request (`/flush_cache`, weight updates, LoRA, memory
release, internal state, ...) with a reply of the type the tokenizer side waits for. Most of those
types say a request failed (`success`, `updated`) and why (`message`, `error_message`, `error`),
and their routes answer a 400 with it. Some cannot say both (`ResumeMemoryOccupationReqOutput`,
`SlowDownReqOutput`, `GetInternalStateReqOutput` have neither field, `SetInternalStateReqOutput` no
reason): for those the reason rides in the reply's `rid`, which nothing reads on a control reply,
behind `FAILED`, and the tokenizer side raises it as a ValueError (sglang_mepic/patches/hardening/fan_out_communicator_call.py),
which the route answers with a 400.
"""

from typing import TypeVar

import msgspec

FAILED = "mepic-failed: "
FLAGS = ("success", "updated")  # the fields that say a reply's request failed
REASONS = ("message", "error_message", "error")  # the field that says why, where a reply has one

R = TypeVar("R", bound=msgspec.Struct)


def failed_reply(reply_type: type[R], request: object, reason: str) -> R:
    """A reply of `reply_type` that says its request failed, and why."""
    fields = reply_type.__struct_fields__
    values: dict[str, object] = {flag: False for flag in FLAGS if flag in fields}
    said = next((field for field in REASONS if field in fields), None)
    if said is not None:
        values[said] = reason
    if "session_id" in fields:  # the tokenizer side finds an open-session reply by its session
        values["session_id"] = getattr(request, "session_id", None)
    if said is None or not any(flag in fields for flag in FLAGS):  # the route could not tell the client why
        values["rid"] = FAILED + reason
    for field in msgspec.structs.fields(reply_type):  # what a failed request has none of (a state, a parameter)
        if field.required and field.name not in values:
            values[field.name] = None
    return reply_type(**values)


def failure(reply: object) -> str | None:
    """Why a reply's request failed, where only its `rid` can say so; None otherwise."""
    rid = getattr(reply, "rid", None)
    return rid[len(FAILED):] if isinstance(rid, str) and rid.startswith(FAILED) else None
