"""What the server refuses before a request reaches the scheduler (sglang_mepic/frontend/intake.py). The unit half: the whole description, and the tests on a server, are in
e2e/test_intake_server.py."""

from types import SimpleNamespace

import pytest

from sglang_mepic.frontend import intake, state


def action(payload):
    return SimpleNamespace(action_type="mepic.chunks", action_version="1", payload=payload)


def test_empty_prompts_are_refused():
    for text, ids in (("", None), ("  \n\t", None), (None, []), ("", [])):
        with pytest.raises(intake.IntakeError):
            intake.check_prompt(text, ids)
    intake.check_prompt("hi", None)
    intake.check_prompt(None, [5])
    intake.check_prompt(None, [], session_params={"id": "s"})  # the session's history supplies it
    intake.check_prompt("", None, multimodal=True)


IDS = list(range(100, 140))


def sealed(payload, ids=IDS):
    return {**payload, intake.MARK_KEY: intake.seal("1", payload, ids)}


def test_only_hints_the_server_sealed_pass():
    ours = sealed({"chunks": [[0, 32]], "pads": []})
    intake.check_hints(SimpleNamespace(actions=[action(ours)]), IDS)
    for forged in ({"chunks": [[0, 32]]}, {"chunks": [[16, 48]], "pads": [[48, 1]], "compile": True},
                   {"chunks": [[0, 32]], intake.MARK_KEY: "guess"}, "not a dict"):
        with pytest.raises(intake.IntakeError, match="made by the server"):
            intake.check_hints(SimpleNamespace(actions=[action(forged)]), IDS)
    other = SimpleNamespace(action_type="other.vendor", payload={})
    intake.check_hints(SimpleNamespace(actions=[other]), IDS)  # other hint types are SGLang's business


def test_a_seal_authorises_only_its_own_payload_and_ids():
    """A mark copied from a log is no bearer token: on another payload, or on the same payload over
    other ids (an attacker's prefix), it is refused."""
    ours = sealed({"chunks": [[0, 32]], "pads": [[32, 8]]})
    mark = ours[intake.MARK_KEY]
    poisoning = {"chunks": [[16, 48]], "pads": [[48, 1]], "compile": True, intake.MARK_KEY: mark}
    for payload, ids in ((poisoning, IDS), (ours, [7] * 16 + IDS), (ours, IDS[:-1]), (ours, None),
                         ({**ours, "compile": True}, IDS)):
        with pytest.raises(intake.IntakeError, match="made by the server"):
            intake.check_hints(SimpleNamespace(actions=[action(payload)]), ids)
    intake.check_hints(SimpleNamespace(actions=[action(dict(ours))]), list(IDS))


def test_an_empty_media_list_is_no_prompt():
    item = SimpleNamespace(text="", input_ids=[], kv_hints=None, image_data=[], audio_data=None)
    with pytest.raises(intake.IntakeError):
        intake.check(item, [])


def test_text_beside_ids_does_not_decide():
    """SGLang's request log (level >= 2) writes the decoding of a client's ids into `text`: ids that
    decode to whitespace are a prompt all the same."""
    item = SimpleNamespace(text="  ", input_ids=[220, 220], kv_hints=None)
    intake.check(item, [220, 220])
    with pytest.raises(intake.IntakeError):
        intake.check(SimpleNamespace(text="  ", input_ids=None, kv_hints=None), [220, 220])


class Item(SimpleNamespace):
    """A batch item as SGLang splits it off: weak-referenceable, as GenerateReqInput is."""


def test_errors_name_the_batch_item():
    item = Item(text="", input_ids=[], kv_hints=None)
    state.ITEMS.set(item, 2)
    with pytest.raises(intake.IntakeError, match="^batch item 2: "):
        intake.check(item, [])
