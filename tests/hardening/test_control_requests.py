"""One control request must not end the server: a handler that raises is answered with a failure (issue 68: The unit half: the whole description, and the tests on a server, are in
e2e/test_control_requests_server.py."""

import inspect
from unittest import mock

import pytest

from sglang.srt.managers import io_struct
from sglang.utils import TypeBasedDispatcher

from sglang_mepic.patches.hardening import dual_gemm_select_mode, type_based_dispatcher_call as guard
from sglang_mepic.wire import control


def raise_key_error(req):
    raise KeyError("g_1_0")


def scheduler_like(handler) -> TypeBasedDispatcher:
    return TypeBasedDispatcher([(io_struct.TokenizedGenerateReqInput, raise_key_error),
                                (io_struct.FlushCacheReqInput, lambda r: io_struct.FlushCacheReqOutput(success=True)),
                                (io_struct.SendWeightsToRemoteInstanceReqInput, handler)])


def call(dispatcher, request):
    # TypeBasedDispatcher's own call as the original, whether or not the plugin hooked it in this process.
    return guard.hook(inspect.unwrap(TypeBasedDispatcher.__call__), dispatcher, request)


def generate_request():
    return mock.MagicMock(spec=io_struct.TokenizedGenerateReqInput)  # an instance of it, as far as isinstance sees


def test_a_failing_control_request_is_answered_as_failed():
    request = io_struct.SendWeightsToRemoteInstanceReqInput(master_address="x", ports="1", group_name="g")
    reply = call(scheduler_like(raise_key_error), request)
    assert isinstance(reply, io_struct.SendWeightsToRemoteInstanceReqOutput)
    assert reply.success is False and reply.message == "KeyError: 'g_1_0'"
    ok = io_struct.SendWeightsToRemoteInstanceReqOutput(success=True, message="")
    assert call(scheduler_like(lambda r: ok), request) is ok


def test_generate_requests_and_other_dispatchers_keep_their_own_errors():
    dispatcher = scheduler_like(raise_key_error)
    with pytest.raises(KeyError, match="g_1_0"):
        call(dispatcher, generate_request())
    other = TypeBasedDispatcher([(io_struct.SendWeightsToRemoteInstanceReqInput, raise_key_error)])
    with pytest.raises(KeyError, match="g_1_0"):
        call(other, io_struct.SendWeightsToRemoteInstanceReqInput(master_address="x", ports="1"))


def scheduler_request_types() -> list[type]:
    """Every request type SGLang's scheduler dispatches, read from where it builds its dispatcher."""
    import re

    from sglang.srt.managers import scheduler

    source = inspect.getsource(scheduler)
    block = source[source.index("self._request_dispatcher = TypeBasedDispatcher("):]
    block = block[:block.index("\n        )\n")]
    return [getattr(io_struct, name) for name in re.findall(r"\(\s*(\w+),", block)]


def test_every_control_request_the_scheduler_dispatches_has_the_reply_its_sender_waits_for():
    """A reply of another type, or none, would leave the route's queue waiting for good."""
    from sglang.srt.managers.tokenizer_control_mixin import _COMMUNICATOR_SPECS

    types = scheduler_request_types()
    assert len(types) > 40 and io_struct.FlushCacheReqInput in types
    awaited = {spec[1] for spec in _COMMUNICATOR_SPECS}
    for request_type in types:
        if issubclass(request_type, guard.DATA_PLANE + guard.NO_REPLY):
            continue
        reply = guard.reply_type(request_type)
        assert reply is not None, request_type
        assert reply in awaited or reply in (io_struct.UpdateWeightFromDiskReqOutput, io_struct.OpenSessionReqOutput,
                                             io_struct.RpcReqOutput), (request_type, reply)


def instance(request_type):
    """A request of this type, its required fields None (the handler that gets it raises anyway)."""
    import dataclasses

    if dataclasses.is_dataclass(request_type):
        required = [f.name for f in dataclasses.fields(request_type)
                    if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    else:
        import msgspec

        required = [f.name for f in msgspec.structs.fields(request_type) if f.required]
    return request_type(**{name: None for name in required})


def raising_dispatcher(request_type, error=KeyError("tag")):
    def handler(request):
        raise error
    return TypeBasedDispatcher([*scheduler_like(raise_key_error)._mapping.items(), (request_type, handler)])


@pytest.mark.parametrize("request_type", [t for t in scheduler_request_types()
                                          if not issubclass(t, guard.DATA_PLANE + guard.NO_REPLY)],
                         ids=lambda t: t.__name__)
def test_a_control_request_that_raises_is_answered_as_failed_with_its_reason(request_type):
    """Each failed this way ended the scheduler (issue 68): now its reply says it failed, and why, in the
    fields its route reads, or in `rid` where the reply has none (the tokenizer side raises it)."""
    reply = call(raising_dispatcher(request_type), instance(request_type))
    assert type(reply) is guard.reply_type(request_type)
    fields = reply.__struct_fields__
    said = [getattr(reply, f) for f in ("message", "error_message", "error") if f in fields]
    flagged = [getattr(reply, f) for f in ("success", "updated") if f in fields]
    if said and flagged:
        assert flagged == [False] and said[0] == "KeyError: 'tag'" and control.failure(reply) is None
    else:
        assert control.failure(reply) == "KeyError: 'tag'" and not any(flagged)


def test_a_request_no_one_waits_on_is_logged_and_the_scheduler_serves_on(caplog):
    for request_type in guard.NO_REPLY:
        assert call(raising_dispatcher(request_type), instance(request_type)) is None
    assert "ContinueGenerationReqInput failed" in caplog.text and "Traceback" in caplog.text


def test_a_control_request_of_an_unknown_kind_keeps_sglangs_behaviour():
    class NewReqInput(io_struct.BaseReq):  # a type a later SGLang might add, with no reply by that name
        pass

    with pytest.raises(KeyError, match="tag"):
        call(raising_dispatcher(NewReqInput), NewReqInput())


def test_the_tokenizer_side_raises_a_failure_only_rid_carries():
    """The route awaits its replies through a FanOutCommunicator: a failure there is the route's 400."""
    import asyncio

    from sglang_mepic.patches.hardening import fan_out_communicator_call as side

    failed = control.failed_reply(io_struct.ResumeMemoryOccupationReqOutput, None, "KeyError: 'tag'")
    ok = io_struct.ResumeMemoryOccupationReqOutput()

    async def replies(values):
        async def original(communicator, obj):
            return values
        return await side.hook(original, None, object())

    assert asyncio.run(replies([ok])) == [ok]
    with pytest.raises(ValueError, match="KeyError: 'tag'") as raised:
        asyncio.run(replies([ok, failed, failed]))
    assert raised.value.status_code == 400 and str(raised.value) == "KeyError: 'tag'"
    flush = control.failed_reply(io_struct.FlushCacheReqOutput, None, "boom")  # its route reads success and message
    assert asyncio.run(replies([flush])) == [flush] and not flush.success and flush.message == "boom"


def test_the_dual_gemm_is_off_where_its_kernel_cannot_be_imported():
    def missing(self, *a):
        raise ImportError("No module named 'cutlass'")
    assert dual_gemm_select_mode.hook(missing, object(), None, 4096) is None
    assert dual_gemm_select_mode.hook(lambda self, *a: "mode", object(), None, 4096) == "mode"
