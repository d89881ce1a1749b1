"""The mode rules (sglang_mepic/modes.py), asked by the planner, admission, figures and the backend."""

import pytest
import torch

from sglang_mepic import config, env, modes
from sglang_mepic.modes import Planning


@pytest.mark.parametrize("name, how, keeps_from, private", [
    ("full", Planning.NONE, None, False), ("naive", Planning.SHARED, 0, False),
    ("mepic", Planning.SHARED, 1, False), ("epic-16", Planning.PRIVATE_PREFIX, 0, True),
    ("cacheblend-0.15", Planning.BLEND, 0, False)])
def test_each_mode_plans_and_keeps_as_documented(monkeypatch, name, how, keeps_from, private):
    mode = modes.parse_mode(name)
    monkeypatch.delenv(config.RECOMPUTE_BLOCKS.env, raising=False)
    assert modes.planning(mode) is how
    assert modes.canonical_from(mode, env.settings().recompute_blocks) == keeps_from
    assert modes.copies_private_prefix(mode) is private


def test_mepic_keeps_what_it_does_not_recompute(monkeypatch):
    monkeypatch.setenv(config.RECOMPUTE_BLOCKS.env, "2")
    assert modes.canonical_from(modes.parse_mode("mepic"), env.reload().recompute_blocks) == 2
    monkeypatch.setenv(config.RECOMPUTE_BLOCKS.env, "all")
    assert modes.canonical_from(modes.parse_mode("mepic"), env.reload().recompute_blocks) is None  # nothing kept
    assert modes.canonical_from(modes.parse_mode("epic-16"), 2) == 0  # the blocks are mepic's setting only


def test_epic_recomputes_whole_pages():
    assert [modes.epic_lead_pages(modes.parse_mode(f"epic-{k}"), 16) for k in (1, 16, 17, 32)] == [1, 1, 2, 2]


def test_cacheblend_checks_a_layer_the_model_has_and_rounds_its_share_up():
    mode = modes.parse_mode("cacheblend-0.15")
    assert modes.blend_check_layer(mode, 4) == 1 and modes.blend_check_layer(mode, 1) == 0
    assert [modes.blend_recomputed(mode, n) for n in (0, 1, 7, 20)] == [0, 1, 2, 3]


def test_cacheblend_selects_within_each_request_never_across():
    mode = modes.parse_mode("cacheblend-0.25")
    # Request 0's tokens all deviate more than request 1's: a batch-wide top-k would take only request 0's.
    deviation = torch.tensor([9.0, 8.0, 7.0, 6.0, 0.4, 0.3, 0.2, 0.1])
    request = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    keep = modes.blend_keep_stored(mode, deviation, request)
    assert keep.tolist() == [False, True, True, True, False, True, True, True]
