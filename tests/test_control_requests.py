"""One control request must not end the server: a handler that raises is answered with a failure."""

import inspect
from unittest import mock

import pytest
import requests

from sglang.srt.managers import io_struct
from sglang.utils import TypeBasedDispatcher

from sglang_mepic.patches import dual_gemm_select_mode, type_based_dispatcher_call as guard


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


def test_only_guarded_types_are_caught():
    # A handler that can fail half way (memory resume, weight updates) keeps SGLang's fail-stop: a reply
    # would leave a broken server serving on, or its route's queue waiting behind a reply it cannot take.
    resume = io_struct.ResumeMemoryOccupationReqInput(tags=None)
    dispatcher = TypeBasedDispatcher([*scheduler_like(raise_key_error)._mapping.items(),
                                      (io_struct.ResumeMemoryOccupationReqInput, raise_key_error)])
    with pytest.raises(KeyError, match="g_1_0"):
        call(dispatcher, resume)
    for request_type, reply_type in guard.GUARDED.items():
        assert {"success", "message"} <= set(reply_type.__struct_fields__), reply_type


def test_the_dual_gemm_is_off_where_its_kernel_cannot_be_imported():
    def missing(self, *a):
        raise ImportError("No module named 'cutlass'")
    assert dual_gemm_select_mode.hook(missing, object(), None, 4096) is None
    assert dual_gemm_select_mode.hook(lambda self, *a: "mode", object(), None, 4096) == "mode"


@pytest.mark.server
def test_the_server_serves_on_after_a_control_request_that_raised(tiny_server):
    # Killed the server before: SGLang 0.5.23's handler raises KeyError for a group never set up.
    r = requests.post(tiny_server.url + "/send_weights_to_remote_instance",
                      json={"master_address": "127.0.0.1", "ports": "1", "group_name": "never-set-up"}, timeout=60)
    assert 400 <= r.status_code < 600 and "KeyError" in r.text, (r.status_code, r.text)
    assert requests.get(tiny_server.url + "/health", timeout=30).status_code == 200
    out = requests.post(tiny_server.url + "/generate", timeout=120,
                        json={"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 2
