"""logit_bias is clamped into [-100, 100] at intake, and a NaN or a value that is no number is a 400
(sglang_mepic/hardening/scheduler_fields.py, `_bound_logit_bias`; the server test is
tests/hardening/e2e/test_logit_bias_server.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from sglang_mepic.hardening import scheduler_fields

VOCAB = 4096


def manager():
    return SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB), mm_processor=None)


def request(bias):
    return SimpleNamespace(top_logprobs_num=None, logprob_start_len=None, image_data=None, audio_data=None,
                           video_data=None, positional_embed_overrides=None,
                           sampling_params={"max_new_tokens": 8, "regex": "[a-z]+", "logit_bias": bias})


def bounded(bias):
    obj = request(bias)
    scheduler_fields.check(manager(), obj)
    return obj.sampling_params["logit_bias"]


def test_the_cause_a_float32_bias_of_1e308_beats_the_grammar_mask():
    """What SGLang does (SamplingBatchInfo.apply_logits_bias): the grammar's mask (-inf), then the bias row
    (float32). 1e308 is inf in float32, and -inf + inf is NaN, which argmax picks; a clamped bias leaves -inf."""
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    forbidden = torch.tensor([[False, False, True]])  # the grammar forbids token 2
    for value, winner in ((1e308, 2), (100.0, 1)):
        masked = logits.masked_fill(forbidden, float("-inf"))
        masked.add_(torch.tensor([[0.0, 0.0, value]], dtype=torch.float32))
        assert int(torch.argmax(masked, -1)) == winner
    assert torch.isnan(torch.tensor(float("-inf")) + torch.tensor(1e308, dtype=torch.float32))
    assert float(torch.tensor(-1e308, dtype=torch.float32)) == float("-inf")


@pytest.mark.parametrize("value,expected", [
    (1e308, 100), (-1e308, -100), (math.inf, 100), (-math.inf, -100), (100, 100), (-100, -100), (100.5, 100),
    (1e38, 100), (-1e9, -100), (10**400, 100), (-(10**400), -100), (0, 0), (-3.5, -3.5), (99.9, 99.9)])
def test_each_bias_is_clamped_into_openais_range(value, expected):
    assert bounded({"5": value}) == {"5": expected}


def test_the_clamp_keeps_every_key_and_leaves_the_clients_dict_as_sent():
    sent = {"5": 1e308, "619": -2.0, "05": -1e308}
    assert bounded(sent) == {"5": 100, "619": -2.0, "05": -100}
    assert sent == {"5": 1e308, "619": -2.0, "05": -1e308}
    within = {"5": 1.5}
    obj = request(within)
    scheduler_fields.check(manager(), obj)
    assert obj.sampling_params["logit_bias"] is within  # nothing to clamp: untouched


@pytest.mark.parametrize("bias,message", [
    ({"5": math.nan}, "logit_bias for token '5' is NaN"),
    ({"5": 1.0, "6": -math.nan}, "logit_bias for token '6' is NaN"),
    ({"5": "1"}, "found '1' for token '5'"),
    ({"5": True}, "found True for token '5'"),
    ({"5": None}, "found None for token '5'"),
    ({"5": [1]}, "found [1] for token '5'"),
    ([5], "logit_bias must map token ids to numbers, not list"),
    ("x", "logit_bias must map token ids to numbers, not str"),
])
def test_a_bias_that_is_no_number_is_a_400(bias, message):
    with pytest.raises(scheduler_fields.FieldError, match=message.replace("[", r"\[").replace("]", r"\]")):
        bounded(bias)
    assert issubclass(scheduler_fields.FieldError, ValueError)  # SGLang's HTTP layer answers it with a 400


def test_no_bias_is_no_change():
    for params in ({"max_new_tokens": 8}, {"logit_bias": None}, None, {}):
        obj = SimpleNamespace(**{**vars(request({})), "sampling_params": params})
        scheduler_fields.check(manager(), obj)
        assert obj.sampling_params == params
