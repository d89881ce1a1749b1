"""The `mepic.chunks` codec (sglang_mepic.wire.hint): every shape round-trips, and anything
malformed is refused with a reason, never read half-way."""

from types import SimpleNamespace

import pytest

from sglang_mepic.wire.hint import HINT_TYPE, MARK_KEY, VERSION, Hint, HintError, decode, decode_laid_out, encode


def envelope(*actions):
    return SimpleNamespace(actions=[SimpleNamespace(**a) for a in actions])


SHAPES = [
    Hint(chunks=((2, 5), (5, 6))),                                        # not laid out
    Hint(chunks=((16, 48),), pads=((3, 13), (36, 12))),                   # laid out
    Hint(chunks=(), pads=((3, 13),)),                                     # laid out, no chunk left
]


@pytest.mark.parametrize("hint", SHAPES)
def test_every_shape_round_trips(hint):
    action = encode(hint)
    assert action["action_type"] == HINT_TYPE and action["action_version"] == VERSION
    assert decode(envelope(action)) == hint
    assert decode_laid_out(envelope(action)) == (hint if hint.pads is not None else None)


def test_no_hint_and_other_action_types():
    assert decode(None) is None and decode(envelope()) is None
    assert decode(envelope({"action_type": "other", "action_version": "9", "payload": []})) is None


def test_the_server_mark_is_not_part_of_the_hint():
    action = encode(SHAPES[1])
    action["payload"][MARK_KEY] = "mark"
    assert decode(envelope(action)) == SHAPES[1]


def payload(**fields):
    return {"action_type": HINT_TYPE, "action_version": VERSION, "payload": fields}


@pytest.mark.parametrize("action, message", [
    ({**payload(chunks=[]), "action_version": "1"}, "version '1' is not supported"),
    ({**payload(chunks=[]), "action_version": 1}, "version 1 is not supported"),
    ({"action_type": HINT_TYPE, "action_version": VERSION, "payload": [1]}, "not an object"),
    (payload(chunks=[], extra=1), "unknown payload fields"),
    (payload(chunks=[[0, 2.5]]), "not a pair of whole numbers"),
    (payload(chunks=[[0, True]]), "not a pair of whole numbers"),
    (payload(chunks=[[0, 2, 4]]), "not a pair of whole numbers"),
    (payload(chunks="0-2"), "not a list"),
    (payload(chunks=[[4, 8], [2, 6]]), "out of order"),
    (payload(chunks=[[3, 3]]), "out of order"),
    (payload(chunks=[[-1, 3]]), "out of order"),
    (payload(chunks=[], pads=[[2, 0]]), "pad run is empty"),
    (payload(chunks=[], pads=[[2, 4], [4, 1]]), "out of order"),
    # Version 1's compile shape is gone: no hint makes the scheduler store what it computes.
    (payload(chunks=[[0, 32]], pads=[], compile=True), r"unknown payload fields \['compile'\]"),
    (payload(chunks=[[0, 32]], pads=[], compiles=["a"]), r"unknown payload fields \['compiles'\]"),
])
def test_malformed_hints_are_refused(action, message):
    with pytest.raises(HintError, match=message):
        decode(envelope(action))


def test_one_hint_per_request_and_spans_within_its_slots():
    action = encode(SHAPES[1])
    with pytest.raises(HintError, match="2 actions"):
        decode(envelope(action, action))
    assert decode(envelope(action), num_slots=49) == SHAPES[1]
    with pytest.raises(HintError, match=r"chunk span \[16, 48\) is out of range for 40 slots"):
        decode(envelope(action), num_slots=40)
    with pytest.raises(HintError, match=r"pad run \[36, 48\) is out of range for 47 slots"):
        decode(envelope(encode(Hint(chunks=(), pads=((36, 12),)))), num_slots=47)


def test_a_hint_is_checked_when_made_too():
    with pytest.raises(HintError, match="out of order"):
        Hint(chunks=((5, 9), (0, 4)))
    with pytest.raises(HintError, match="version"):
        Hint(chunks=(), version="1")
