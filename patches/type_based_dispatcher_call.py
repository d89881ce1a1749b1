"""A control request whose handler fails before it changes anything is answered as failed, not fatal.

SGLang's scheduler dispatches every request it receives through one `TypeBasedDispatcher`, and an
exception from a handler reaches the event loop and ends the scheduler: the whole server goes down
on one bad body. In SGLang 0.5.23, `POST /send_weights_to_remote_instance` naming a group that was
never set up raises KeyError before it does anything, and killed the server.

Catching every control request's exception would be worse than the crash: a handler that fails
half way (a weight update that replaced some tensors, a memory resume that dropped a tag) would
leave a server that serves on in a broken state, and a reply SGLang's tokenizer side cannot take
would leave that route's queue waiting forever (its fan-out communicator holds a lock per route).
So only the request types listed in `GUARDED` are caught: handlers that look the client's input
up before they change any state, and whose output type has `success` and `message`. Their failure
is logged with its traceback and answered with that output marked failed (the route answers 400).
Every other request keeps SGLang's own fail-stop behaviour. To add a type, read its handler: it
must raise, if at all, before its first side effect.
"""

import logging
import weakref

from sglang.srt.managers import io_struct
from sglang.srt.plugins.hook_registry import HookType

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.utils.TypeBasedDispatcher.__call__"
HOOK_TYPE = HookType.AROUND

logger = logging.getLogger(__name__)
# request type -> its output type. Scheduler.send_weights_to_remote_instance -> TpModelWorker ->
# WeightExporter.send_weights_to_remote_instance reads self._weights_send_group[group_name] first:
# a group never initialised raises KeyError with nothing changed.
GUARDED = {io_struct.SendWeightsToRemoteInstanceReqInput: io_struct.SendWeightsToRemoteInstanceReqOutput}
# The scheduler's dispatcher is the one that routes both generate requests and cache flushes.
SCHEDULER_MARKS = (io_struct.TokenizedGenerateReqInput, io_struct.FlushCacheReqInput)


_SCHEDULER = weakref.WeakKeyDictionary()  # dispatcher -> whether it is the scheduler's, decided once


def is_scheduler_dispatcher(dispatcher) -> bool:
    known = _SCHEDULER.get(dispatcher)
    if known is None:
        known = _SCHEDULER[dispatcher] = all(t in dispatcher._mapping for t in SCHEDULER_MARKS)
    return known


def hook(original, dispatcher, request, *args, **kwargs):
    reply_type = GUARDED.get(type(request))
    if reply_type is None or not is_scheduler_dispatcher(dispatcher):
        return original(dispatcher, request, *args, **kwargs)
    try:
        return original(dispatcher, request, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - raised before any state changed (see GUARDED)
        logger.exception("%s failed; answered as failed, the server serves on", type(request).__name__)
        return reply_type(success=False, message=f"{type(e).__name__}: {e}")
