"""A layout hint's mark is no bearer secret (intake.py): `--log-requests` writes no layout and no The unit half: the whole description, and the tests on a server, are in
e2e/test_hint_seal_server.py."""

import inspect
import json
import logging

import msgspec
import pytest
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.kv_hints import decode_kv_hints_envelope
from sglang.srt.utils.request_logger import RequestLogger

from sglang_mepic.frontend import intake, state
from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END
from sglang_mepic.frontend.ids_and_hint import with_hint
from sglang_mepic.patches.tokenizer import request_logger_compute_metadata as log_patch
from sglang_mepic.wire import hint
from sglang_mepic.wire.hint import MARK_KEY
from support.hint_seal import GREEDY


IDS = list(range(200, 264))
LAYOUT = hint.Hint(chunks=((16, 48),), pads=((48, 16),))


def made(ids=IDS, layout=LAYOUT) -> GenerateReqInput:
    """A request as the tokenizer side leaves it: final ids and the hint it sealed for them."""
    obj = GenerateReqInput(input_ids=list(ids), sampling_params=dict(GREEDY))
    obj.kv_hints = with_hint(None, "r", hint.encode(layout))
    state.mark(obj, state.MarkedRequest.made(layout.chunks, len(ids) - sum(n for _, n in layout.pads),
                                                      len(ids), obj.input_ids))
    intake.check(obj, obj.input_ids)  # validation seals it
    return obj


def replayed(obj: GenerateReqInput, ids=None, payload_changes=None) -> GenerateReqInput:
    """A client's request carrying `obj`'s hint as a log would show it (JSON), seal and all."""
    envelope = json.loads(msgspec.json.encode(obj.kv_hints))
    envelope["actions"][0]["payload"].update(payload_changes or {})
    return GenerateReqInput(input_ids=list(obj.input_ids if ids is None else ids),
                            kv_hints=decode_kv_hints_envelope(envelope))


def test_the_untouched_request_passes():
    obj = made()
    intake.check(obj, obj.input_ids)
    same = replayed(obj)  # an identical request: exactly what the server made, so harmless
    intake.check(same, same.input_ids)
    reordered = replayed(obj)  # the seal is over canonical JSON: key order is not part of it
    payload = reordered.kv_hints.actions[0].payload
    items = list(payload.items())
    payload.clear()
    payload.update(reversed(items))
    assert list(payload) != [k for k, _ in items]
    intake.check(reordered, reordered.input_ids)


@pytest.mark.parametrize("ids, changes", [
    ([7] * 16 + IDS[16:], None),                                        # an attacker's prefix
    (IDS + [1], None), (IDS[:-1], None), (list(reversed(IDS)), None),   # any other ids
    (None, {"chunks": [[0, 48]]}),                                      # another layout
    (None, {"pads": [[48, 15]]}),
    (None, {"pads": []}),
    (None, {"chunks": [[16, 32]]}),
    (None, {MARK_KEY: "0" * 64}),                                       # a mark-shaped guess
])
def test_a_seal_copied_onto_another_payload_or_other_ids_is_refused(ids, changes):
    forged = replayed(made(), ids, changes)
    with pytest.raises(intake.IntakeError, match="made by the server"):
        intake.check(forged, forged.input_ids)


def test_a_seal_made_for_other_ids_does_not_pass_on_these():
    """The server's own layout of a chunk after one prefix authorises no layout after another."""
    other = made([7] * 16 + IDS[16:])
    forged = replayed(other, ids=IDS)
    with pytest.raises(intake.IntakeError, match="made by the server"):
        intake.check(forged, forged.input_ids)


def test_ids_changed_after_the_server_laid_out_a_request_are_named():
    """A multimodal processor that expands media placeholders changes the ids after the layout (and its
    seal) was made: refused, saying so, instead of sent with every span in the wrong place."""
    obj = made()
    with pytest.raises(intake.IntakeError, match="changed after its chunks were laid out"):
        intake.check(obj, obj.input_ids[:20] + [9] * 8 + obj.input_ids[20:])


class _Captured(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_no_log_level_writes_a_layout_or_a_mark(level, fmt):
    def logged(hooked: bool) -> str:
        request_log = RequestLogger(True, level, fmt, None)
        # SGLang's own metadata, even when an earlier test in this process applied the plugin's hooks
        sglang_metadata = inspect.unwrap(RequestLogger._compute_metadata)(request_log)
        request_log.metadata = log_patch.hook(sglang_metadata, request_log) if hooked else sglang_metadata
        captured = _Captured()
        target = logging.getLogger(f"test_hint_seal.{level}.{fmt}.{hooked}")
        target.propagate = False
        target.setLevel(logging.INFO)
        target.addHandler(captured)
        request_log.targets = [target]
        obj = made()
        request_log.log_received_request(obj)
        request_log.log_finished_request(obj, {"text": "x", "meta_info": {"e2e_latency": 0.1}})
        assert len(captured.lines) == 2
        return "\n".join(captured.lines)

    mark = made().kv_hints.actions[0].payload[MARK_KEY]
    assert mark in logged(hooked=False), "SGLang's own request log writes kv_hints (this test would prove nothing)"
    log = logged(hooked=True)
    assert hint.HINT_TYPE not in log and mark not in log and "kv_hints" not in log
    assert "sampling_params" in log or level == 0  # the rest of the request is still logged


def test_the_request_log_does_not_decode_chunk_markers():
    """Level 2 and up decoded a request's ids for the log, and raised on the markers (a 500)."""
    from sglang_mepic.patches.tokenizer import request_logger_log_received_request as decode_patch

    class Tokenizer:
        def decode(self, ids, **kwargs):
            if any(t < 0 for t in ids):
                raise OverflowError("out of range integral type conversion attempted")
            return " ".join(map(str, ids))

    request_log = RequestLogger(True, 3, "text", None)
    request_log.targets = []
    marked = GenerateReqInput(input_ids=[5, BEG, 6, 7, END, 8])
    sglang_log_received_request = inspect.unwrap(RequestLogger.log_received_request)  # even if hooks are applied
    with pytest.raises(OverflowError):
        sglang_log_received_request(request_log, marked, Tokenizer())
    decode_patch.hook(sglang_log_received_request, request_log, marked, Tokenizer())
    assert marked.text is None
    plain = GenerateReqInput(input_ids=[5, 6])
    decode_patch.hook(sglang_log_received_request, request_log, plain, Tokenizer())
    assert plain.text == "5 6"  # decodable ids are still decoded, as SGLang does
