"""A control request whose handler raises is answered as failed; the scheduler serves on.

SGLang's scheduler dispatches every request it receives through one `TypeBasedDispatcher`, and an
exception from a handler reached its event loop and ended the scheduler: the whole server went down
on one admin call (`/send_weights_to_remote_instance` naming a group never set up, `/resume_memory_
occupation` of a tag never released, an error in the mepic cache's own flush or figures), with every
running request. Here the exception is logged with its traceback and the request answered with the
reply its route waits for, saying that it failed and why (wire/control.py); the route answers a 400.

A handler that fails half way (a weight update that replaced some tensors) leaves what it did done,
as SGLang's own handlers do when they catch their errors and answer `success: false`: the reply and
the log say so, and the operator decides (retry, or restart); ending the scheduler decided for them
and dropped every request in flight. The reply must be the type the route waits for (another type,
or none, leaves the route's queue waiting for good): each control request's reply type is SGLang's
by name, `FooReqInput` / `FooReq` -> `FooReqOutput` (tests/hardening/test_control_requests.py checks every type
the scheduler dispatches). Requests no one waits on (`NO_REPLY`) are logged only; the data plane
(`DATA_PLANE`: generation, embedding, abort) keeps SGLang's own handling.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.managers import io_struct
from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.wire import control

if TYPE_CHECKING:
    from sglang.utils import TypeBasedDispatcher

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.utils.TypeBasedDispatcher.__call__"
HOOK_TYPE = HookType.AROUND

logger = logging.getLogger(__name__)
# Requests, not control: a failure there is SGLang's to handle (and a bug to fix, not to answer).
DATA_PLANE = (io_struct.TokenizedGenerateReqInput, io_struct.TokenizedEmbeddingReqInput,
              io_struct.BatchTokenizedGenerateReqInput, io_struct.BatchTokenizedEmbeddingReqInput, io_struct.AbortReq)
# Control requests whose sender waits for no reply (their handlers return None).
NO_REPLY = (io_struct.CloseSessionReqInput, io_struct.FreezeGCReq, io_struct.ShutdownReq,
            io_struct.PauseGenerationReqInput, io_struct.ContinueGenerationReqInput, io_struct.ConfigureLoggingReq)
# The scheduler's dispatcher is the one that routes both generate requests and cache flushes.
SCHEDULER_MARKS = (io_struct.TokenizedGenerateReqInput, io_struct.FlushCacheReqInput)

# dispatcher -> whether it is the scheduler's, decided once
_SCHEDULER: weakref.WeakKeyDictionary[TypeBasedDispatcher, bool] = weakref.WeakKeyDictionary()


def is_scheduler_dispatcher(dispatcher: TypeBasedDispatcher) -> bool:
    known = _SCHEDULER.get(dispatcher)
    if known is None:
        known = _SCHEDULER[dispatcher] = all(t in dispatcher._mapping for t in SCHEDULER_MARKS)
    return known


def reply_type(request_type: type) -> type | None:
    """The reply SGLang's tokenizer side waits for after a control request of this type."""
    name = request_type.__name__
    name = name[:-len("Input")] + "Output" if name.endswith("ReqInput") else name + "Output"
    return getattr(io_struct, name, None)


def hook(original: Callable[..., Any], dispatcher: TypeBasedDispatcher, request: object, *args: Any,
         **kwargs: Any) -> Any:
    if isinstance(request, DATA_PLANE) or not is_scheduler_dispatcher(dispatcher):
        return original(dispatcher, request, *args, **kwargs)
    try:
        return original(dispatcher, request, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - answered, logged with its traceback
        return answer_failed(request, e)


def answer_failed(request: object, error: Exception) -> Any:
    """The reply that tells the request's sender it failed (None where no one waits), the failure logged.
    Called in the handler's `except` block, so that the log has its traceback."""
    name = type(request).__name__
    if isinstance(request, NO_REPLY):
        logger.exception("%s failed (no reply is awaited); the scheduler serves on", name)
        return None
    replied = reply_type(type(request))
    if replied is None:
        raise error  # a control request of a kind this module does not know: SGLang's own behaviour
    logger.exception("%s failed, answered as failed; the scheduler serves on", name)
    return control.failed_reply(replied, request, f"{type(error).__name__}: {error}")
