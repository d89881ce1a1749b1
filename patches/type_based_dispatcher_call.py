"""A control request whose handler raises is answered with a failure, not a dead server.

SGLang's scheduler dispatches every request it receives through one `TypeBasedDispatcher`. A
generate request's faults are handled on its own path, but an exception from a control request's
handler (the weight-update, profiling, memory, session and logging routes, ...) reaches the event
loop and ends the scheduler, so the whole server goes down on one bad body: for example
`POST /send_weights_to_remote_instance` naming a group that was never set up raises KeyError in
SGLang 0.5.23. In the scheduler's dispatcher only, such an exception is logged with its traceback
and the request is answered with its own output type marked failed (`success=False` and the
error as `message`), which the HTTP route turns into an error response; where the output type has
no such fields, nothing is sent and only that call waits, while the server serves on. Generate,
embedding and abort requests are not caught here: their errors keep SGLang's own handling.
"""

import logging

from sglang.srt.managers import io_struct
from sglang.srt.plugins.hook_registry import HookType

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.utils.TypeBasedDispatcher.__call__"
HOOK_TYPE = HookType.AROUND

logger = logging.getLogger(__name__)
# Handled on their own paths; an exception from them keeps SGLang's behaviour.
NOT_CONTROL = tuple(getattr(io_struct, name) for name in (
    "TokenizedGenerateReqInput", "TokenizedEmbeddingReqInput", "BatchTokenizedGenerateReqInput",
    "BatchTokenizedEmbeddingReqInput", "AbortReq") if hasattr(io_struct, name))
# The scheduler's dispatcher is the one that routes both generate requests and cache flushes.
SCHEDULER_MARKS = (io_struct.TokenizedGenerateReqInput, io_struct.FlushCacheReqInput)


def is_scheduler_dispatcher(dispatcher) -> bool:
    known = getattr(dispatcher, "_mepic_scheduler", None)
    if known is None:
        known = all(t in dispatcher._mapping for t in SCHEDULER_MARKS)
        dispatcher._mepic_scheduler = known
    return known


def failed_output(request, error: BaseException):
    """The request's own output type, marked failed, or None where it has no success/message fields."""
    name = type(request).__name__
    for candidate in (name.replace("ReqInput", "ReqOutput"), name.removesuffix("Req") + "ReqOutput",
                      name.removesuffix("Input") + "Output"):
        cls = getattr(io_struct, candidate, None)
        fields = getattr(cls, "__struct_fields__", ())
        if cls is not None and cls is not type(request) and "success" in fields and "message" in fields:
            try:
                return cls(success=False, message=f"{type(error).__name__}: {error}")
            except TypeError:  # other required fields: nothing sensible to send
                return None
    return None


def hook(original, dispatcher, request, *args, **kwargs):
    if isinstance(request, NOT_CONTROL) or not is_scheduler_dispatcher(dispatcher):
        return original(dispatcher, request, *args, **kwargs)
    try:
        return original(dispatcher, request, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - one request must not end the scheduler
        reply = failed_output(request, e)
        logger.exception("control request %s failed%s; the server serves on", type(request).__name__,
                         "" if reply is not None else " (no failure reply for its type: its caller waits)")
        return reply
